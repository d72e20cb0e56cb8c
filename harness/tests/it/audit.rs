//! `fencelab audit` from the outside: a control plane served again on a finished run's store
//! (the lab's, and the Python example's) is audited once and with `--follow` in small rounds
//! (a window that lets jobs go and reads them back); each audit agrees with the run's own
//! check on every rule it judges, a planted bug is caught by the audit alone, the correct
//! systems are never invalid. A live run is followed under load in a bounded window. Bad
//! input is refused with 254 before anything is written; a bounded audit resumes from its
//! cursor to the same verdict.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use checkers::Verdict;

use super::run::{caught, run, Finished};

/// Longest one audit may take here.
const AUDIT_WAIT_MAX: Duration = Duration::from_secs(120);

/// A control plane served again on `run`'s store, for as long as it is held.
struct Served {
    url: String,
    token: &'static str,
    _process: procs::launch::Process,
}

/// Serves the control plane of the lab's run in `folder` again on its SQLite store.
async fn serve_lab(folder: &Path) -> Served {
    let store = folder.join("lab/control_plane/control.sqlite");
    assert!(store.is_file(), "{} holds the run's store", store.display());
    let args: Vec<OsString> = [
        "control-plane",
        "--listen",
        "127.0.0.1:0",
        "--operator-token",
        "operator-local",
        "--secret",
        "audit-secret",
        "--lease-ms",
        "1000",
        "--db",
    ]
    .iter()
    .map(OsString::from)
    .chain([store.into_os_string()])
    .collect();
    let command = procs::launch::command(Path::new(&super::lab_binary()), &args, None).unwrap();
    let process = procs::launch::server(command, "control-plane").await.unwrap();
    let url = format!("http://{}", process.addr.unwrap());
    Served { url, token: "operator-local", _process: process }
}

/// Serves the Python example's control plane of the run in `folder` again on its store.
async fn serve_python(folder: &Path) -> Served {
    let store = folder.join("lab/control_plane/control.sqlite");
    assert!(store.is_file(), "{} holds the run's store", store.display());
    let system = super::second::python_system();
    let script = system.with_file_name("control_plane.py");
    let args: Vec<OsString> = [script.as_os_str(), "--listen=127.0.0.1:0".as_ref(), "--lease-ms=1000".as_ref()]
        .into_iter()
        .map(OsString::from)
        .chain(["--operator-token=python-lab-operator", "--secret=audit-secret"].map(OsString::from))
        .chain([OsString::from(format!("--db={}", store.display()))])
        .collect();
    let command = procs::launch::command(Path::new("python3"), &args, None).unwrap();
    let process = procs::launch::server(command, "python control plane").await.unwrap();
    let url = format!("http://{}", process.addr.unwrap());
    Served { url, token: "python-lab-operator", _process: process }
}

/// `fencelab audit --url URL --token T --out OUT --lease-ms 1000 EXTRA...`: its exit, what it
/// said, and the checkers' results it wrote.
async fn audit(served: &Served, out: &Path, extra: &[&str]) -> (Option<i32>, String, Vec<checkers::CheckerResult>) {
    audit_at(&served.url, served.token, out, extra).await
}

/// [`audit`] of the control plane at `url` with `token`.
async fn audit_at(
    url: &str,
    token: &str,
    out: &Path,
    extra: &[&str],
) -> (Option<i32>, String, Vec<checkers::CheckerResult>) {
    let mut args: Vec<OsString> =
        ["audit", "--url", url, "--token", token, "--lease-ms", "1000", "--out"].iter().map(OsString::from).collect();
    args.push(out.as_os_str().to_owned());
    args.extend(extra.iter().map(OsString::from));
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|arg| arg.as_os_str()).collect();
    let (code, said) = super::fencelab_output(&refs, AUDIT_WAIT_MAX).await;
    assert_ne!(code, Some(255), "{said}");
    let checked = std::fs::read_to_string(out.join("results.json"))
        .map(|text| {
            let results: serde_json::Value = serde_json::from_str(&text).unwrap();
            serde_json::from_value(results["checkers"].clone()).unwrap()
        })
        .unwrap_or_default();
    (code, said, checked)
}

