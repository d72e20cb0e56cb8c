//! The `fencelab` binary end to end: the standalone Toxiproxy server, and the lab's runner
//! links going through the embedded proxy so that faults are real TCP faults.

mod airflow;
mod architecture;
mod audit;
#[path = "../../../results/tests/support/browser.rs"]
mod browser;
mod buildbot;
mod bullmq;
mod check;
mod circles;
mod conform;
mod containers;
mod diff;
mod evidence;
mod import;
mod links;
mod liveness;
mod matrix;
mod observed;
mod pgboss;
mod replicas;
mod report;
mod run;
mod runner_rules;
mod scenario;
mod second;
mod shrink;
mod suite;
mod system;
mod tidy;
mod trends;
mod vocabulary;

use std::path::Path;
use std::time::Duration;

use lab::demo::{LabOptions, LocalLab};
use protocol::*;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Runs `fencelab ARGS...` to its end (bounded by `bound`): exit code, stdout and stderr.
pub async fn fencelab_output(args: &[&std::ffi::OsStr], bound: Duration) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
    let output = tokio::time::timeout(bound, command.output()).await.expect("fencelab ends in time").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

/// Every wait on a condition here (generous: the machine may be loaded).
const WAIT_MAX: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn fencelab_toxiproxy_serves_the_api_and_stops_on_sigint() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
        .args(["toxiproxy", "--listen", "127.0.0.1:0", "--seed", "7"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT_MAX, lines.next_line()).await.unwrap().unwrap().unwrap();
    let url = line.split_whitespace().last().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    let client = proxy::Client::new(&url).unwrap();
    assert!(!client.version().await.unwrap().is_empty());
    client.create_proxy("p", "127.0.0.1:0", "127.0.0.1:9").await.unwrap();
    assert_eq!(client.proxies().await.unwrap().len(), 1);
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(WAIT_MAX, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fencelab_rejects_unknown_commands_with_254() {
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
        .arg("no-such-command")
        .output()
        .await
        .unwrap()
        .status;
    assert_eq!(status.code(), Some(254));
}

/// A runner whose control-plane link is cut (the proxy disabled) loses its lease on the
/// server's clock; the job is named uncertain, not requeued, and no other job on its key runs.
#[tokio::test(flavor = "multi_thread")]
async fn cut_runner_link_makes_the_job_uncertain_not_requeued() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = LabOptions::new(Path::new(&lab_binary()), dir.path());
    options.lease_ms = 800;
    let mut lab = LocalLab::start(options).await.unwrap();
    let server = proxy::start("127.0.0.1:0".parse().unwrap(), 1).await.unwrap();
    let client = proxy::Client::new(&server.url()).unwrap();
    let upstream = lab.control_url().trim_start_matches("http://").to_string();
    let link = client.create_proxy("r1-control", "127.0.0.1:0", &upstream).await.unwrap();
    let control_via_proxy = format!("http://{}", link.listen_addr().unwrap());
    let target_url = lab.target_url();
    lab.spawn_runner_at("r1", &control_via_proxy, &target_url, &["--request-timeout-ms=300".into()]).await.unwrap();
    lab.submit("j1", "prod", JobSpec { steps: 100, step_ms: 50 }).await.unwrap();
    lab.submit("j2", "prod", JobSpec { steps: 1, step_ms: 1 }).await.unwrap();
    lab.wait_job("j1", WAIT_MAX, |view| view.state == JobState::Running).await.unwrap();
    client.set_enabled("r1-control", false).await.unwrap();
    let view = lab.wait_job("j1", WAIT_MAX, |view| view.state == JobState::Uncertain).await.unwrap();
    assert_eq!(view.attempts.len(), 1);
    client.set_enabled("r1-control", true).await.unwrap();
    let late = lab
        .wait_job("j1", WAIT_MAX, |view| view.ledger.iter().any(|entry| entry.kind == history::Op::Result))
        .await
        .unwrap();
    let result = late.ledger.iter().find(|entry| entry.kind == history::Op::Result).unwrap();
    assert_eq!(
        (result.decision, result.recorded_as.map(|word| word.as_str())),
        (Some(history::Decision::Rejected), Some("late_observation"))
    );
    assert_eq!(lab.operator.job("j2").await.unwrap().state, JobState::Queued, "prod stays held while j1 is uncertain");
    server.shutdown().await;
    lab.shutdown().await;
}

/// The lab binary, built by cargo next to this crate's binary.
/// The lab's system file with `role`'s process (`target`, `control-plane`) under
/// `timeout -s KILL seconds`, written into `dir`: a system whose part dies during a run.
pub fn dying_lab(dir: &Path, role: &str, seconds: u32) -> std::path::PathBuf {
    let lab = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/lab.toml")).unwrap();
    let command = format!("\"{{fencelab}}\", \"lab\", \"{role}\"");
    let wrapped = format!("\"timeout\", \"-s\", \"KILL\", \"{seconds}\", {command}");
    let dying = lab.replacen(&command, &wrapped, 1);
    assert_ne!(dying, lab, "the {role}'s command was found in systems/lab.toml");
    let system = dir.join(format!("dying-{role}.toml"));
    std::fs::write(&system, dying).unwrap();
    system
}

pub fn lab_binary() -> String {
    let ours = Path::new(env!("CARGO_BIN_EXE_fencelab"));
    let lab = ours.with_file_name("fencelab-lab");
    assert!(lab.exists(), "{} is not built: run the tests with `cargo nextest run --workspace`", lab.display());
    lab.to_string_lossy().into_owned()
}
