//! A history in a dialect fencelab does not know is never valid. In a valid run folder,
//! each word of the vocabulary the history holds — every operation, process, decision,
//! reason code, outcome and `recorded_as` — is renamed in turn, and `fencelab check` must
//! answer unknown (exit 2) naming the line, never valid.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use history::Op;
use serde_json::json;

use crate::run::{fault, faults_at_rate};

/// How long one `fencelab check` may take.
const CHECK_MAX: Duration = Duration::from_secs(60);

/// Every `"field":"word"` pair of the history that belongs to the typed vocabulary.
fn words(history: &str) -> BTreeSet<(&'static str, String)> {
    let mut words = BTreeSet::new();
    for line in history.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        for field in ["f", "process", "decision", "outcome", "type"] {
            if let Some(word) = event[field].as_str() {
                let word = word.split(':').next().unwrap().to_string();
                words.insert((field, if field == "process" && word == "runner" { "runner:".into() } else { word }));
            }
        }
        if event["decision"].is_string() {
            if let Some(reason) = event["reason"].as_str() {
                words.insert(("reason", reason.to_string()));
            }
        }
        if let Some(recorded) = event["value"]["recorded_as"].as_str() {
            words.insert(("recorded_as", recorded.to_string()));
        }
    }
    words
}

/// Copies the run folder's files into `to`, renaming `word` in `field` in the history.
fn renamed(from: &Path, to: &Path, field: &str, word: &str) {
    std::fs::create_dir_all(to).unwrap();
    for name in ["config.json", "schedule.json", "run.json", "jobs.json"] {
        std::fs::copy(from.join(name), to.join(name)).unwrap();
    }
    let history = std::fs::read_to_string(from.join("history.jsonl")).unwrap();
    let (old, new) = if field == "process" && word == "runner:" {
        ("\"process\":\"runner:".to_string(), "\"process\":\"runners:".to_string())
    } else {
        (format!("\"{field}\":\"{word}\""), format!("\"{field}\":\"{word}-v2\""))
    };
    let changed = history.replace(&old, &new);
    assert_ne!(changed, history, "{field} {word} is not in the history");
    std::fs::write(to.join("history.jsonl"), changed).unwrap();
}

async fn check(folder: &Path) -> (Option<i32>, String) {
    crate::fencelab_output(&["check".as_ref(), folder.as_os_str()], CHECK_MAX).await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_renamed_word_makes_check_unknown_never_valid() {
    let faults = vec![
        fault("reconnects", Some(0), 2_000, 2_400, json!({"how": "cut-links"})),
        fault("conflicting-results", Some(1), 5_000, 0, json!({"how": "conflict"})),
        fault("duplicate-results", Some(1), 5_500, 0, json!({"how": "replay"})),
    ];
    let finished = faults_at_rate(faults, "4").await;
    let folder = finished.folder();
    let (code, output) = check(&folder).await;
    assert_eq!(code, Some(0), "the original run checks valid\n{output}");
    let history = std::fs::read_to_string(folder.join("history.jsonl")).unwrap();
    let words = words(&history);
    let ops: BTreeSet<Op> =
        words.iter().filter(|(field, _)| *field == "f").map(|(_, w)| Op::parse(w).unwrap()).collect();
    for op in [Op::Submit, Op::Claim, Op::Heartbeat, Op::Capability, Op::Result, Op::Step, Op::Expire]
        .into_iter()
        .chain([Op::Reconcile, Op::Config, Op::Final, Op::Reconnects, Op::ConflictingResults])
    {
        assert!(ops.contains(&op), "the run holds no `{op}`, so renaming it is not tested: {ops:?}");
    }
    let scratch = tempfile::tempdir().unwrap();
    for (number, (field, word)) in words.iter().enumerate() {
        let copy = scratch.path().join(number.to_string());
        renamed(&folder, &copy, field, word);
        let (code, output) = check(&copy).await;
        assert_eq!(code, Some(2), "`{field}` `{word}` renamed: not unknown\n{output}");
        assert!(output.contains("history line "), "`{field}` `{word}` renamed: no line named\n{output}");
        assert_eq!(output.matches("history line ").count(), 1, "`{field}` `{word}`: the line is named once\n{output}");
        let results = std::fs::read_to_string(copy.join("results.json")).unwrap();
        assert!(results.contains("\"unknown\""), "`{field}` `{word}`: results.json is not unknown");
    }
}
