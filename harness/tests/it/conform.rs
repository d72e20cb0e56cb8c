//! `fencelab conform` end to end: the lab passes every case and leaves no process behind;
//! each planted bug of `systems/lab.toml` fails the cases of the rule it breaks; a system
//! that lacks optional parts is answered unknown with each skipped case's reason; a bad
//! system file, an unknown variant or a bad lease exit 254 before anything starts.
//!
//! Repeat with: `cargo nextest run -p harness --test it conform`

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use conform::case::Status;
use conform::report::{self, ConformDoc};

use super::run::{leftovers_within, postgres_or_skip};
use super::system::lab_file;

/// Longest one conform run may take here (generous: the machine may be loaded).
const CONFORM_WAIT_MAX: Duration = Duration::from_secs(150);
/// The lease the tests ask for: long enough that a loaded machine still lands its reports
/// inside it.
const LEASE_MS: &str = "1500";
/// Variants conformed side by side.
const SIDE_BY_SIDE: usize = 3;

struct Conformed {
    code: Option<i32>,
    text: String,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Conformed {
    fn doc(&self) -> ConformDoc {
        report::read(&self.out.join("conform.json")).unwrap_or_else(|error| panic!("{error}\n{}", self.text))
    }

    /// The lines of cases that did not pass, and the summary.
    fn trouble(&self) -> String {
        self.text.lines().filter(|line| !line.starts_with("PASS")).collect::<Vec<_>>().join("\n")
    }

    fn status(&self, name: &str) -> Status {
        let doc = self.doc();
        let case = doc.cases.iter().find(|case| case.name == name);
        case.unwrap_or_else(|| panic!("no case {name} in conform.json")).status
    }
}

async fn conform_once(args: &[&str], dir: &Path) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.arg("conform").args(args).arg("--out").arg(dir.join("out"));
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let output = tokio::time::timeout(CONFORM_WAIT_MAX, command.output()).await.expect("conform ends in time").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

/// Runs `fencelab conform ARGS --out DIR/out` (a server whose picked port was taken before
/// it bound it is started again on another by the harness itself).
async fn conform(args: &[&str]) -> Conformed {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = conform_once(args, dir.path()).await;
    Conformed { code, text, out: dir.path().join("out"), _dir: dir }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lab_passes_every_case_and_leaves_nothing_running() {
    let conformed = conform(&["--lease-ms", LEASE_MS]).await;
    assert_eq!(conformed.code, Some(0), "{}", conformed.trouble());
    let doc = conformed.doc();
    assert_eq!((doc.counts.fail, doc.counts.skip), (0, 0), "{}", conformed.trouble());
    assert!(doc.cases.len() >= 100, "{} cases", doc.cases.len());
    let inputs = doc.cases.iter().filter(|case| case.name.starts_with("input/")).count();
    assert!(inputs >= 40, "{inputs} bad inputs");
    for case in &doc.cases {
        assert!(conformed.text.contains(&report::line(case)), "stdout has the line of {}", case.name);
        assert!(!case.evidence.is_empty(), "{} has evidence", case.name);
    }
    let junit = std::fs::read_to_string(conformed.out.join("junit.xml")).unwrap();
    assert_eq!(junit.matches("<testcase ").count(), doc.cases.len());
    assert!(junit.contains("failures=\"0\"") && junit.contains("skipped=\"0\""), "{junit}");
    assert_eq!(leftovers_within(&conformed.out, Duration::from_secs(5)).await, Vec::<String>::new());
}

/// Each planted bug and the cases that must fail under it: the cases of the rule it breaks.
const CAUGHT: &[(&str, &[&str])] = &[
    ("accept-stale-result", &["rule/stale-completion", "rule/reconcile-supersedes", "model/rules-replay"]),
    ("heartbeat-revives-expired", &["rule/heartbeat-after-expiry", "rule/runner-clock-behind", "model/rules-replay"]),
    ("requeue-on-expiry", &["rule/no-requeue-on-expiry", "rule/stale-completion", "model/rules-replay"]),
    ("trust-runner-clock", &["rule/runner-clock-ahead", "rule/runner-clock-behind", "model/rules-replay"]),
    ("overwrite-terminal-result", &["rule/conflicting-result", "race/results", "model/rules-replay"]),
    (
        "unscoped-fence",
        &["rule/fence-across-jobs", "rule/fence-across-runners", "rule/fence-across-projects", "model/rules-replay"],
    ),
    ("blind-retry-on-zero-rows", &["rule/stale-completion", "rule/heartbeat-after-expiry", "model/rules-replay"]),
    ("ack-before-commit", &["restart/acknowledged-survives-kill-9"]),
    ("target-ignores-fence", &["target/fenced"]),
    ("target-fences-per-runner", &["target/fenced"]),
    // Both target cases show an expired capability 2 ms past its expiry; either catches it
    // unless that capability expired in the last milliseconds of a second.
    ("target-expiry-in-whole-seconds", &[]),
    ("refuse-duplicate-result", &["rule/duplicate-result", "race/results", "model/rules-replay"]),
    ("self-reconcile", &["rule/no-requeue-on-expiry", "rule/stale-completion", "model/rules-replay"]),
    ("expiry-leaves-job-running", &["rule/no-requeue-on-expiry", "rule/stale-completion", "model/rules-replay"]),
    ("expire-early", &["rule/expiry-on-server-clock", "model/rules-replay"]),
    ("target-refuses-current-fence", &["target/fenced", "target/steps"]),
    ("capability-outlives-lease", &["endpoint/capability"]),
    ("unrecorded-late-result", &["rule/stale-completion", "rule/reconcile-supersedes", "rule/fence-across-jobs"]),
    ("accept-borrowed-claim", &["rule/fence-across-runners", "model/rules-replay"]),
    (
        "lease-judged-by-sweeper",
        &[
            "window/heartbeat-at-lease-end",
            "window/capability-at-lease-end",
            "window/result-at-lease-end",
            "model/rules-replay",
        ],
    ),
    (
        "trust-named-runner",
        &["input/claim-as-other-runner", "input/heartbeat-as-other-runner", "input/result-as-other-runner"],
    ),
    // Each window case aims its tries at the lease's end millisecond; a heartbeat or result
    // received there is accepted, which the rules' replay refuses wherever a try landed.
    ("lease-end-inclusive", &["model/rules-replay"]),
    ("duplicate-ack-unrecorded", &["rule/duplicate-result"]),
    (
        "refusal-unrecorded",
        &["rule/stale-completion", "rule/reconcile-supersedes", "rule/fence-across-jobs", "rule/fence-across-runners"],
    ),
    (
        "refusal-drops-expiries",
        &[
            "window/heartbeat-at-lease-end",
            "window/capability-at-lease-end",
            "window/result-at-lease-end",
            "model/rules-replay",
        ],
    ),
];

/// The planted bugs no conformance case can catch, and why: each needs a fault (its
/// `nemesis` in `systems/lab.toml`), which conform does not inject; the matrix on
/// PostgreSQL with replicas catches them.
const FAULTS_ONLY: &[(&str, &str)] = &[
    ("replica-clock", "judged on a replica's own clock, which is the database's until replica-clock-skew moves it"),
    ("claim-without-lock", "two claims interleave only under concurrency slowed by db-link latency"),
    ("sweeper-without-lock", "the sweeper races a heartbeat only when a transaction spans a lease's end"),
    ("retry-lost-commit", "a COMMIT's answer is lost only when db-link cuts it"),
    ("claim-ledger-in-second-transaction", "a claim's second transaction fails only when db-link cuts it"),
];

/// The planted bugs of the runner: conform plays the runners itself and never runs the
/// system's own, so none of its cases can see them; `runner-contract` on a run's runner logs
/// catches them (`fencelab matrix`).
const RUNNER_ONLY: &[&str] = &[
    "deadline-from-answer",
    "deadline-from-server-lease",
    "wall-clock-deadline",
    "unanswered-heartbeat-renews",
    "step-with-held-capability",
    "resend-step-on-lost-answer",
];

#[tokio::test(flavor = "multi_thread")]
async fn the_postgresql_lab_passes_every_case() {
    if !postgres_or_skip() {
        return;
    }
    let conformed = conform(&["--db", "postgres", "--lease-ms", LEASE_MS]).await;
    assert_eq!(conformed.code, Some(0), "{}", conformed.trouble());
    let doc = conformed.doc();
    assert_eq!((doc.counts.fail, doc.counts.skip), (0, 0), "{}", conformed.trouble());
    assert!(doc.cases.len() >= 100, "{} cases", doc.cases.len());
    assert!(!conformed.out.join("system").join("control_plane").join("control.sqlite").exists(), "no SQLite store");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_planted_bug_fails_the_cases_of_its_rule() {
    let declared: Vec<String> = system::SystemFile::lab().variants.into_keys().collect();
    let caught = CAUGHT.iter().map(|(variant, _)| variant.to_string());
    let faults_only = FAULTS_ONLY.iter().map(|(variant, _)| variant.to_string());
    let runner_only = RUNNER_ONLY.iter().map(|variant| variant.to_string());
    let mut listed: Vec<String> = caught.chain(faults_only).chain(runner_only).collect();
    listed.sort();
    assert_eq!(listed, declared, "every variant of systems/lab.toml has its row");
    for name in RUNNER_ONLY {
        let bug: lab::bugs::Bug = name.parse().unwrap();
        assert_eq!(bug.home(), lab::bugs::Home::Runner, "{name} is a bug of the runner");
    }
    let lab = system::SystemFile::lab();
    for (name, _) in FAULTS_ONLY {
        let variant = &lab.variants[*name];
        assert!(variant.nemesis.is_some(), "{name} names the faults that expose it");
        assert_eq!(variant.db, Some(runfolder::config::Db::Postgres), "{name} needs PostgreSQL");
    }
    let mut waiting = CAUGHT.iter();
    let mut running = tokio::task::JoinSet::new();
    let mut failures = Vec::new();
    loop {
        while running.len() < SIDE_BY_SIDE {
            let Some((variant, cases)) = waiting.next() else { break };
            running
                .spawn(async move { (variant, cases, conform(&["--variant", variant, "--lease-ms", LEASE_MS]).await) });
        }
        let Some(joined) = running.join_next().await else { break };
        let (variant, cases, conformed) = joined.unwrap();
        if conformed.code != Some(1) {
            failures.push(format!("{variant}: exit {:?}, not 1:\n{}", conformed.code, conformed.trouble()));
            continue;
        }
        for case in *cases {
            let status = conformed.status(case);
            if status != Status::Fail {
                failures.push(format!("{variant}: {case} is {status:?}, not Fail:\n{}", conformed.trouble()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The lab's file with `edit` applied, written into `dir`.
fn edited_lab(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let path = dir.join("system.toml");
    std::fs::write(&path, edit(std::fs::read_to_string(lab_file()).unwrap())).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_system_without_optional_parts_is_unknown_with_each_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = edited_lab(dir.path(), |text| {
        text.replace("restart = true", "restart = false")
            .replace("ledger = true", "ledger = false")
            .replace("\"--mode={target_mode}\"", "\"--mode=fenced\"")
    });
    let conformed = conform(&["--system", file.to_str().unwrap(), "--lease-ms", LEASE_MS]).await;
    assert_eq!(conformed.code, Some(2), "{}", conformed.trouble());
    let doc = conformed.doc();
    assert_eq!(doc.counts.fail, 0, "{}", conformed.trouble());
    for (name, reason) in [
        ("restart/acknowledged-survives-kill-9", "`provides.restart = false`"),
        ("model/rules-replay", "`provides.ledger = false`"),
        ("rule/stale-completion", "`provides.ledger = false`"),
        ("endpoint/ledger", "`provides.ledger = false`"),
        ("input/runner-reads-ledger", "`provides.ledger = false`"),
        ("target/fenced", "{target_mode}"),
        ("target/unfenced", "{target_mode}"),
    ] {
        let case = doc.cases.iter().find(|case| case.name == name).unwrap();
        assert_eq!(case.status, Status::Skip, "{name}: {}", case.evidence);
        assert!(case.evidence.contains(reason), "{name}'s reason: {}", case.evidence);
    }
    assert_eq!(conformed.status("rule/no-requeue-on-expiry"), Status::Pass, "what needs no missing part still runs");
    let junit = std::fs::read_to_string(conformed.out.join("junit.xml")).unwrap();
    assert!(junit.contains("<skipped message=\"the system file says `provides.restart = false`\"/>"), "{junit}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_arguments_exit_254_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let unknown_key =
        edited_lab(dir.path(), |text| text.replacen("ready = \"listening\"", "ready = \"listening\"\nreadyy = 1", 1));
    let unknown_key = unknown_key.to_str().unwrap();
    let missing = dir.path().join("absent.toml");
    for (args, says) in [
        (vec!["--system", unknown_key], vec!["system.toml:@readyy", "readyy"]),
        (vec!["--system", missing.to_str().unwrap()], vec!["absent.toml", "cannot read the system file"]),
        (vec!["--variant", "no-such-bug"], vec!["no variant `no-such-bug`", "accept-stale-result"]),
        (vec!["--lease-ms", "5"], vec!["--lease-ms must be 100..=10000"]),
    ] {
        let conformed = conform(&args).await;
        assert_eq!(conformed.code, Some(254), "{args:?}: {}", conformed.text);
        let edited = std::fs::read_to_string(unknown_key).unwrap();
        for said in says {
            let said = crate::system::at_line(&edited, said);
            assert!(conformed.text.contains(&said), "{args:?} says {said:?}: {}", conformed.text);
        }
        assert!(!conformed.out.join("conform.json").exists(), "{args:?}: nothing was run");
    }
    let used = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(used.path().join("out/system")).unwrap();
    let (code, text) = conform_once(&[], used.path()).await;
    assert_eq!(code, Some(254), "an --out that is not empty: {text}");
    assert!(text.contains("is not empty"), "{text}");
}

/// `--store` as every other command takes it: each session gets a folder of its own in
/// `STORE/conform/`, so a store already in use is no reason to refuse (a control plane that
/// cannot start ends the session quickly, its folder written).
#[tokio::test(flavor = "multi_thread")]
async fn each_session_gets_a_folder_of_its_own_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let broken =
        edited_lab(dir.path(), |text| text.replacen("\"{fencelab}\", \"lab\", \"control-plane\",", "\"false\",", 1));
    let store = dir.path().join("store");
    for session in 1..=2 {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
        command.args(["conform", "--system", broken.to_str().unwrap(), "--store", store.to_str().unwrap()]);
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let output = tokio::time::timeout(CONFORM_WAIT_MAX, command.output()).await.expect("ends in time").unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.status.code(), Some(255), "session {session}: the control plane cannot start: {text}");
        assert!(!text.contains("is not empty"), "{text}");
        let sessions = std::fs::read_dir(store.join("conform")).unwrap().count();
        assert_eq!(sessions, session, "a folder per session in {}", store.display());
    }
    let both = [("--store", "s"), ("--out", "o")]
        .map(|(flag, name)| [flag.to_string(), dir.path().join(name).display().to_string()]);
    let output =
        std::process::Command::new(env!("CARGO_BIN_EXE_fencelab")).arg("conform").args(both.concat()).output().unwrap();
    assert_eq!(output.status.code(), Some(254), "--store and --out together are refused");
}
