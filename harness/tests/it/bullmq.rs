//! BullMQ on Redis (`systems/bullmq/`: the contract served by BullMQ through a thin Node
//! adapter in which every decision is BullMQ's) under fencelab: it starts, conform judges it,
//! and a chaos run's verdict and anomaly kinds are the ones `docs/analyses/bullmq.md`
//! explains — no more, no fewer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::run::run;

pub fn bullmq_system() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/bullmq/system.toml")
}

/// Whether `program --version` runs and succeeds.
pub fn answers(program: &str) -> bool {
    std::process::Command::new(program).arg("--version").output().is_ok_and(|out| out.status.success())
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when any dependency is missing: each
/// `Some` says which. True when the test must not go on.
pub fn skip_for(missing: Vec<Option<&str>>) -> bool {
    let missing: Vec<&str> = missing.into_iter().flatten().collect();
    if missing.is_empty() {
        return false;
    }
    eprintln!("SKIPPED: {}", missing.join("; "));
    let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
    assert!(!require_all, "{} and FENCELAB_REQUIRE_ALL=1", missing.join("; "));
    true
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when node, redis-server or the pinned
/// npm packages (`npm ci` in `systems/bullmq`) are absent.
pub fn bullmq_missing() -> bool {
    let modules = bullmq_system().with_file_name("node_modules").join("bullmq").join("package.json");
    skip_for(vec![
        (!answers("node")).then_some("node is not installed"),
        (!answers("redis-server")).then_some("redis-server is not installed"),
        (!modules.exists()).then_some("systems/bullmq/node_modules is absent (run `npm ci` there)"),
    ])
}

/// The cases conform printed with `verdict` (`"PASS "`, `"FAIL "`).
pub fn conform_cases(said: &str, verdict: &str) -> BTreeSet<String> {
    said.lines()
        .filter_map(|line| line.strip_prefix(verdict))
        .filter_map(|rest| rest.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The line conform printed for `case`.
pub fn line<'a>(said: &'a str, case: &str) -> &'a str {
    said.lines().find(|line| line.split_whitespace().nth(1) == Some(case)).unwrap_or_default()
}

/// Whether a conform line has findings and every one is `excused`: a job system's own
/// finding (one that fails another case whatever the timing) that a slow machine brought into
/// a case about something else.
pub fn only_findings_among(line: &str, excused: impl Fn(&str) -> bool) -> bool {
    // The verdict, the case, then the findings.
    let case_on = line.trim_start().split_once(char::is_whitespace).map(|(_, rest)| rest.trim_start());
    let Some((_, findings)) = case_on.and_then(|rest| rest.split_once(char::is_whitespace)) else {
        return false;
    };
    let Some(findings) = findings.trim().strip_prefix("rules model: ") else { return false };
    findings.split("; rules model: ").all(excused)
}

/// Whether a finding is an expiry recorded as a requeue, and nothing else.
pub fn requeued(finding: &str) -> bool {
    finding.contains("'s expiry was recorded as `requeued`") && !finding.contains("; ")
}

/// Whether every finding of a conform line is BullMQ's requeue of a stalled job
/// (`rule/no-requeue-on-expiry`): on a slow machine a case's lease (1.5 s) can lapse before
/// its report comes, and BullMQ's stall check moves the job back to its queue. A report
/// accepted late is not excused: BullMQ's lock lapses on time, so that would be the
/// adapter's.
fn only_slow_machine_findings(line: &str) -> bool {
    only_findings_among(line, requeued)
}

/// The conform cases BullMQ fails whatever the timing (docs/analyses/bullmq.md): it requeues
/// a stalled job, and it refuses every result once the first one released its lock.
const CONFORM_FAILS: [&str; 6] = [
    "rule/stale-completion",
    "rule/no-requeue-on-expiry",
    "rule/duplicate-result",
    "rule/conflicting-result",
    "race/results",
    "model/rules-replay",
];

/// The cases the adapter itself answers for (bodies, tokens, routes, reads): BullMQ decides
/// none of them, so each must pass, unless a slow machine let BullMQ's requeue into one
/// ([`only_slow_machine_findings`]).
const CONFORM_PASSES: [&str; 6] = [
    "endpoint/health",
    "endpoint/projects",
    "endpoint/runners",
    "endpoint/jobs-submit",
    "endpoint/ledger",
    "rule/runner-clock-ahead",
];

#[tokio::test(flavor = "multi_thread")]
async fn bullmq_starts_and_conform_finds_what_its_analysis_says() {
    if bullmq_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let system = bullmq_system();
    let out = dir.path().join("conform");
    let args: Vec<&std::ffi::OsStr> = vec![
        "conform".as_ref(),
        "--system".as_ref(),
        system.as_os_str(),
        "--lease-ms".as_ref(),
        "1500".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ];
    let (code, said) = super::fencelab_output(&args, Duration::from_secs(300)).await;
    assert_eq!(code, Some(1), "conform judges BullMQ invalid:\n{said}");
    let (failed, passed) = (conform_cases(&said, "FAIL "), conform_cases(&said, "PASS "));
    for case in CONFORM_FAILS {
        assert!(failed.contains(case), "{case} fails on BullMQ:\n{said}");
    }
    for case in CONFORM_PASSES {
        let slow = failed.contains(case) && only_slow_machine_findings(line(&said, case));
        assert!(passed.contains(case) || slow, "{case} passes on BullMQ:\n{said}");
    }
    let bad_input: Vec<&String> = failed.iter().filter(|case| case.starts_with("input/")).collect();
    assert!(bad_input.is_empty(), "the adapter answers every bad input as documented: {bad_input:?}\n{said}");
}

/// Every (checker, kind) the analysis explains for `--nemesis all` on the default (fenced)
/// target, each seen in its measured runs. Anything else is a finding the analysis does not
/// name, or an adapter bug.
const EXPLAINED: [(&str, &str); 11] = [
    ("explicit-uncertainty", "expiry-not-uncertain"),
    ("explicit-uncertainty", "reclaimed-without-reconcile"),
    ("rules-model", "expiry-not-uncertain"),
    ("rules-model", "expiry-not-recorded"),
    ("rules-model", "refused-wrongly"),
    ("rules-model", "capability-accepted-wrongly"),
    ("terminal-stability", "duplicate-not-acknowledged"),
    ("terminal-stability", "conflict-not-recorded"),
    ("fence-order", "report-claim-mismatch"),
    ("clock-authority", "runner-clock-trusted"),
    ("stale-side-effect", "step-after-lease"),
];

/// What every run under `--nemesis all` shows: BullMQ moves a stalled job back to its queue.
const REQUIRED: [(&str, &str); 2] =
    [("explicit-uncertainty", "expiry-not-uncertain"), ("explicit-uncertainty", "reclaimed-without-reconcile")];

/// Seeds tried until one run shows every kind of [`REQUIRED`]; each run must stay within
/// [`EXPLAINED`].
const SEEDS: [&str; 3] = ["1", "2", "3"];

/// Every (checker, kind) of a run folder's anomalies.
pub fn kinds(folder: &Path) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(folder.join("results.json")).unwrap();
    let doc = results::read_results(&text).unwrap();
    doc.checkers
        .iter()
        .flat_map(|checker| checker.anomalies.iter().map(|anomaly| (anomaly.checker.clone(), anomaly.kind.clone())))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bullmq_run_finds_only_what_its_analysis_explains() {
    if bullmq_missing() {
        return;
    }
    let system = bullmq_system();
    let system = system.to_str().unwrap();
    let explained: BTreeSet<(String, String)> =
        EXPLAINED.iter().map(|(checker, kind)| (checker.to_string(), kind.to_string())).collect();
    let mut said = Vec::new();
    for seed in SEEDS {
        let finished = run(&["--system", system, "--seed", seed, "--time-limit", "30", "--nemesis", "all"]).await;
        assert_eq!(
            finished.code,
            Some(1),
            "BullMQ under every fault is invalid:\n{}\n{}",
            finished.stdout,
            finished.stderr
        );
        let found = kinds(&finished.folder());
        let unexplained: Vec<&(String, String)> = found.difference(&explained).collect();
        assert!(
            unexplained.is_empty(),
            "seed {seed}: kinds the analysis does not explain: {unexplained:?}\n{}",
            finished.stdout
        );
        let required = REQUIRED.iter().all(|(checker, kind)| found.contains(&(checker.to_string(), kind.to_string())));
        if required {
            return;
        }
        said.push(format!("seed {seed}: {found:?}"));
    }
    panic!("no seed of {SEEDS:?} showed BullMQ requeueing a stalled job:\n{}", said.join("\n"));
}

/// What is left with the user-side patterns (`--variant lock-checked-capability` on the fenced
/// target): BullMQ's own findings, the requeue, the lapsed lock no record holds until the
/// stall check runs, and the refused retries, and nothing else.
const PATTERNS_LEAVE: [(&str, &str); 7] = [
    ("explicit-uncertainty", "expiry-not-uncertain"),
    ("explicit-uncertainty", "reclaimed-without-reconcile"),
    ("rules-model", "expiry-not-uncertain"),
    ("rules-model", "expiry-not-recorded"),
    ("rules-model", "refused-wrongly"),
    ("terminal-stability", "duplicate-not-acknowledged"),
    ("terminal-stability", "conflict-not-recorded"),
];

#[tokio::test(flavor = "multi_thread")]
async fn with_the_lock_checked_capability_only_bullmqs_own_findings_remain() {
    if bullmq_missing() {
        return;
    }
    let system = bullmq_system();
    let system = system.to_str().unwrap();
    let args = ["--system", system, "--variant", "lock-checked-capability", "--seed", "2", "--time-limit", "30"];
    let finished = run(&[&args[..], &["--nemesis", "all"]].concat()).await;
    assert_eq!(finished.code, Some(1), "BullMQ still requeues:\n{}\n{}", finished.stdout, finished.stderr);
    let left: BTreeSet<(String, String)> =
        PATTERNS_LEAVE.iter().map(|(checker, kind)| (checker.to_string(), kind.to_string())).collect();
    let found = kinds(&finished.folder());
    let more: Vec<&(String, String)> = found.difference(&left).collect();
    assert!(more.is_empty(), "the patterns leave only BullMQ's own findings, not {more:?}\n{}", finished.stdout);
    let requeued = ("explicit-uncertainty".to_string(), "reclaimed-without-reconcile".to_string());
    assert!(found.contains(&requeued), "{found:?}");
}

/// `fencelab shrink` of a run against a system file shrinks against that system: the run's
/// config.json holds the file under the system's info, which the run config read back as
/// none, and every try ran the lab instead (which keeps the rule, so nothing reproduced).
#[tokio::test(flavor = "multi_thread")]
async fn shrinking_a_bullmq_run_replays_it_on_bullmq() {
    if bullmq_missing() {
        return;
    }
    let system = bullmq_system();
    let system = system.to_str().unwrap();
    let (finished, _) = super::run::caught(&["--system", system, "--time-limit", "15", "--nemesis", "kill"]).await;
    let folder = finished.folder();
    let work = folder.join("shrink");
    let args: Vec<&std::ffi::OsStr> = vec![
        "shrink".as_ref(),
        folder.as_os_str(),
        "--checker".as_ref(),
        "explicit-uncertainty".as_ref(),
        "--tries".as_ref(),
        "6".as_ref(),
        "--confirm".as_ref(),
        "1".as_ref(),
    ];
    let (code, said) = super::fencelab_output(&args, Duration::from_secs(600)).await;
    assert_eq!(code, Some(0), "the requeue reproduces as a scenario on BullMQ:\n{said}");
    assert!(said.contains("--system") && said.contains("systems/bullmq/system.toml"), "{said}");
    let tried = std::fs::read_to_string(work.join("shrink.json")).unwrap();
    assert!(tried.contains("\"reproduced\": true"), "{tried}");
}

/// The adapter's own tests (`systems/bullmq/test/`, `node --test`): a BullMQ decision whose
/// ledger entry a SIGKILL of the adapter lost is recorded when the adapter starts again, before
/// a stall found after the restart; and a report queued behind the claim that superseded its
/// attempt is refused as superseded.
#[tokio::test(flavor = "multi_thread")]
async fn the_adapters_node_tests_pass() {
    if bullmq_missing() {
        return;
    }
    let folder = bullmq_system().with_file_name("test");
    let mut command = tokio::process::Command::new("node");
    command.arg("--test").arg(&folder).kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("node --test ends within 180 s")
        .expect("node runs");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "node --test {}:\n{said}", folder.display());
    let declared: usize = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap().matches("\ntest(").count())
        .sum();
    assert!(declared >= 3, "the adapter's test files declare their tests: {declared}");
    assert!(
        said.contains(&format!("# pass {declared}\n")) && said.contains("# fail 0"),
        "every one of the {declared} tests passes:\n{said}"
    );
}