/// The run's own checkers' results.
fn run_checked(finished: &Finished) -> Vec<checkers::CheckerResult> {
    let text = std::fs::read_to_string(finished.folder().join("results.json")).unwrap();
    let results: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(results["checkers"].clone()).unwrap()
}

/// (checker, kind, job) of every anomaly of `checked`.
fn found(checked: &[checkers::CheckerResult]) -> BTreeSet<(String, String, Option<String>)> {
    let anomalies = checked.iter().filter_map(|result| match &result.verdict {
        Verdict::Invalid { anomalies } => Some(anomalies),
        _ => None,
    });
    anomalies.flatten().map(|anomaly| (anomaly.checker.clone(), anomaly.kind.clone(), anomaly.job.clone())).collect()
}

fn word(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Valid => "valid",
        Verdict::Invalid { .. } => "invalid",
        Verdict::Unknown { .. } => "unknown",
    }
}

/// Every checker the audit judged (valid or invalid) has the run's verdict, and every
/// anomaly the audit found, the run found too.
fn agree(audited: &[checkers::CheckerResult], run: &[checkers::CheckerResult], repeat: &str) {
    assert_eq!(audited.len(), run.len(), "every checker answers ({repeat})");
    for (ours, theirs) in audited.iter().zip(run) {
        if matches!(ours.verdict, Verdict::Unknown { .. }) {
            continue;
        }
        assert_eq!(
            (ours.checker.as_str(), word(&ours.verdict)),
            (theirs.checker.as_str(), word(&theirs.verdict)),
            "the audit judged {} as the run did ({repeat})",
            ours.checker
        );
    }
    let extra: Vec<_> = found(audited).difference(&found(run)).cloned().collect();
    assert!(extra.is_empty(), "anomalies the run's own check did not find ({repeat}): {extra:?}");
}

