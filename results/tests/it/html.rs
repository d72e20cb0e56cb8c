//! report.html: anchors, legend, command, timeline marks, no network URLs, bounded SVG.

use crate::fixture;
use results::report_html;

fn rendered() -> (Vec<history::Event>, String) {
    let events = fixture::history();
    let html = report_html(&fixture::run(&events), &events);
    (events, html)
}

/// The timeline's `<svg>…</svg>`.
pub fn timeline_svg(html: &str) -> &str {
    let start = html.find("<svg id=\"timeline-svg\"").expect("timeline svg");
    let end = start + html[start..].find("</svg>").expect("svg closed") + "</svg>".len();
    &html[start..end]
}

/// Number of elements (start or empty-element tags) in a piece of markup.
pub fn count_elements(markup: &str) -> usize {
    markup.as_bytes().windows(2).filter(|w| w[0] == b'<' && w[1].is_ascii_alphabetic()).count()
}

/// Every value of attribute `name` (double-quoted, as the renderer writes them).
fn attribute_values<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let pattern = format!(" {name}=\"");
    html.match_indices(&pattern)
        .map(|(i, _)| {
            let rest = &html[i + pattern.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect()
}

/// Asserts the page cannot make a network request: no scheme-relative or absolute URL
/// anywhere, and every `href`/`src` is a fragment or `data:`.
pub fn assert_offline(html: &str) {
    for needle in ["://", "//", "<img", "<iframe", "<link rel=\"stylesheet", "@import", "url("] {
        assert!(!html.contains(needle), "report contains {needle:?}");
    }
    for attr in ["href", "src", "xlink:href", "action"] {
        for value in attribute_values(html, attr) {
            assert!(value.starts_with('#') || value.starts_with("data:"), "{attr}={value:?} is not local");
        }
    }
}

#[test]
fn header_shows_verdict_seed_and_copyable_command() {
    let (_, html) = rendered();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<span class=\"verdict v-invalid\" id=\"overall\">INVALID</span>"));
    assert!(html.contains("<dd id=\"seed\">42</dd>"));
    let command = "fencelab run --seed 42 --test &#39;stale &amp; &lt;late&gt;&#39; --config &quot;lab.toml&quot;";
    assert!(html.contains(&format!("<code id=\"command\">{command}</code>")), "command not found escaped");
    assert!(html.contains("<button type=\"button\" id=\"copy\">"));
}

#[test]
fn summary_lists_every_checker() {
    let (_, html) = rendered();
    assert!(html.contains(
        "<td>stale-write</td><td><span class=\"verdict v-invalid\">invalid</span></td><td><a href=\"#a0\">1</a></td>"
    ));
    assert!(html.contains("<td>single-completion</td><td><span class=\"verdict v-valid\">valid</span></td><td>0</td>"));
    assert!(html.contains("<span class=\"verdict v-unknown\">unknown</span></td><td><span class=\"reason\">history incomplete: runner r3&#39;s log torn at line 7 &lt;eof&gt;</span>"));
}

#[test]
fn anomaly_links_to_its_events_which_are_in_the_table() {
    let (events, html) = rendered();
    assert!(html.contains("<li class=\"anomaly\" id=\"a0\" value=\"1\">"));
    assert!(html.contains(
        "step of j1-a1 &lt;fence 1&gt; applied &amp; &quot;accepted&quot; after &#39;j1-a2&#39; took fence 3"
    ));
    for i in fixture::anomaly(&events).events {
        assert!(html.contains(&format!("<a class=\"proof\" href=\"#e{i}\">#{i}</a>")), "link to event {i}");
        assert!(html.contains(&format!("<tr id=\"e{i}\" class=\"proof\">")), "proof row {i}");
    }
    for e in &events {
        assert!(html.contains(&format!("<tr id=\"e{}\"", e.index)), "row for event {}", e.index);
    }
    assert!(timeline_svg(&html).contains("<a href=\"#a0\"><rect class=\"anomaly-mark\""));
}

#[test]
fn legend_names_every_mark() {
    let (_, html) = rendered();
    assert!(html.contains("<ul class=\"legend\" id=\"legend\">"));
    for class in ["d-accepted", "d-rejected", "d-duplicate", "d-conflict"] {
        assert!(html.contains(&format!("<span class=\"sw dot {class}\"></span>")), "legend {class}");
    }
    for text in ["result accepted", "result rejected", "result duplicate", "result conflict", "target step applied"] {
        assert!(html.contains(text), "legend text {text}");
    }
    for text in ["target step refused", "fault window", "lease", "heartbeat", "expire", "reconcile", "anomaly"] {
        assert!(html.contains(text), "legend text {text}");
    }
}