/// Only BullMQ's requeue is a slow-machine finding: a late report accepted, a finding of
/// another kind beside it, or no finding at all is not.
#[test]
fn slow_machine_findings_are_only_bullmqs_requeue() {
    let requeue = "FAIL  rule/runner-clock-ahead   rules model: c21.j1-a1 (fence 3)'s expiry was recorded as `requeued`: a lapsed lease is not a stopped process, the job is uncertain";
    assert!(only_slow_machine_findings(requeue));
    assert!(only_slow_machine_findings(&format!("    {requeue}")));
    let late = "FAIL  rule/runner-clock-ahead   rules model: c21.j1-a1 (fence 3)'s result was accepted; the rules decide rejected (expired)";
    assert!(!only_slow_machine_findings(late), "BullMQ's lock lapses on time: a late acceptance is the adapter's");
    let both = format!(
        "{requeue}; rules model: c21.j1-a1 (fence 3)'s result was accepted; the rules decide rejected (expired)"
    );
    assert!(!only_slow_machine_findings(&both));
    let other = "FAIL  rule/runner-clock-ahead   a success inside the renewed lease, observed 30 days ahead, was rejected (stale_fence)";
    assert!(!only_slow_machine_findings(other));
    assert!(!only_slow_machine_findings("FAIL  rule/runner-clock-ahead"));
}