/// Audits `served` once and with `--follow` in rounds of 25 entries; both agree with the
/// run's check; answers the exits.
async fn audits_agree(served: &Served, finished: &Finished, repeat: &str) -> (Option<i32>, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let run = run_checked(finished);
    let (once, said, checked) = audit(served, &dir.path().join("once"), &[]).await;
    agree(&checked, &run, repeat);
    let follow =
        ["--follow", "--interval-ms", "100", "--time-limit", "3", "--round-entries", "25", "--page-entries", "10"];
    let (followed, follow_said, follow_checked) = audit(served, &dir.path().join("follow"), &follow).await;
    agree(&follow_checked, &run, repeat);
    let cursor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("follow/cursor.json")).unwrap()).unwrap();
    let (entries, peak) = (cursor["entries"].as_u64().unwrap(), cursor["window_entries_peak"].as_u64().unwrap());
    assert!(entries > 100 && peak < entries, "the follow let jobs go: {cursor} ({repeat})");
    for (result, ours) in follow_checked.iter().zip(&checked) {
        assert_eq!(
            word(&result.verdict),
            word(&ours.verdict),
            "{}: follow and once agree ({repeat})\n{said}\n{follow_said}",
            result.checker
        );
    }
    (once, followed)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_audit_of_the_labs_ledger_agrees_with_its_run_and_catches_a_planted_bug_alone() {
    let correct = ["--seed", "11", "--time-limit", "12", "--nemesis", "all"];
    let buggy = ["--time-limit", "12", "--bug", "accept-stale-result", "--nemesis", "reconnects"];
    let (correct_run, (buggy_run, repeat)) = tokio::join!(run(&correct), caught(&buggy));
    assert_eq!(correct_run.code, Some(0), "{}\n{}", correct_run.stdout, correct_run.stderr);
    let served = serve_lab(&correct_run.folder()).await;
    let exits = audits_agree(&served, &correct_run, "fencelab run --seed 11 --time-limit 12 --nemesis all").await;
    assert_eq!(
        exits,
        (Some(2), Some(2)),
        "the correct lab's ledger alone: unknown for what it cannot hold, never invalid"
    );
    let served = serve_lab(&buggy_run.folder()).await;
    let exits = audits_agree(&served, &buggy_run, &repeat).await;
    assert_eq!(exits, (Some(1), Some(1)), "the planted bug is caught by the audit alone ({repeat})");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_audit_of_the_python_examples_ledger_agrees_with_its_run_and_catches_its_bug() {
    if super::second::python_missing() {
        return;
    }
    let system = super::second::python_system();
    let system = system.to_str().unwrap();
    let correct = ["--system", system, "--seed", "4", "--time-limit", "12", "--nemesis", "all"];
    let buggy =
        ["--system", system, "--time-limit", "12", "--variant", "accept-stale-result", "--nemesis", "reconnects"];
    let (correct_run, (buggy_run, repeat)) = tokio::join!(run(&correct), caught(&buggy));
    assert_eq!(correct_run.code, Some(0), "{}\n{}", correct_run.stdout, correct_run.stderr);
    let served = serve_python(&correct_run.folder()).await;
    let exits = audits_agree(&served, &correct_run, "the Python example, --seed 4 --nemesis all").await;
    assert_eq!(exits, (Some(2), Some(2)));
    let served = serve_python(&buggy_run.folder()).await;
    let exits = audits_agree(&served, &buggy_run, &repeat).await;
    assert_eq!(exits, (Some(1), Some(1)));
}

/// The resident set of process `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_follows_a_live_run_under_load_in_a_window_bounded_by_its_open_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut chaos = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    chaos
        .args(["run", "--test-name", "live", "--seed", "5", "--time-limit", "40", "--rate", "12", "--runners", "6"])
        .args(["--keys", "24", "--nemesis", "all", "--store"])
        .arg(&store)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut chaos = chaos.spawn().unwrap();
    let waited = std::time::Instant::now();
    let endpoints = loop {
        let found = std::fs::read_dir(store.join("live")).ok().and_then(|mut runs| runs.next()).and_then(Result::ok);
        let path = found.map(|run| run.path().join("endpoints.json"));
        if let Some(text) = path.and_then(|path| std::fs::read_to_string(path).ok()).filter(|text| !text.is_empty()) {
            break serde_json::from_str::<serde_json::Value>(&text).unwrap();
        }
        assert!(waited.elapsed() < Duration::from_secs(60), "the run wrote endpoints.json within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let url = endpoints["control_urls"][0].as_str().unwrap().to_string();
    let out = dir.path().join("audit");
    let system = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/lab.toml");
    let mut follow = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    follow
        .args(["audit", "--url", &url, "--follow", "--interval-ms", "200", "--time-limit", "35", "--lease-ms", "1000"])
        .arg("--system")
        .arg(&system)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let follow = follow.spawn().unwrap();
    let pid = follow.id().unwrap();
    let mut samples: Vec<(u64, u64)> = Vec::new();
    let sampling = async {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let Some(rss) = rss_kib(pid) else { break };
            let cursor = std::fs::read_to_string(out.join("cursor.json")).ok();
            let entries = cursor
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                .map(|c| c["entries"].as_u64().unwrap_or(0));
            samples.push((entries.unwrap_or(0), rss));
        }
    };
    let (output, ()) = tokio::join!(tokio::time::timeout(AUDIT_WAIT_MAX, follow.wait_with_output()), sampling);
    let output = output.expect("the follow ends at its time limit").unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    let _ = chaos.kill().await;
    assert_ne!(output.status.code(), Some(1), "the correct lab is never invalid under audit:\n{said}");
    assert_ne!(output.status.code(), Some(255), "{said}");
    let cursor = std::fs::read_to_string(out.join("cursor.json"))
        .unwrap_or_else(|error| panic!("no cursor.json ({error}); the follow exited {:?}:\n{said}", output.status));
    let cursor: serde_json::Value = serde_json::from_str(&cursor).unwrap();
    let (entries, peak) = (cursor["entries"].as_u64().unwrap(), cursor["window_entries_peak"].as_u64().unwrap());
    assert!(cursor["rounds"].as_u64().unwrap() > 20, "the follow checked in rounds: {cursor}");
    // A loaded CI machine was seen to ledger 1,930 entries in the follow's 35 s; the window
    // bound below is what is tested, the load only has to be well above it.
    assert!(entries > 1_000, "the run was under load: {cursor}");
    assert!(peak * 4 < entries, "the window holds the open jobs, not the ledger: {cursor}");
    // Memory flat: from the first third of the follow to its end, the resident set grows by
    // less than the ledger read in that time would take held (a few hundred bytes an entry).
    let third = samples.len() / 3;
    assert!(third >= 5, "sampled through the follow: {samples:?}");
    let (early_entries, early_rss) = samples[third];
    let late_rss = samples[third..].iter().map(|(_, rss)| *rss).max().unwrap();
    let (late_entries, _) = *samples.last().unwrap();
    let grown_kib = late_rss.saturating_sub(early_rss);
    eprintln!(
        "follow: {cursor}; RSS {early_rss} KiB at {early_entries} entries, at most {late_rss} KiB up to {late_entries}"
    );
    assert!(late_entries > early_entries + 500, "entries kept coming: {samples:?}");
    assert!(
        grown_kib < 8 * 1024,
        "the resident set grew {grown_kib} KiB while {} entries were audited: {samples:?}",
        late_entries - early_entries
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bounded_audit_is_incomplete_and_resumes_from_its_cursor_to_the_same_verdict() {
    let (finished, _) = caught(&["--time-limit", "8", "--bug", "accept-stale-result", "--nemesis", "reconnects"]).await;
    let served = serve_lab(&finished.folder()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("resumed");
    let (code, said, _) = audit(&served, &out, &["--page-entries", "10", "--pages-max", "2"]).await;
    assert!(said.contains("complete     no: --pages-max 2 pages were read"), "{said}");
    assert_ne!(code, Some(0), "an incomplete audit is never valid: {said}");
    let cursor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("cursor.json")).unwrap()).unwrap();
    assert_eq!((cursor["after"].as_u64(), cursor["entries"].as_u64()), (Some(20), Some(20)), "{cursor}");
    let (resumed, resumed_said, resumed_checked) = audit(&served, &out, &["--page-entries", "10"]).await;
    let (whole, whole_said, whole_checked) = audit(&served, &dir.path().join("whole"), &[]).await;
    assert_eq!(resumed, Some(1), "{resumed_said}");
    assert_eq!(whole, Some(1), "{whole_said}");
    assert_eq!(found(&resumed_checked), found(&whole_checked), "resumed and whole audits agree");
    let ledger = |folder: &Path| std::fs::read_to_string(folder.join("ledger.jsonl")).unwrap();
    assert_eq!(ledger(&out), ledger(&dir.path().join("whole")), "the resumed ledger.jsonl holds each entry once");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_audits_are_refused_with_254_and_write_nothing() {
    let finished = run(&["--seed", "2", "--time-limit", "3", "--nemesis", "none"]).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let served = serve_lab(&finished.folder()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("refused");
    let (code, said, _) = audit_at(&served.url, "not-the-operator", &out, &[]).await;
    assert_eq!(code, Some(254), "{said}");
    assert!(said.contains("refused the ledger read: 401"), "{said}");
    assert!(!out.exists(), "nothing was written: {said}");
    let cases: [(&[&str], &str); 4] = [
        (&["--page-entries", "0"], "--page-entries 0: must be 1..=10000"),
        (&["--page-entries", "10001"], "--page-entries 10001"),
        (&["--follow", "--interval-ms", "0"], "--interval-ms 0"),
        (&["--pages-max", "0"], "--pages-max 0"),
    ];
    for (extra, message) in cases {
        let (code, said, _) = audit(&served, &out, extra).await;
        assert_eq!(code, Some(254), "{extra:?}: {said}");
        assert!(said.contains(message), "{extra:?} names the flag: {said}");
        assert!(!out.exists(), "{extra:?} wrote nothing");
    }
    let (code, said, _) = audit_at("http://127.0.0.1:9", served.token, &out, &[]).await;
    assert_eq!(code, Some(254), "an unreachable control plane: {said}");
    assert!(said.contains("--url http://127.0.0.1:9"), "{said}");
    assert!(!out.exists(), "nothing was written: {said}");
    let (code, said, _) = audit(&served, &out, &[]).await;
    assert_eq!(code, Some(2), "the correct lab's ledger alone is unknown: {said}");
    let (code, said, _) = audit_at("http://127.0.0.1:9", served.token, &out, &[]).await;
    assert_eq!(code, Some(254), "{said}");
    assert!(said.contains("holds the audit of http://127.0.0.1:"), "{said}");
    let (code, said, _) = audit(&served, dir.path(), &[]).await;
    assert_eq!(code, Some(254), "a folder holding other files: {said}");
    assert!(said.contains("holds files but no audit's cursor.json"), "{said}");
    let (code, said) = super::fencelab_output(
        &["audit", "--url", &served.url, "--out", "x"].map(std::ffi::OsStr::new),
        AUDIT_WAIT_MAX,
    )
    .await;
    assert_eq!(code, Some(254), "no token: {said}");
    assert!(said.contains("give the operator token"), "{said}");
}

/// The cursor an audit saved in `out`, once it is there.
fn cursor_of(out: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(out.join("cursor.json")).ok()?).ok()
}

/// Waits (bounded) until the audit's cursor in `out` says `ready`.
async fn wait_cursor(out: &Path, ready: impl Fn(&serde_json::Value) -> bool, what: &str) -> serde_json::Value {
    let waited = std::time::Instant::now();
    loop {
        if let Some(cursor) = cursor_of(out).filter(|cursor| ready(cursor)) {
            return cursor;
        }
        assert!(waited.elapsed() < Duration::from_secs(60), "{what} within 60 s: {:?}", cursor_of(out));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A job that finished is let go by a follow's window; a duplicate and a conflicting result
/// for it, sent afterwards, have it read back whole, so the rules judge them on its whole
/// ledger (read as reports of a job never seen, they would be false alarms).
#[tokio::test(flavor = "multi_thread")]
async fn a_job_the_follow_let_go_is_read_back_whole_when_a_late_report_names_it() {
    use protocol::{ClaimRef, ClaimRequest, HeartbeatRequest, Outcome, ResultRequest, SubmitJob};
    let dir = tempfile::tempdir().unwrap();
    let lab = lab::demo::LocalLab::start(lab::demo::LabOptions::new(Path::new(&super::lab_binary()), dir.path()))
        .await
        .unwrap();
    let runner = lab.register("r1").await.unwrap();
    let submit = SubmitJob {
        project: lab::demo::PROJECT.into(),
        id: Some("j1".into()),
        deployment_key: "k1".into(),
        spec: protocol::JobSpec { steps: 1, step_ms: 1 },
    };
    lab.operator.submit(&submit).await.unwrap();
    let now = || chrono::Utc::now().timestamp_millis();
    let claimed = runner.claim(&ClaimRequest { runner: "r1".into(), observed_ms: now() }).await.unwrap();
    let claim: ClaimRef = claimed.grant.expect("j1 is claimable").claim;
    let result = |outcome| ResultRequest { claim: claim.clone(), outcome, observed_ms: now(), detail: None };
    let first = runner.result(&result(Outcome::Succeeded)).await.unwrap();
    assert_eq!(first.decision, history::Decision::Accepted);
    let out = dir.path().join("audit");
    let args: Vec<OsString> = ["audit", "--url", &lab.control_url(), "--token", lab::demo::OPERATOR_TOKEN, "--follow"]
        .into_iter()
        .chain(["--interval-ms", "50", "--time-limit", "30", "--round-entries", "1", "--lease-ms", "2000"])
        .map(OsString::from)
        .chain([OsString::from("--out"), out.clone().into_os_string()])
        .collect();
    let mut follow = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    follow.args(&args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
    let follow = follow.spawn().unwrap();
    let let_go = |cursor: &serde_json::Value| cursor["entries"] == 3 && cursor["window_entries"] == 0;
    wait_cursor(&out, let_go, "the follow read j1's three entries and let it go").await;
    let duplicate = runner.result(&result(Outcome::Succeeded)).await.unwrap();
    let conflict = runner.result(&result(Outcome::Failed)).await.unwrap();
    let heartbeat = runner.heartbeat(&HeartbeatRequest { claim: claim.clone(), observed_ms: now() }).await.unwrap();
    let decisions = (duplicate.decision, conflict.decision, heartbeat.decision);
    assert_eq!(decisions, (history::Decision::Duplicate, history::Decision::Conflict, history::Decision::Rejected));
    let read_back = |cursor: &serde_json::Value| cursor["entries"] == 6 && cursor["rounds"].as_u64() > Some(3);
    wait_cursor(&out, read_back, "the follow read the late reports").await;
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(follow.id().unwrap() as i32, libc::SIGINT) }, 0);
    let output = tokio::time::timeout(AUDIT_WAIT_MAX, follow.wait_with_output()).await.unwrap().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(2), "the correct lab's ledger alone: unknown, never invalid:\n{said}");
    let cursor = cursor_of(&out).unwrap();
    // Once, or again for a later report when the window let j1 go between two of them (the
    // three late reports may come in different rounds): never more often than reports came.
    let read_back = cursor["jobs_read_back"].as_u64().unwrap_or(0);
    assert!((1..=3).contains(&read_back), "j1 was read back when the late reports named it: {cursor}");
    lab.shutdown().await;
}

fn report(claim: &protocol::ClaimRef, outcome: protocol::Outcome) -> protocol::ResultRequest {
    let observed_ms = chrono::Utc::now().timestamp_millis();
    protocol::ResultRequest { claim: claim.clone(), outcome, observed_ms, detail: None }
}

/// The colleague's false alarm ("j19-a1's result was rejected as `not_current`; the rules
/// give `unknown`"), made to happen with the lab's own API. Runner r1 claims j1 and r2 then
/// j2; r1 sends a result for its own attempt naming j2 (a cross-job report, rejected
/// `not_current`: it is j2's ledger entry, and names j1-a1); both jobs then succeed, and the
/// follow lets both go. A late duplicate result for j2 has j2 read back whole, its ledger
/// holding the crossed report: j1, whose attempt that names, must be read back too, or the
/// rules judge the report with neither its claim nor its job and answer `unknown`.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_read_back_whole_has_the_jobs_of_the_attempts_its_ledger_names_read_back_too() {
    use protocol::{ClaimRef, ClaimRequest, Outcome, SubmitJob};
    let dir = tempfile::tempdir().unwrap();
    let lab = lab::demo::LocalLab::start(lab::demo::LabOptions::new(Path::new(&super::lab_binary()), dir.path()))
        .await
        .unwrap();
    let (r1, r2) = (lab.register("r1").await.unwrap(), lab.register("r2").await.unwrap());
    let mut claims = Vec::new();
    for (runner, id, job) in [(&r1, "r1", "j1"), (&r2, "r2", "j2")] {
        let spec = protocol::JobSpec { steps: 1, step_ms: 1 };
        let (project, key) = (lab::demo::PROJECT.into(), format!("k-{job}"));
        lab.operator.submit(&SubmitJob { project, id: Some(job.into()), deployment_key: key, spec }).await.unwrap();
        let observed_ms = chrono::Utc::now().timestamp_millis();
        let claimed = runner.claim(&ClaimRequest { runner: id.into(), observed_ms }).await.unwrap();
        let claim: ClaimRef = claimed.grant.expect("the job just submitted is claimable").claim;
        assert_eq!(claim.job, job);
        claims.push(claim);
    }
    let crossed = ClaimRef { job: "j2".into(), ..claims[0].clone() };
    let ruling = r1.result(&report(&crossed, Outcome::Succeeded)).await.unwrap();
    assert_eq!((ruling.decision, ruling.reason), (history::Decision::Rejected, Some(history::Reason::NotCurrent)));
    for (runner, claim) in [(&r1, &claims[0]), (&r2, &claims[1])] {
        let ruling = runner.result(&report(claim, Outcome::Succeeded)).await.unwrap();
        assert_eq!(ruling.decision, history::Decision::Accepted);
    }
    let out = dir.path().join("audit");
    let args: Vec<OsString> = ["audit", "--url", &lab.control_url(), "--token", lab::demo::OPERATOR_TOKEN, "--follow"]
        .into_iter()
        .chain(["--interval-ms", "50", "--time-limit", "30", "--round-entries", "1", "--lease-ms", "2000"])
        .map(OsString::from)
        .chain([OsString::from("--out"), out.clone().into_os_string()])
        .collect();
    let mut follow = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    follow.args(&args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
    let follow = follow.spawn().unwrap();
    // Seven entries: two submits, two claims, the crossed report, two results.
    let let_go = |cursor: &serde_json::Value| cursor["entries"] == 7 && cursor["window_entries"] == 0;
    wait_cursor(&out, let_go, "the follow read the seven entries and let j1 and j2 go").await;
    let duplicate = r2.result(&report(&claims[1], Outcome::Succeeded)).await.unwrap();
    assert_eq!(duplicate.decision, history::Decision::Duplicate);
    let seen = wait_cursor(&out, |cursor| cursor["entries"] == 8, "the follow read the late report").await;
    // A round follows each page here (rounds of one entry); one more, to be sure.
    let rounds = seen["rounds"].as_u64().unwrap();
    let checked = |cursor: &serde_json::Value| cursor["rounds"].as_u64() > Some(rounds);
    wait_cursor(&out, checked, "the follow checked the late report in a round").await;
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(follow.id().unwrap() as i32, libc::SIGINT) }, 0);
    let output = tokio::time::timeout(AUDIT_WAIT_MAX, follow.wait_with_output()).await.unwrap().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(2), "the correct lab's ledger alone: unknown, never invalid:\n{said}");
    let cursor = cursor_of(&out).unwrap();
    assert_eq!(cursor["jobs_read_back"], 2, "j2, named by the late report, and j1, named by j2's ledger: {cursor}");
    lab.shutdown().await;
}