#[test]
fn timeline_draws_lanes_attempts_and_marks() {
    let (_, html) = rendered();
    let svg = timeline_svg(&html);
    for lane in ["runner r1", "runner r2", "job j1", "job j2", "job j3", "results, all jobs"] {
        assert!(svg.contains(&format!(">{lane}</text>")), "lane {lane}");
    }
    assert!(svg.contains("<g class=\"lane anomalous\" id=\"lane-j0\""), "j1's lane is highlighted");
    for fence in [">f1</text>", ">f2</text>", ">f3</text>", ">j1 f1</text>"] {
        assert!(svg.contains(fence), "attempt label {fence}");
    }
    for class in ["result d-accepted", "result d-rejected", "result d-duplicate", "result d-conflict"] {
        assert!(svg.contains(&format!("<circle class=\"{class}\"")), "result {class}");
    }
    for mark in [
        "<rect class=\"step applied\"",
        "<rect class=\"step refused\"",
        "<path class=\"expire\"",
        "<path class=\"reconcile\"",
        "<rect class=\"lease\"",
        "<line class=\"hb\"",
        "<line class=\"hb refused\"",
        "<rect class=\"fault\"",
        ">delayed-heartbeats</text>",
    ] {
        assert!(svg.contains(mark), "mark {mark}");
    }
    // On every lane the fence labels come after the heartbeat ticks, so none is drawn over.
    for lane in svg.split("<g class=\"lane").skip(1) {
        let (label, tick) = (lane.find("<text class=\"fence\""), lane.rfind("<line class=\"hb"));
        if let (Some(label), Some(tick)) = (label, tick) {
            assert!(label > tick, "a fence label under a heartbeat tick: {lane}");
        }
    }
}

#[test]
fn faults_come_from_nemesis_events_without_a_schedule() {
    let events = fixture::history();
    let mut run = fixture::run(&events);
    run.schedule = serde_json::json!([]);
    let html = report_html(&run, &events);
    // 1201 ms (its start took effect) to 4001 ms (healed) of 6000 ms, plot from x=190 over
    // 1000 px.
    let svg = timeline_svg(&html);
    assert!(svg.contains("<rect class=\"fault\" x=\"390.2\" y=\"22\" width=\"466.7\""), "{svg}");
}

