//! The report of a real run as Chromium shows it (`results/tests/support/browser.rs`): a planted bug under
//! the faults that expose it, entered at its first anomaly. The fixture reports of the
//! `results` crate are judged the same way; this one is what a user gets. A shrunk
//! scenario's report is judged the same way by the shrink test (`shrink.rs`).

use history::{EventType, Process};
use std::collections::BTreeSet;
use std::path::Path;

/// `--bug accept-stale-result --nemesis reconnects`: the page loads without errors or
/// requests, the anomalies come in groups with the first open, every fault the stories tell
/// is told on a runner it hit, the timeline's runner lanes are in runner order, and a
/// zoomed timeline draws the first group's stretch.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_runs_report_shows_faults_on_their_runners_grouped_anomalies_and_ordered_lanes() {
    if !crate::browser::available() {
        return;
    }
    let args = ["--bug", "accept-stale-result", "--nemesis", "reconnects", "--time-limit", "12"];
    let (finished, repeat) = super::run::caught(&args).await;
    let told = check_page(&finished.folder(), &finished.history(), &repeat);
    assert!(
        told.iter().any(|text| text.starts_with("fault reconnects on ")),
        "a story tells the reconnects ({repeat})"
    );
}

/// Checks the report of the run in `folder` (whose history is `history`) as a reader meets
/// it in Chromium, for a run with anomalies:
/// - the page loads without errors or requests;
/// - the first anomaly group is open and the others are one line each, and arriving at
///   the first anomaly opens its story;
/// - every fault a story tells (`fault K on rN …`) is one that took effect on that runner,
///   by the history;
/// - the runner lanes are in runner order;
/// - a zoomed timeline is drawn across the page with the lanes of the first group's stretch.
///
/// Returns the fault lines the stories tell.
pub fn check_page(folder: &Path, history: &[history::Event], repeat: &str) -> Vec<String> {
    let hit: BTreeSet<(String, String)> = history
        .iter()
        .filter(|event| event.process == Process::NEMESIS || event.process == Process::SCENARIO)
        .filter(|event| event.kind == EventType::Ok)
        .filter(|event| {
            event.value.as_ref().is_some_and(|value| value["phase"] == "start" && value["effective"] == true)
        })
        .filter_map(|event| Some((event.f.as_str().to_string(), event.runner.clone()?)))
        .collect();
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("results.json")).unwrap()).unwrap();
    let told: Vec<String> = results["stories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|story| story["steps"].as_array().unwrap().iter())
        .filter_map(|step| step["text"].as_str())
        .filter(|text| text.starts_with("fault ") && text.contains(" on r"))
        .map(str::to_string)
        .collect();
    for text in &told {
        let mut words = text["fault ".len()..].split(' ');
        let (kind, on, runner) = (words.next().unwrap(), words.next().unwrap(), words.next().unwrap());
        assert_eq!(on, "on", "{text:?}");
        let fault = (kind.to_string(), runner.to_string());
        assert!(hit.contains(&fault), "{text:?}: on a runner the fault hit, {hit:?} ({repeat})");
    }
    let scratch = tempfile::tempdir().unwrap();
    let page = folder.join("report.html");
    let opened = crate::browser::load(&page, "", scratch.path());
    assert_eq!(crate::browser::problems(&opened), Vec::<String>::new(), "{repeat}\n{}", opened.log);
    let dom = &opened.dom;
    assert!(
        dom.contains("<details class=\"anomaly-group\" id=\"g0\" open=\"\">"),
        "the first group is open ({repeat})"
    );
    assert!(!dom.contains("id=\"g1\" open"), "the others are one line each ({repeat})");
    let entered = crate::browser::load(&page, "a0", scratch.path());
    assert!(
        entered.dom.contains("<details class=\"story\" id=\"story-a0\" open=\"\">"),
        "arriving at the first anomaly opens its story ({repeat})"
    );
    let whole = &dom[dom.find("id=\"timeline-svg\"").unwrap()..];
    let whole = &whole[..whole.find("</svg>").unwrap()];
    let lanes: Vec<u32> =
        (whole.split(">runner r").skip(1)).filter_map(|rest| rest.split('<').next()?.parse().ok()).collect();
    assert!(!lanes.is_empty(), "runner lanes ({repeat})");
    assert!(lanes.windows(2).all(|pair| pair[0] < pair[1]), "the lanes in runner order: {lanes:?} ({repeat})");
    let zoom = crate::browser::marker_attr(dom, "data-zoom").unwrap_or_else(|| panic!("a zoomed timeline ({repeat})"));
    let (lanes, size) = zoom.split_once(':').unwrap();
    let width: u32 = size.split('x').next().unwrap().parse().unwrap();
    assert!(lanes.parse::<u32>().unwrap() >= 1, "the zoom has the stretch's lanes: {zoom} ({repeat})");
    assert!(width >= 1000, "the zoom is drawn across the page: {zoom} ({repeat})");
    told
}
