//! Suites end to end: a small suite run whole, and the same suite as two shards merged,
//! give the same pass/fail table (the whole one with trends over two stored nights); a
//! replay of a run that caught a planted bug catches it again.

use serde_json::json;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

const WAIT_MAX: Duration = Duration::from_secs(600);

/// The one fault of the invalid entry: a conflicting result for runner 1's committed job.
/// The conflict needs a result its runner already committed: it looks for one for at most
/// two leases, and tries again a lease later while it fits the time limit. The planted bug's
/// runs last 15 s so that all three tries fit: with 6 s, only the first did, and on a loaded
/// machine (a soak pass) the runner had committed nothing by then, the bug went unexposed
/// and the whole suite's table differed from the shards'.
const CONFLICT_AT_3S: &str = r#"[{"at_ms": 3000, "duration_ms": 0, "kind": "conflicting-results", "runner": 0, "variant": {"how": "conflict"}}]"#;

async fn fencelab(args: &[String]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let output = tokio::time::timeout(WAIT_MAX, command.output()).await.expect("fencelab ends in time").unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), said)
}

fn write_suite(dir: &Path) -> String {
    let schedule = dir.join("conflict.json");
    std::fs::write(&schedule, CONFLICT_AT_3S).unwrap();
    let suite = format!(
        r#"name = "small"
time_budget_s = 900
parallel = 3
[[run]]
name = "correct"
nemesis = "none"
seeds = [1, 2]
time_limit = 4
[[run]]
name = "overwrite"
system = "{}"
variants = ["overwrite-terminal-result"]
nemesis = "conflicting-results"
seeds = [1]
time_limit = 15
expect = "invalid"
args = ["--runners", "1", "--schedule", "{}"]
[[run]]
name = "overwrite-expected-valid"
bugs = ["overwrite-terminal-result"]
nemesis = "conflicting-results"
seeds = [1]
time_limit = 15
args = ["--runners", "1", "--schedule", "{}"]
"#,
        super::system::lab_file().display(),
        schedule.display(),
        schedule.display()
    );
    let path = dir.join("small.toml");
    std::fs::write(&path, suite).unwrap();
    path.display().to_string()
}

fn table(folder: &Path) -> Vec<(usize, String, u64, bool)> {
    campaign::suite::read_result(folder).unwrap().table()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_shards_merged_give_the_same_table_as_the_whole_suite() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_suite(dir.path());
    let out = |name: &str| dir.path().join(name).display().to_string();
    // Two earlier nights for the whole suite's trends: `correct` seed 1 failed on the first.
    for (night, passed) in [("2026-12-01", false), ("2026-12-02", true)] {
        let entry = campaign::suite::Entry {
            index: 0,
            name: "correct".into(),
            seed: 1,
            expect: results::Overall::Valid,
            verdict: results::RunVerdict::Checked(if passed {
                results::Overall::Valid
            } else {
                results::Overall::Invalid
            }),
            passed,
            command: "fencelab run".into(),
            report: None,
            bugs: vec![],
            checkers: vec![],
            duration_ms: None,
        };
        let result = campaign::suite::SuiteResult { suite: "small".into(), entries: vec![entry] };
        campaign::suite::write(&result, &dir.path().join("nights").join(night)).unwrap();
    }
    let whole_args = ["suite".into(), suite.clone(), "--out".into(), out("whole"), "--history".into(), out("nights")];
    let first_args = ["suite".into(), suite.clone(), "--shard".into(), "1/2".into(), "--out".into(), out("s1")];
    let second_args = ["suite".into(), suite.clone(), "--shard".into(), "2/2".into(), "--out".into(), out("s2")];
    let (whole, first, second) = tokio::join!(fencelab(&whole_args), fencelab(&first_args), fencelab(&second_args));
    assert_eq!(whole.0, Some(1), "one entry expects valid from a planted bug: {}", whole.1);
    assert_eq!((first.0.is_some(), second.0.is_some()), (true, true));
    let merged = fencelab(&["merge".into(), "--out".into(), out("merged"), out("s1"), out("s2")]).await;
    assert_eq!(merged.0, Some(1), "{}", merged.1);
    let expected = vec![
        (0, "correct".to_string(), 1, true),
        (1, "correct".to_string(), 2, true),
        (2, "overwrite".to_string(), 1, true),
        (3, "overwrite-expected-valid".to_string(), 1, false),
    ];
    assert_eq!(table(&dir.path().join("whole")), expected, "{}", whole.1);
    assert_eq!(table(&dir.path().join("merged")), expected, "{}", merged.1);
    let index = std::fs::read_to_string(dir.path().join("merged/index.html")).unwrap();
    let link = index.split("href=\"").nth(1).and_then(|rest| rest.split('"').next()).expect("a report link");
    let link = link.replace("&#47;", "/");
    assert!(dir.path().join("merged").join(&link).exists(), "the merged index links a report that exists: {link}");
    let whole_index = std::fs::read_to_string(dir.path().join("whole/index.html")).unwrap();
    assert!(whole_index.contains("Trends over the last 3 nights"), "{whole_index}");
    assert!(
        whole_index.contains(
            "<tr><td>correct s1</td><td class=\"fail\">✗</td><td class=\"pass\">✓</td><td class=\"pass\">✓</td>"
        ),
        "{whole_index}"
    );
    let caught = "<tr><td>overwrite-terminal-result</td><td class=\"none\">—</td><td class=\"none\">—</td>\
                  <td class=\"pass\">2/2</td></tr>";
    assert!(whole_index.contains(caught), "both runs planting it caught it:\n{whole_index}");
    let entries = campaign::suite::read_result(&dir.path().join("whole")).unwrap().entries;
    assert_eq!(entries[2].bugs, ["overwrite-terminal-result"]);
    assert!(entries[2].checkers.contains(&"terminal-stability".to_string()), "{:?}", entries[2].checkers);
    let junit = std::fs::read_to_string(dir.path().join("merged/junit.xml")).unwrap();
    assert!(junit.contains("tests=\"4\" failures=\"1\""), "{junit}");
    if let Some(cases) = read_by_junitparser(&dir.path().join("merged/junit.xml")) {
        assert_eq!(cases.len(), 4, "junitparser reads the four runs: {cases:#?}");
        let failed: Vec<&serde_json::Value> =
            cases.iter().filter(|case| case["results"] == json!(["Failure"])).collect();
        assert_eq!(failed.len(), 1, "one failure: {cases:#?}");
        for case in &cases {
            assert!(case["classname"].as_str().unwrap().starts_with("fencelab.suite.small."), "{case}");
            assert!(case["time"].as_f64().unwrap() > 0.0, "a run takes time: {case}");
            for property in ["seed", "command", "report"] {
                assert!(case["properties"][property].is_string(), "{property} of {case}");
            }
            let report = case["properties"]["report"].as_str().unwrap();
            assert!(dir.path().join("merged").join(report).exists(), "its report exists: {report}");
        }
    }
}

