//! Nightly trends: `fencelab merge --history DIR` over four stored nights (written through the
//! suite's own types) renders a trend page bounded to the last N; bad history input exits 254.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use campaign::suite::{read_result, write, Entry, SuiteResult};

const BOUND: Duration = Duration::from_secs(120);

fn entry(index: usize, name: &str, passed: bool, verdict: &str, bugs: &[&str], checkers: &[&str]) -> Entry {
    Entry {
        index,
        name: name.into(),
        seed: 1,
        expect: if bugs.is_empty() { results::Overall::Valid } else { results::Overall::Invalid },
        verdict: results::RunVerdict::parse(verdict).expect("a run verdict"),
        passed,
        command: format!("fencelab run --test-name {name} --seed 1"),
        report: None,
        bugs: bugs.iter().map(|b| b.to_string()).collect(),
        checkers: checkers.iter().map(|c| c.to_string()).collect(),
        duration_ms: None,
    }
}

/// Night `k` of the suite: `correct` passes until night 3 and then fails (a false alarm);
/// `stale` catches its bug except on night 2; `overwrite` is skipped on night 1.
fn night(k: usize) -> SuiteResult {
    let stale = if k == 2 {
        entry(1, "stale", false, "valid", &["accept-stale-result"], &[])
    } else {
        entry(1, "stale", true, "invalid", &["accept-stale-result"], &["stale-completion"])
    };
    let correct = if k >= 3 {
        entry(0, "correct", false, "invalid", &[], &["single-owner"])
    } else {
        entry(0, "correct", true, "valid", &[], &[])
    };
    let overwrite = if k == 1 {
        entry(2, "overwrite", false, "skipped: the 60 s budget would be exceeded", &["overwrite-terminal-result"], &[])
    } else {
        entry(2, "overwrite", true, "invalid", &["overwrite-terminal-result"], &["terminal-stability"])
    };
    SuiteResult { suite: "nightly".into(), entries: vec![correct, stale, overwrite] }
}

fn merge(dir: &Path, limit: &str) -> (Option<i32>, String, String) {
    let args: Vec<&OsStr> = vec![
        "merge".as_ref(),
        "--out".as_ref(),
        dir.join("nights/2026-12-04").into_os_string().leak(),
        "--history".as_ref(),
        dir.join("nights").into_os_string().leak(),
        "--history-limit".as_ref(),
        OsStr::new(limit),
        dir.join("shard").into_os_string().leak(),
    ];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (code, said) = runtime.block_on(crate::fencelab_output(&args, BOUND));
    let index = std::fs::read_to_string(dir.join("nights/2026-12-04/index.html")).unwrap_or_default();
    (code, said, index)
}

#[test]
fn merge_with_history_renders_trends_over_the_last_nights() {
    let dir = tempfile::tempdir().unwrap();
    for (k, name) in ["2026-11-30", "2026-12-01", "2026-12-02", "2026-12-03"].iter().enumerate() {
        write(&night(k), &dir.path().join("nights").join(name)).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("nights/not-a-night")).unwrap();
    write(&night(4), &dir.path().join("shard")).unwrap();
    let (code, said, index) = merge(dir.path(), "3");
    assert_eq!(code, Some(1), "tonight's `correct` failed: {said}");
    assert!(said.contains("trends: over 3 earlier nights and this one"), "{said}");
    assert!(index.contains("Trends over the last 4 nights"), "{index}");
    assert!(!index.contains("2026-11-30"), "the oldest night is past --history-limit 3");
    // correct: pass (12-01), pass (12-02), fail (12-03), fail (tonight).
    assert!(
        index.contains(
            "<tr><td>correct s1</td><td class=\"pass\">✓</td><td class=\"pass\">✓</td><td class=\"fail\">✗</td>\
             <td class=\"fail\">✗</td><td class=\"since\">failing since 2026-12-03</td></tr>"
        ),
        "{index}"
    );
    assert!(index.contains("<tr><td>overwrite s1</td><td class=\"unknown\">?</td>"), "{index}");
    assert!(index.contains("<td class=\"since\">last failed 2026-12-02</td>"), "stale failed on night 2");
    assert!(
        index.contains(
            "<tr><td>accept-stale-result</td><td class=\"pass\">1/1</td><td class=\"fail\">0/1</td>\
             <td class=\"pass\">1/1</td><td class=\"pass\">1/1</td></tr>"
        ),
        "{index}"
    );
    // Runs with a planted bug that ran: night 12-01 only `stale` (`overwrite` was skipped), then both.
    assert!(
        index.contains("<tr><td>stale-completion</td><td>1/1</td><td>0/2</td><td>1/2</td><td>1/2</td></tr>"),
        "{index}"
    );
    assert!(
        index.contains("<tr><td>overwrite-terminal-result</td><td class=\"none\">—</td><td class=\"pass\">1/1</td>"),
        "{index}"
    );
    assert!(index.contains("<p id=\"false-alarms\">2 in all"), "{index}");
    assert!(index.contains("<th class=\"tonight\" title=\"2026-12-04\">"));
    let merged = read_result(&dir.path().join("nights/2026-12-04")).unwrap();
    assert_eq!(merged.entries[1].checkers, ["stale-completion"], "suite.json keeps the checkers");
    assert_eq!(merged.entries[1].bugs, ["accept-stale-result"]);
    // Merged again: tonight's own folder, now holding a suite.json, is not an earlier night.
    let (_, said, index) = merge(dir.path(), "3");
    assert!(said.contains("trends: over 3 earlier nights and this one"), "{said}");
    assert!(index.contains("Trends over the last 4 nights"));
    assert!(index.contains("<th title=\"2026-12-01\">"), "12-01 is still one of the last 3 earlier nights: {index}");
    assert_eq!(index.matches("title=\"2026-12-04\"").count(), 4, "tonight is one column of each of the 4 tables");
}

#[test]
fn bad_history_input_exits_254_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    write(&night(0), &dir.path().join("shard")).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let out = dir.path().join("out");
    let missing = dir.path().join("no-such-folder");
    let shard = dir.path().join("shard");
    let cases: [(&[&OsStr], &str); 3] = [
        (
            &[
                "merge".as_ref(),
                "--out".as_ref(),
                out.as_os_str(),
                "--history".as_ref(),
                missing.as_os_str(),
                shard.as_os_str(),
            ],
            "not a folder of earlier suite outputs",
        ),
        (
            &[
                "merge".as_ref(),
                "--out".as_ref(),
                out.as_os_str(),
                "--history".as_ref(),
                shard.as_os_str(),
                "--history-limit".as_ref(),
                "0".as_ref(),
                shard.as_os_str(),
            ],
            "--history-limit 0: expected 1..=365",
        ),
        (
            &["suite".as_ref(), "no-such-suite.toml".as_ref(), "--history".as_ref(), missing.as_os_str()],
            "not a folder of earlier suite outputs",
        ),
    ];
    for (args, message) in cases {
        let (code, said) = runtime.block_on(crate::fencelab_output(args, BOUND));
        assert_eq!(code, Some(254), "{said}");
        assert!(said.contains(message), "{said}");
    }
    assert!(!out.exists(), "nothing was written");
}