/// The one collector reads a system that still decides while it is read as one snapshot:
/// every job it read has its ledger entries in the ledger it read. Read as the ledger, then
/// the jobs, a job submitted in between was judged against a ledger that lacks it (an
/// observed Buildbot's build finishing between the two reads: "job j4 ended `succeeded` but
/// its ledger replays to `running`").
#[tokio::test(flavor = "multi_thread")]
async fn the_collector_reads_jobs_and_ledger_as_one_snapshot_while_the_system_still_decides() {
    use protocol::SubmitJob;
    let dir = tempfile::tempdir().unwrap();
    let lab = lab::demo::LocalLab::start(lab::demo::LabOptions::new(Path::new(&super::lab_binary()), dir.path()))
        .await
        .unwrap();
    let submit = |operator: protocol::client::Client, from: u32, to: u32| async move {
        for n in from..to {
            let job = SubmitJob {
                project: lab::demo::PROJECT.into(),
                id: Some(format!("j{n}")),
                deployment_key: format!("k{}", n % 4),
                spec: protocol::JobSpec { steps: 1, step_ms: 1 },
            };
            operator.submit(&job).await.unwrap();
        }
    };
    submit(lab.operator.clone(), 0, 5).await;
    // The collector reads through a proxy that holds every answer 500 ms: its ledger's two
    // pages are answered by about 1 s, its list of jobs is asked for then; five more jobs
    // are submitted directly in between.
    let server = proxy::start("127.0.0.1:0".parse().unwrap(), 1).await.unwrap();
    let client = proxy::Client::new(&server.url()).unwrap();
    let upstream = lab.control_url().trim_start_matches("http://").to_string();
    let link = client.create_proxy("operator", "127.0.0.1:0", &upstream).await.unwrap();
    let slow = proxy::Toxic::new(proxy::ToxicKind::Latency { latency_ms: 500, jitter_ms: 0 });
    client.add_toxic("operator", &slow).await.unwrap();
    let operator = lab.operator.at(&format!("http://{}", link.listen_addr().unwrap()));
    let between = lab.operator.clone();
    let more = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(750)).await;
        submit(between, 5, 10).await;
    });
    let records = system::collect::read(&operator, None, true).await;
    more.await.unwrap();
    assert!(records.unreadable.is_empty(), "{:?}", records.unreadable);
    let submitted: BTreeSet<&str> = records.ledger.iter().map(|entry| entry.job.as_str()).collect();
    let torn: Vec<&str> = records.jobs.iter().map(|job| job.id.as_str()).filter(|id| !submitted.contains(id)).collect();
    assert!(torn.is_empty(), "jobs read without their ledger entries: {torn:?}");
}

/// A follow that starts while the control plane does not answer yet (a restart, a slow
/// start) tries its first read again instead of refusing the address: here the server only
/// listens after a second and a half. Without the retry it exited 254 at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_follow_started_before_the_control_plane_answers_waits_for_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let server = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut request = vec![0_u8; 4096];
                // One read holds a small GET; every request gets an empty ledger page.
                if stream.read(&mut request).await.unwrap_or(0) > 0 {
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]";
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("audit");
    let url = format!("http://{addr}");
    let (code, said, _) =
        audit_at(&url, "operator-local", &out, &["--follow", "--interval-ms", "200", "--time-limit", "3"]).await;
    server.abort();
    assert_ne!(code, Some(254), "the follow refused an address that answers a second and a half later:\n{said}");
    assert!(out.join("cursor.json").exists(), "the follow read and saved its cursor:\n{said}");
}