/// The suite's JUnit file as junitparser (a real reader from PyPI, installed into `.ci/venv`
/// by `scripts/setup`) reads it: per case its classname, name, time, results and properties.
/// `None` when it is not installed (skipped; a failure under `FENCELAB_REQUIRE_ALL=1`).
fn read_by_junitparser(path: &Path) -> Option<Vec<serde_json::Value>> {
    const READ: &str = r#"
import json, sys
from junitparser import JUnitXml
xml = JUnitXml.fromfile(sys.argv[1])
suites = [xml] if xml._tag == "testsuite" else list(xml)
cases = []
for suite in suites:
    for case in suite:
        found = case._elem.find("properties")
        properties = {p.get("name"): p.get("value") for p in found} if found is not None else {}
        cases.append({"classname": case.classname, "name": case.name, "time": case.time,
                      "results": [type(r).__name__ for r in case.result], "properties": properties})
print(json.dumps(cases))
"#;
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/venv/bin/python");
    let ready = python.is_file()
        && std::process::Command::new(&python).args(["-c", "import junitparser"]).status().is_ok_and(|s| s.success());
    if !ready {
        let why = format!("no junitparser at {} (run scripts/setup)", python.display());
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "{why}, and FENCELAB_REQUIRE_ALL=1");
        eprintln!("SKIPPED the junitparser check: {why}");
        return None;
    }
    let output = std::process::Command::new(&python).args(["-c", READ]).arg(path).output().unwrap();
    assert!(
        output.status.success(),
        "junitparser reads {}: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(serde_json::from_slice(&output.stdout).expect("the reader prints JSON"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_of_a_run_that_caught_a_bug_catches_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let schedule = dir.path().join("conflict.json");
    std::fs::write(&schedule, CONFLICT_AT_3S).unwrap();
    let store = dir.path().join("store").display().to_string();
    let args = ["run", "--seed", "1", "--time-limit", "6", "--runners", "1", "--bug", "overwrite-terminal-result"];
    let mut run: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    run.extend(["--schedule".into(), schedule.display().to_string(), "--store".into(), store.clone()]);
    let (code, said) = fencelab(&run).await;
    assert_eq!(code, Some(1), "{said}");
    let folder = dir.path().join("store/latest").display().to_string();
    let replays = dir.path().join("replays").display().to_string();
    let (code, said) =
        fencelab(&["replay".into(), folder, "--tries".into(), "2".into(), "--store".into(), replays]).await;
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("2 of 2 replays reproduced"), "{said}");
    // Plain words, not Rust's debug text.
    assert!(said.contains("anomalies in ") && said.contains("terminal-stability"), "{said}");
    assert!(!said.contains("Some(") && !said.contains("{\""), "{said}");
}
