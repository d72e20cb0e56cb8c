//! A 30-minute, 100k-event history: the report stays bounded in SVG elements and bytes.

use crate::fixture;
use crate::html::{assert_offline, count_elements, timeline_svg};
use results::{report_html, results_json};

#[test]
fn hundred_thousand_events_render_bounded() {
    let events = fixture::large(100_000);
    assert!(events.len() >= 100_000);
    let run = fixture::large_run(&events, 150);
    let html = report_html(&run, &events);
    let svg = timeline_svg(&html);
    let elements = count_elements(svg);
    assert!(elements < 20_000, "{elements} SVG elements");
    assert!(html.len() < 4 * 1024 * 1024, "{} bytes", html.len());
    assert!(html.contains("of 5000 job lanes (all 150 jobs with anomalies first"), "caption says what was sampled");
    let anomalies = run.checkers.iter().flat_map(|c| match &c.verdict {
        checkers::Verdict::Invalid { anomalies } => anomalies.clone(),
        _ => vec![],
    });
    for a in anomalies {
        let job = a.job.unwrap();
        assert!(svg.contains(&format!(">job {job}</text>")), "anomalous job {job} has a lane");
        let i = a.events[0];
        assert!(html.contains(&format!("<tr id=\"e{i}\" class=\"proof\">")), "proof event {i} in the table");
    }
    assert!(html.matches("<tr id=\"e").count() <= 3000);
    assert_offline(&html);
}

#[test]
fn many_anomalies_stay_bounded_too() {
    let events = fixture::large(100_000);
    let run = fixture::large_run(&events, 2000);
    let html = report_html(&run, &events);
    let elements = count_elements(timeline_svg(&html));
    assert!(elements < 20_000, "{elements} SVG elements");
    assert!(html.len() < 4 * 1024 * 1024, "{} bytes", html.len());
    let doc: serde_json::Value = serde_json::from_str(&results_json(&run, &events)).unwrap();
    assert_eq!(doc["anomaly_count"], 2000);
    assert_eq!(doc["counts"]["events"], events.len());
}
