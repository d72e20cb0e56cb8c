//! System files end to end: the lab through `systems/lab.toml` gives the same verdicts as
//! the default; a bad system file, a program that is not there, a server that never becomes
//! ready or dies first each exit 254 or 255 with a message naming the file, the line and the
//! role, and leave no process behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::run::{leftovers_within, run};

pub fn lab_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/lab.toml")
}

/// Each checker's verdict word in a run folder's results.json.
fn verdicts(folder: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(folder.join("results.json")).unwrap();
    let results: serde_json::Value = serde_json::from_str(&text).unwrap();
    results["checkers"]
        .as_array()
        .expect("results.json lists its checkers")
        .iter()
        .map(|checker| {
            (checker["checker"].as_str().unwrap().to_string(), checker["verdict"].as_str().unwrap().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lab_file_and_the_default_give_the_same_verdicts() {
    let args = ["--seed", "5", "--time-limit", "6", "--nemesis", "kill,duplicate-results,restart-control-plane"];
    let lab = lab_file();
    let with_file: Vec<&str> = args.iter().copied().chain(["--system", lab.to_str().unwrap()]).collect();
    let (default, explicit) = tokio::join!(run(&args), run(&with_file));
    assert_eq!(default.code, Some(0), "{}", default.stderr);
    assert_eq!(explicit.code, Some(0), "{}", explicit.stderr);
    let expected = verdicts(&default.folder());
    assert_eq!(expected.len(), checkers::names().len());
    assert_eq!(verdicts(&explicit.folder()), expected);
    let config = std::fs::read_to_string(explicit.folder().join("config.json")).unwrap();
    assert!(config.contains("systems/lab.toml"), "config.json names the system file: {config}");
    assert!(explicit.stdout.contains("--system"), "the repeat command names the system file");
    let schedule = |folder: PathBuf| std::fs::read_to_string(folder.join("schedule.json")).unwrap();
    assert_eq!(schedule(default.folder()), schedule(explicit.folder()), "same seed, same schedule");
}

/// A system file made from the lab's, with `edit` applied to its text.
/// `file:@TEXT` as `file:N`, N the line of `text` where TEXT first appears; other
/// needles as they are.
pub fn at_line(text: &str, needle: &str) -> String {
    let Some((file, marker)) = needle.split_once(":@") else { return needle.to_string() };
    let line = text.lines().position(|line| line.contains(marker)).expect("the marker is in the file") + 1;
    format!("{file}:{line}")
}

fn edited_lab(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(lab_file()).unwrap();
    let path = dir.join("system.toml");
    std::fs::write(&path, edit(text)).unwrap();
    path
}

struct Case {
    name: &'static str,
    edit: fn(String) -> String,
    variant: Option<&'static str>,
    code: i32,
    /// Every one of these is in the message.
    says: &'static [&'static str],
}

const CONTROL_COMMAND: &str = "command = [\n  \"{fencelab}\", \"lab\", \"control-plane\"";

/// The lab's file with the control plane's command (its whole array, on line 20) replaced.
fn control_command(text: &str, command: &str) -> String {
    let start = text.find(CONTROL_COMMAND).expect("the lab's control-plane command");
    let end = start + text[start..].find("]\n").expect("the end of the array") + 1;
    format!("{}command = {command}{}", &text[..start], &text[end..])
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an unknown key",
            edit: |text| text.replacen("ready = \"listening\"", "ready = \"listening\"\nreadyy = 1", 1),
            variant: None,
            code: 254,
            says: &["system.toml:@readyy", "readyy"],
        },
        Case {
            name: "a missing role",
            edit: |text| text.replacen("[runner]", "[runnerz]", 1),
            variant: None,
            code: 254,
            says: &["system.toml", "runnerz"],
        },
        Case {
            name: "a placeholder that does not exist",
            edit: |text| text.replacen("--listen={listen}", "--listen={lisen}", 1),
            variant: None,
            code: 254,
            says: &["system.toml:@command = [", "role `control_plane`", "{lisen}"],
        },
        Case {
            name: "a variant the file does not declare",
            edit: |text| text,
            variant: Some("no-such-variant"),
            code: 254,
            says: &["system.toml", "no variant `no-such-variant`"],
        },
        Case {
            name: "a command that is not found",
            edit: |text| {
                text.replacen(CONTROL_COMMAND, "command = [\n  \"/no/such/program\", \"lab\", \"control-plane\"", 1)
            },
            variant: None,
            code: 254,
            says: &["system.toml:@command = [", "role `control_plane`", "/no/such/program"],
        },
        Case {
            name: "a server that never becomes ready",
            edit: |text| {
                control_command(
                    &text,
                    concat!(
                // A grandchild (outside PR_SET_PDEATHSIG's reach) that must go with its group.
                "[\"sh\", \"-c\", \"python3 -c 'import time; time.sleep(600)' \\\"$0\\\" & wait\", \"{data_dir}\"]",
                "\nready_ms = 1500"
            ),
                )
            },
            variant: None,
            code: 255,
            says: &["system.toml:@command = [", "role `control_plane`", "within 1500 ms"],
        },
        Case {
            name: "a server that exits before it is ready",
            edit: |text| control_command(&text, "[\"sh\", \"-c\", \"echo broken >&2; exit 3\", \"{data_dir}\"]"),
            variant: None,
            code: 255,
            says: &["system.toml:@command = [", "role `control_plane`", "exited", "broken"],
        },
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_system_file_names_file_line_and_role_and_leaves_nothing_behind() {
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let file = edited_lab(dir.path(), case.edit);
        let store = dir.path().join("store");
        let mut args = vec!["--system".to_string(), file.display().to_string(), "--time-limit".into(), "2".into()];
        if let Some(variant) = case.variant {
            args.extend(["--variant".to_string(), variant.to_string()]);
        }
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
        command.arg("run").arg("--store").arg(&store).args(&args).kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(120), command.output()).await.unwrap().unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(case.code), "{}: {said}", case.name);
        let edited = std::fs::read_to_string(&file).unwrap();
        for needle in case.says {
            let needle = at_line(&edited, needle);
            assert!(said.contains(&needle), "{}: the message says `{needle}`: {said}", case.name);
        }
        let left = leftovers_within(dir.path(), Duration::from_secs(10)).await;
        assert_eq!(left, Vec::<String>::new(), "{}: nothing is left running", case.name);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_system_lacks_is_not_run_and_never_valid() {
    let dir = tempfile::tempdir().unwrap();
    let fixed_clock = dir.path().join("fixed");
    std::fs::create_dir(&fixed_clock).unwrap();
    let fixed_clock = edited_lab(&fixed_clock, |text| {
        text.replacen("restart = true", "restart = false", 1).replacen(
            "runner_clock = [\"libfaketime\", \"offset-file\"]",
            "runner_clock = []",
            1,
        )
    });
    let no_target = dir.path().join("no-target");
    std::fs::create_dir(&no_target).unwrap();
    let no_target = edited_lab(&no_target, |text| {
        let start = text.find("[target]").unwrap();
        let end = start + text[start..].find("[runner]").unwrap();
        let variants = text.find("[variants.").unwrap();
        let without =
            format!("{}{}", &text[..start], &text[end..variants]).replacen("target = true", "target = false", 1);
        without.replacen("\"--target-url={target_url}\"", "\"--target-url=\"", 1)
    });
    let common = [
        "--seed",
        "4",
        "--time-limit",
        "8",
        "--nemesis",
        "clock-skew,restart-control-plane,kill,disconnect-during-mutation",
    ];
    let with = |file: &Path| -> Vec<String> {
        common.iter().map(|word| word.to_string()).chain(["--system".to_string(), file.display().to_string()]).collect()
    };
    let (fixed_args, no_target_args) = (with(&fixed_clock), with(&no_target));
    let fixed_args: Vec<&str> = fixed_args.iter().map(String::as_str).collect();
    let no_target_args: Vec<&str> = no_target_args.iter().map(String::as_str).collect();
    let (fixed, without) = tokio::join!(run(&fixed_args), run(&no_target_args));

    assert_eq!(fixed.code, Some(0), "{}", fixed.stderr);
    let config = std::fs::read_to_string(fixed.folder().join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["clock_control"], "fixed");
    let not_run: Vec<&str> = config["system"]["faults_not_run"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["fault"].as_str().unwrap())
        .collect();
    assert_eq!(not_run, ["clock-skew", "restart-control-plane"]);
    let schedule = std::fs::read_to_string(fixed.folder().join("schedule.json")).unwrap();
    assert!(!schedule.contains("clock-skew") && !schedule.contains("restart-control-plane"), "{schedule}");
    assert!(schedule.contains("\"kill\""), "the faults it can take still run: {schedule}");
    let results = std::fs::read_to_string(fixed.folder().join("results.json")).unwrap();
    assert!(results.contains("the system lacks `runner-clock`"), "results.json says what was not run");
    let report = std::fs::read_to_string(fixed.folder().join("report.html")).unwrap();
    assert!(report.contains("not run: the system lacks `restart`"));

    assert_eq!(without.code, Some(2), "no target: unknown, never valid\n{}", without.stdout);
    let verdict = verdicts(&without.folder());
    let side_effect = verdict.iter().find(|(name, _)| name == "stale-side-effect").unwrap();
    assert_eq!(side_effect.1, "unknown");
    assert!(verdict.iter().all(|(_, word)| word != "invalid"), "a missing target is no anomaly: {verdict:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_matrix_over_a_system_file_runs_its_variants_under_their_faults() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("matrix");
    let lab = lab_file();
    let args: Vec<&std::ffi::OsStr> = [
        "matrix",
        "--system",
        lab.to_str().unwrap(),
        "--variant",
        "requeue-on-expiry",
        "--seeds",
        "1",
        "--correct-seeds",
        "1",
        "--time-limit",
        "8",
        "--parallel",
        "2",
        "--store",
        store.to_str().unwrap(),
    ]
    .into_iter()
    .map(std::ffi::OsStr::new)
    .collect();
    let (code, said) = super::fencelab_output(&args, Duration::from_secs(300)).await;
    assert_eq!(code, Some(0), "{said}");
    let row = said.lines().find(|line| line.starts_with("requeue-on-expiry")).expect("a row for the variant");
    assert!(row.contains(" kill ") && row.contains("1/1"), "run under the variant's own faults, and caught: {row}");
    assert!(said.lines().any(|line| line.starts_with("(correct") && line.contains("0 of 1 flagged")), "{said}");
    let matrix = std::fs::read_to_string(store.join("matrix.json")).unwrap();
    assert!(
        matrix.contains("--variant requeue-on-expiry") && matrix.contains("--system"),
        "the cells' commands name both"
    );
}

/// A runner that exits on its own mid-run (here: told to stop after one job) is a worker
/// the system lost: `progress` says so (`runner-exited`), naming the runner and its status.
#[tokio::test(flavor = "multi_thread")]
async fn a_runner_that_exits_on_its_own_is_an_anomaly() {
    let dir = tempfile::tempdir().unwrap();
    let file = edited_lab(dir.path(), |text| {
        text.replacen(
            "\"--result-tries-max={result_tries_max}\",",
            "\"--result-tries-max={result_tries_max}\", \"--jobs-max=1\",",
            1,
        )
    });
    let file = file.display().to_string();
    let finished = run(&["--system", &file, "--seed", "2", "--time-limit", "4", "--nemesis", "none"]).await;
    assert_eq!(finished.code, Some(1), "{}\n{}", finished.stdout, finished.stderr);
    let results = std::fs::read_to_string(finished.folder().join("results.json")).unwrap();
    assert!(results.contains("\"runner-exited\"") && results.contains("exited on its own"), "{results}");
    // The same system without the limit: no runner exits.
    let finished = run(&["--seed", "2", "--time-limit", "4", "--nemesis", "none"]).await;
    assert_eq!(finished.code, Some(0), "{}", finished.stdout);
}
