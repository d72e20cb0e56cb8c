//! The report of a real run as Chromium shows it (`results/tests/support/browser.rs`): a planted bug under
//! the faults that expose it, entered at its first anomaly. The fixture reports of the
//! `results` crate are judged the same way; this one is what a user gets.

use history::{EventType, Op};
use std::collections::BTreeSet;

/// `--bug accept-stale-result --nemesis reconnects`: the page loads without errors or
/// requests, the anomalies come in groups with the first open, every fault the stories tell
/// is told on a runner it hit, and the timeline's runner lanes are in runner order.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_runs_report_shows_faults_on_their_runners_grouped_anomalies_and_ordered_lanes() {
    if !crate::browser::available() {
        return;
    }
    let args = ["--bug", "accept-stale-result", "--nemesis", "reconnects", "--time-limit", "12"];
    let (finished, repeat) = super::run::caught(&args).await;
    let hit: BTreeSet<String> = finished
        .history()
        .iter()
        .filter(|event| event.f == Op::Reconnects && event.kind == EventType::Ok)
        .filter(|event| {
            event.value.as_ref().is_some_and(|value| value["phase"] == "start" && value["effective"] == true)
        })
        .filter_map(|event| event.runner.clone())
        .collect();
    assert!(!hit.is_empty(), "a reconnects fault took effect ({repeat})");
    let folder = finished.folder();
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("results.json")).unwrap()).unwrap();
    let told: Vec<String> = results["stories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|story| story["steps"].as_array().unwrap().iter())
        .filter_map(|step| step["text"].as_str())
        .filter(|text| text.starts_with("fault reconnects on "))
        .map(str::to_string)
        .collect();
    assert!(!told.is_empty(), "a story tells the reconnects that let the late result in ({repeat})");
    for text in &told {
        let runner = text["fault reconnects on ".len()..].split(' ').next().unwrap();
        assert!(hit.contains(runner), "{text:?}: on a runner the fault hit, {hit:?} ({repeat})");
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
    let lanes: Vec<usize> =
        ["r1", "r2", "r3"].iter().filter_map(|runner| dom.find(&format!(">runner {runner}</text>"))).collect();
    assert_eq!(lanes.len(), 3, "a lane per runner ({repeat})");
    assert!(lanes.windows(2).all(|pair| pair[0] < pair[1]), "the lanes in runner order ({repeat})");
}