#[test]
fn declared_svg_element_count_is_the_real_one() {
    let (_, html) = rendered();
    let declared: usize =
        html.split("data-svg-elements=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
    assert_eq!(declared, count_elements(timeline_svg(&html)));
}

#[test]
fn no_network_urls_even_when_config_has_some() {
    let (_, html) = rendered();
    assert_offline(&html);
    assert!(html.contains("http:&#47;&#47;127.0.0.1:8080"), "the config's URL is shown as text");
    assert!(html.contains("default-src 'none'"), "a CSP forbids any fetch");
}

#[test]
fn deterministic() {
    let (events, html) = rendered();
    assert_eq!(html, report_html(&fixture::run(&events), &events));
}

#[test]
fn valid_run_without_events_renders() {
    let mut run = fixture::run_with(vec![]);
    run.checkers.retain(|c| matches!(c.verdict, checkers::Verdict::Valid));
    run.schedule = serde_json::Value::Null;
    let html = report_html(&run, &[]);
    assert!(html.contains("id=\"overall\">VALID</span>"));
    assert!(html.contains("<h2>Anomalies (0)</h2>\n<p>None.</p>"));
    assert!(timeline_svg(&html).contains("results, all jobs"));
    assert_offline(&html);
}

#[test]
fn each_anomaly_opens_to_its_story() {
    let (_, html) = rendered();
    let li = &html[html.find("<li class=\"anomaly\" id=\"a0\" value=\"1\">").expect("anomaly a0")..];
    let li = &li[..li.find("</details></li>").unwrap()];
    assert!(li.contains("<details class=\"story\" id=\"story-a0\"><summary>the story</summary>"), "{li}");
    assert_eq!(li.matches("<li class=\"proof\"").count(), 3, "the three proving events");
    assert!(li.contains("refused (expired), kept as a late observation — the rule broken: No step of a superseded attempt is applied. <a href=\"#e26\">#26</a>"), "{li}");
    assert!(li.contains("<svg class=\"mini\" id=\"mini-a0\""));
    assert!(html.contains("<a href=\"#a0\"><rect class=\"anomaly-mark\""), "the timeline links the anomaly");
    assert!(html.contains("function openStory()"), "arriving at an anomaly opens its story");
}

/// Anomalies are grouped by the job they tell of (else the attempt, the key, the kind): the
/// first group open, the rest one line each, numbered over all checkers as before; the same
/// groups, with their counts, are in results.json.
#[test]
fn anomalies_are_grouped_by_the_job_they_tell_of() {
    let events = fixture::history();
    let first = fixture::anomaly(&events);
    let same_job = checkers::Anomaly { kind: "late-result-acknowledged".into(), ..first.clone() };
    let other_job = checkers::Anomaly { job: Some("j2".into()), attempts: vec!["j2-a1".into()], ..first.clone() };
    let no_job =
        checkers::Anomaly { job: None, attempts: vec![], key: None, kind: "split-clock".into(), ..first.clone() };
    let run = fixture::run_with(vec![first, other_job, same_job, no_job]);
    let html = report_html(&run, &events);
    assert!(html.contains("<h2>Anomalies (4, in 3 groups)</h2>"), "heading");
    let groups: Vec<&str> = html.split("<details class=\"anomaly-group\"").skip(1).collect();
    assert_eq!(groups.len(), 3, "three groups");
    assert!(
        groups[0].starts_with(" id=\"g0\" open><summary><strong>job j1</strong>: 2 anomalies"),
        "{}",
        &groups[0][..200]
    );
    let kinds = "(stale-write&#47;stale-step-applied, stale-write&#47;late-result-acknowledged)";
    assert!(groups[0].contains(kinds), "{}", &groups[0][..300]);
    assert!(groups[0].contains("id=\"a0\"") && groups[0].contains("id=\"a2\""), "j1's two, a0 and a2");
    assert!(groups[1].starts_with(" id=\"g1\"><summary><strong>job j2</strong>: 1 anomaly"), "closed");
    assert!(groups[2].contains("<strong>stale-write&#47;split-clock</strong>"), "no job: grouped by kind");
    let doc: serde_json::Value = serde_json::from_str(&results::results_json(&run, &events)).unwrap();
    let counted: Vec<(String, u64)> = doc["anomaly_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|group| (group["group"].as_str().unwrap().to_string(), group["count"].as_u64().unwrap()))
        .collect();
    let expected = [("job j1", 2), ("job j2", 1), ("stale-write/split-clock", 1)];
    assert_eq!(counted, expected.map(|(group, count)| (group.to_string(), count)));
    assert_eq!(doc["anomaly_groups"][0]["anomalies"], serde_json::json!([0, 2]));
}

/// The timeline's runner lanes come in runner order, not in order of first appearance, and
/// the labels of overlapping fault windows go in rows of their own.
#[test]
fn timeline_lanes_are_in_runner_order_and_fault_labels_do_not_overlap() {
    // r1 claims first; renamed r9, it appears first and must come after r2.
    let mut events: Vec<history::Event> =
        fixture::history().into_iter().filter(|event| event.process != history::Process::NEMESIS).collect();
    for event in &mut events {
        if event.runner.as_deref() == Some("r1") {
            event.runner = Some("r9".into());
        }
    }
    let mut run = fixture::run(&events);
    run.schedule = serde_json::json!([
        {"at_ms": 1200, "duration_ms": 2800, "kind": "delayed-heartbeats", "runner": "r9"},
        {"at_ms": 1300, "duration_ms": 2000, "kind": "disconnect-during-mutation", "runner": "r2"},
    ]);
    let svg = timeline_svg(&report_html(&run, &events)).to_string();
    let (r2, r9) = (svg.find(">runner r2<").expect("r2's lane"), svg.find(">runner r9<").expect("r9's lane"));
    assert!(r2 < r9, "r2's lane above r9's");
    let label_y: Vec<&str> = svg
        .split("<text class=\"fault-label\"")
        .skip(1)
        .map(|label| label.split("y=\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(label_y.len(), 2, "both windows labelled: {svg}");
    assert_ne!(label_y[0], label_y[1], "overlapping windows' labels in two rows");
}

/// The zoomed timeline's `<svg>…</svg>`, if the page has one.
fn zoom_svg(html: &str) -> Option<&str> {
    let start = html.find("<svg id=\"timeline-zoom-svg\"")?;
    let end = start + html[start..].find("</svg>").expect("svg closed") + "</svg>".len();
    Some(&html[start..end])
}

/// The timeline zooms to the first anomaly group's events (4.1 s to 4.5 s here, with a
/// margin of at least 500 ms): only the lanes with something in that stretch (j2's attempt
/// ended at 2.6 s, j3 was never claimed), axis labels in seconds with decimals, and the
/// stretch outlined on the whole run's timeline, linking to the zoom.
#[test]
fn the_timeline_zooms_to_the_first_anomaly_groups_events() {
    let (_, html) = rendered();
    let zoom = zoom_svg(&html).expect("a zoomed timeline");
    assert!(zoom.contains("data-start-ns=\"3600000000\" data-end-ns=\"5000000000\""), "{}", &zoom[..300]);
    assert!(html.contains("<h3 id=\"timeline-zoom\">From 3.600 s to 5.000 s: the first anomaly group (job j1)</h3>"));
    assert!(
        zoom.contains(">job j1</text>") && zoom.contains(">runner r1</text>") && zoom.contains(">runner r2</text>")
    );
    assert!(!zoom.contains(">job j2</text>") && !zoom.contains(">job j3</text>"), "lanes with nothing in the stretch");
    assert!(zoom.contains(">3.6 s</text>") && zoom.contains(">4.8 s</text>"), "ticks in seconds: {zoom}");
    assert_eq!(zoom.matches("class=\"anomaly-mark\"").count(), 3, "the anomaly's three events");
    let whole = timeline_svg(&html);
    assert!(whole.contains("<a href=\"#timeline-zoom\"><rect class=\"zoom-window\""), "the stretch outlined");
    assert!(whole.contains(">job j3</text>"), "the whole run keeps every lane");
}

/// An anomaly whose evidence spans most of the run is zoomed to the stretch around its last
/// event (here the accepted result at 5.0 s, of a 6-s run: 4.4 to 5.3 s with a 500-ms
/// margin); the harness's final-state records never widen a stretch; a run without
/// anomalies has no zoom unless it is a scenario, which zooms to its steps and the faults
/// they started (not the wait for its jobs to settle).
#[test]
fn a_zoom_only_where_it_shows_more_than_the_whole_run() {
    let events = fixture::history();
    let claim = fixture::index_of(&events, |e| e.f == history::Op::Claim);
    let accepted =
        fixture::index_of(&events, |e| e.f == history::Op::Result && e.decision == Some(history::Decision::Accepted));
    let mut spread = fixture::anomaly(&events);
    spread.events = vec![claim, accepted];
    let html = report_html(&fixture::run_with(vec![spread]), &events);
    let zoom = zoom_svg(&html).expect("a zoom around the last event");
    assert!(zoom.contains("data-start-ns=\"3900000000\" data-end-ns=\"5800000000\""), "{}", &zoom[..300]);
    let mut at_the_end = fixture::anomaly(&events);
    let expire = fixture::index_of(&events, |e| e.f == history::Op::Expire);
    at_the_end.events = vec![expire, events.last().unwrap().index];
    let html = report_html(&fixture::run_with(vec![at_the_end]), &events);
    let zoom = zoom_svg(&html).expect("a zoom on the expiry");
    assert!(zoom.contains("data-start-ns=\"3600000000\" data-end-ns=\"4600000000\""), "{}", &zoom[..300]);
    assert!(zoom_svg(&report_html(&fixture::run_with(vec![]), &events)).is_none(), "no anomaly, no scenario");
    let mut scenario: Vec<history::Event> =
        fixture::history().into_iter().filter(|e| e.process != history::Process::NEMESIS).collect();
    let step = (history::Process::SCENARIO, history::EventType::Ok, history::Op::Step);
    scenario.push(history::Event::new(1_000_000_000, step.0, step.1, step.2));
    scenario.sort_by_key(|e| e.time_ns);
    fixture::number(&mut scenario);
    let mut run = fixture::run_with(vec![]);
    run.schedule = serde_json::json!([]);
    let html = report_html(&run, &scenario);
    let zoom = zoom_svg(&html).expect("a scenario's incident zoomed");
    assert!(zoom.contains("data-start-ns=\"0\" data-end-ns=\"1500000000\""), "{}", &zoom[..300]);
    assert!(html.contains("the scenario&#39;s steps and the faults they started"), "why");
}
