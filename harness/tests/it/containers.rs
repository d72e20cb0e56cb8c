//! The lab as containers (`systems/lab-containers.toml`, images built from this build's
//! `fencelab` by `fencelab image build`): containers started, faulted (kill, pause, restart,
//! clock skew) and stopped with none left after a normal end, a Ctrl-C, and a SIGKILL
//! followed by the next start; a missing image, a daemon that does not answer and a
//! container that exits before it is ready each give a clear error and leave nothing.
//! Without a Docker daemon these tests print `SKIPPED` (and fail under
//! `FENCELAB_REQUIRE_ALL=1`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use history::{EventType, Op, Process};
use serde_json::json;

use super::run::{fault, Finished};

/// The images these tests build, apart from the user's `:local` ones.
const LAB_IMAGE: &str = "fencelab-lab:test";
const TOXIPROXY_IMAGE: &str = "fencelab-toxiproxy:test";
/// Longest a test run may take (generous: the machine may be loaded).
const RUN_WAIT_MAX: Duration = Duration::from_secs(240);

/// Whether Docker is missing (the test then returns after saying so).
fn skipped() -> bool {
    let Some(why) = system::container::unavailable() else { return false };
    eprintln!("SKIPPED: {why}");
    let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
    assert!(!require_all, "no Docker daemon answers, and FENCELAB_REQUIRE_ALL=1: {why}");
    true
}

/// Builds the test images from this build's binary (skipped when up to date).
async fn images() {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.args(["image", "build", "--tag", LAB_IMAGE, "--toxiproxy-tag", TOXIPROXY_IMAGE]).kill_on_drop(true);
    let output = tokio::time::timeout(RUN_WAIT_MAX, command.output()).await.expect("the build ends in time").unwrap();
    assert!(
        output.status.success(),
        "fencelab image build --tag {LAB_IMAGE} --toxiproxy-tag {TOXIPROXY_IMAGE}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `systems/lab-containers.toml` on the test image, with `edit` applied, in `dir`.
fn system_file(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let lab = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systems/lab-containers.toml");
    let text = std::fs::read_to_string(lab).unwrap().replace("fencelab-lab:local", LAB_IMAGE);
    let path = dir.join("lab-containers.toml");
    std::fs::write(&path, edit(text)).unwrap();
    path
}

fn fencelab(store: &Path, args: &[String]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
    command.args(["run", "--test-name", "run", "--store"]).arg(store).args(args);
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    command
}

/// Runs `fencelab run ARGS` to its end in a fresh store.
async fn run(args: &[String]) -> Finished {
    let store = tempfile::tempdir().unwrap();
    let output =
        tokio::time::timeout(RUN_WAIT_MAX, fencelab(store.path(), args).output()).await.expect("ends in time").unwrap();
    Finished {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        store,
    }
}

/// The run folders under a store (`STORE/run/*`).
fn folders(store: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(store.join("run"))
        .map(|dir| dir.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default()
}

/// How many containers run folder `folder` has (any state).
async fn containers_of(folder: &Path) -> usize {
    system::container::of_run(folder).await.expect("the daemon lists containers").len()
}

/// Waits (bounded) until `folder` has no container; how many are left.
async fn left_within(folder: &Path, bound: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let left = containers_of(folder).await;
        if left == 0 || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| word.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn containers_are_started_faulted_and_stopped_leaving_none() {
    if skipped() {
        return;
    }
    images().await;
    let dir = tempfile::tempdir().unwrap();
    let system = system_file(dir.path(), |text| text);
    let schedule = dir.path().join("schedule.json");
    // A fault on a runner starts once its runner holds a claim, so on a loaded machine, where
    // the containers claim late, faults scheduled apart start together: each runner has one
    // fault (a killed runner cannot be paused; a paused one sends nothing while skewed), and
    // the control plane's restart comes first (the faults on runners wait for a claim, so for
    // the control plane to be back).
    let faults = vec![
        fault("restart-control-plane", None, 1_000, 300, json!({"how": "restart-control"})),
        fault("clock-skew", Some(0), 1_500, 1_500, json!({"how": "static-skew", "offset_ms": 90_000})),
        fault("delayed-heartbeats", Some(1), 1_500, 1_200, json!({"how": "pause"})),
        fault("kill", Some(2), 1_500, 1_200, json!({"how": "kill-runner"})),
    ];
    std::fs::write(&schedule, serde_json::to_vec(&faults).unwrap()).unwrap();
    let mut args = words(&["--seed", "1", "--time-limit", "8", "--runners", "3", "--keys", "3", "--rate", "4"]);
    // A fault on a runner waits up to two leases for it to hold a claim: with a 2-s lease a
    // loaded machine's slow container starts still leave r1 a claim to skew inside the run.
    args.extend(words(&["--lease-ms", "2000", "--recovery-limit", "60", "--nemesis", "all"]));
    args.extend(["--system".to_string(), system.display().to_string()]);
    args.extend(["--schedule".to_string(), schedule.display().to_string()]);
    let repeat = format!("fencelab run {}", args.join(" "));
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "{repeat}\n{}\n{}", finished.stdout, finished.stderr);
    let events = finished.history();
    for f in [Op::DelayedHeartbeats, Op::Kill, Op::ClockSkew, Op::RestartControlPlane] {
        let took = events.iter().any(|event| {
            event.process == Process::NEMESIS
                && event.f == f
                && event.kind == EventType::Ok
                && event.value.as_ref().is_some_and(|value| value["effective"] == json!(true))
        });
        let tries: Vec<String> = events
            .iter()
            .filter(|event| event.process == Process::NEMESIS && event.f == f)
            .map(|event| {
                format!("{} ms {:?} {:?} {:?}", event.time_ns / 1_000_000, event.kind, event.value, event.reason)
            })
            .collect();
        assert!(took, "{f:?} took effect on the containers: {repeat}\n{tries:#?}\n{}", finished.stdout);
    }
    let skewed = events.iter().any(|event| {
        event.runner.as_deref() == Some("r1")
            && event.observed_ms.zip(event.received_ms).is_some_and(|(seen, got)| seen - got > 60_000)
    });
    let seen: Vec<String> = events
        .iter()
        .filter(|event| {
            event.process == Process::NEMESIS
                || (event.runner.as_deref() == Some("r1") && event.kind == EventType::Ledger)
        })
        .map(|event| {
            let ahead_ms = event.observed_ms.zip(event.received_ms).map(|(seen, got)| seen - got);
            format!(
                "{} ms {} {:?} {:?} ahead_ms={ahead_ms:?}",
                event.time_ns / 1_000_000,
                event.process,
                event.kind,
                event.f
            )
        })
        .collect();
    assert!(skewed, "libfaketime, mounted into r1's container, moved its clock: {repeat}\n{seen:#?}");
    let folder = finished.folder();
    let config = std::fs::read_to_string(folder.join("config.json")).unwrap();
    assert!(config.contains("libfaketime-mounted"), "config.json says how clocks were moved: {config}");
    for log in ["control.log", "target.log", "runner-r1.log", "runner-r2.log", "runner-r3.log"] {
        assert!(folder.join("lab").join(log).exists(), "{log} is in the run folder: {repeat}");
    }
    assert_eq!(left_within(&folder, Duration::from_secs(10)).await, 0, "no container is left: {repeat}");
}

/// Starts a long container run and waits until its chaos phase has begun.
async fn started(store: &Path, system: &Path) -> (tokio::process::Child, PathBuf, String) {
    let mut args = words(&["--seed", "3", "--time-limit", "60", "--runners", "2", "--nemesis", "reconnects"]);
    args.extend(["--system".to_string(), system.display().to_string()]);
    let repeat = format!("fencelab run --store {} {}", store.display(), args.join(" "));
    let mut child = fencelab(store, &args).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let going = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("[chaos]") {
                return;
            }
        }
    };
    tokio::time::timeout(RUN_WAIT_MAX, going).await.unwrap_or_else(|_| panic!("the run gets going: {repeat}"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let folder = folders(store).pop().expect("a run folder");
    assert_eq!(containers_of(&folder).await, 4, "control plane, target, 2 runners: {repeat}");
    (child, folder, repeat)
}

fn signal(child: &tokio::process::Child, signal: i32) {
    // SAFETY: kill(2) on the child we started.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, signal) }, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_removes_every_container() {
    if skipped() {
        return;
    }
    images().await;
    let dir = tempfile::tempdir().unwrap();
    let system = system_file(dir.path(), |text| text);
    let (mut child, folder, repeat) = started(&dir.path().join("store"), &system).await;
    signal(&child, libc::SIGINT);
    let status = tokio::time::timeout(RUN_WAIT_MAX, child.wait()).await.expect("the harness ends").unwrap();
    assert_eq!(status.code(), Some(2), "an interrupted run is incomplete: {repeat}");
    assert_eq!(left_within(&folder, Duration::from_secs(10)).await, 0, "no container is left: {repeat}");
}

#[tokio::test(flavor = "multi_thread")]
async fn after_sigkill_the_next_start_removes_the_containers_and_a_missing_image_is_named() {
    if skipped() {
        return;
    }
    images().await;
    let dir = tempfile::tempdir().unwrap();
    let system = system_file(dir.path(), |text| text);
    let (mut child, folder, repeat) = started(&dir.path().join("store"), &system).await;
    signal(&child, libc::SIGKILL);
    tokio::time::timeout(RUN_WAIT_MAX, child.wait()).await.expect("the harness ends").unwrap();
    assert_eq!(containers_of(&folder).await, 4, "a killed harness cannot remove its containers: {repeat}");

    // The next start: a system whose image is not there. It removes the dead run's
    // containers, says so, and refuses the image as named wrongly.
    let missing = system_file(dir.path(), |text| text.replace(LAB_IMAGE, "fencelab-no-such-image:never"));
    let next = run(&["--system".to_string(), missing.display().to_string(), "--time-limit".into(), "2".into()]).await;
    assert_eq!(next.code, Some(254), "{}", next.stderr);
    assert!(next.stderr.contains("removed 4 container(s)"), "it says what it removed: {}", next.stderr);
    assert!(next.stderr.contains("fencelab-no-such-image:never") && next.stderr.contains("not present locally"));
    assert!(next.stderr.contains("repeat with"), "{}", next.stderr);
    assert_eq!(containers_of(&folder).await, 0, "the dead run's containers are gone: {repeat}");
    for folder in folders(next.store.path()) {
        assert_eq!(containers_of(&folder).await, 0, "the refused run started nothing");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_daemon_or_a_container_that_exits_first_is_an_internal_error_leaving_nothing() {
    if skipped() {
        return;
    }
    images().await;
    let dir = tempfile::tempdir().unwrap();
    let system = system_file(dir.path(), |text| text);
    let args = ["--system".to_string(), system.display().to_string(), "--time-limit".into(), "2".into()];
    let store = tempfile::tempdir().unwrap();
    let mut command = fencelab(store.path(), &args);
    command.env("DOCKER_HOST", format!("unix://{}", dir.path().join("no-daemon.sock").display()));
    let output = tokio::time::timeout(RUN_WAIT_MAX, command.output()).await.unwrap().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(255), "{said}");
    assert!(said.contains("does not answer") && said.contains("repeat with"), "{said}");

    let broken =
        system_file(dir.path(), |text| text.replacen("\"lab\", \"control-plane\"", "\"lab\", \"no-such-role\"", 1));
    let finished =
        run(&["--system".to_string(), broken.display().to_string(), "--time-limit".into(), "2".into()]).await;
    assert_eq!(finished.code, Some(255), "{}", finished.stderr);
    assert!(finished.stderr.contains("role `control_plane`"), "{}", finished.stderr);
    assert!(finished.stderr.contains("exited"), "{}", finished.stderr);
    for folder in folders(finished.store.path()) {
        assert_eq!(left_within(&folder, Duration::from_secs(10)).await, 0, "nothing is left running");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_toxiproxy_image_is_driven_like_a_toxiproxy_url() {
    if skipped() {
        return;
    }
    images().await;
    let dir = tempfile::tempdir().unwrap();
    let schedule = dir.path().join("schedule.json");
    let cut = fault("reconnects", Some(0), 1_500, 1_200, json!({"how": "cut-links"}));
    std::fs::write(&schedule, serde_json::to_vec(&vec![cut]).unwrap()).unwrap();
    let mut args = words(&["--seed", "2", "--time-limit", "5", "--runners", "2", "--rate", "4", "--lease-ms", "600"]);
    args.extend(words(&["--toxiproxy-image", TOXIPROXY_IMAGE, "--schedule"]));
    args.push(schedule.display().to_string());
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "fencelab run {}: {}", args.join(" "), finished.stderr);
    let folder = finished.folder();
    let log = std::fs::read_to_string(folder.join("lab").join("toxiproxy.log")).unwrap();
    assert!(log.contains("127.0.0.1"), "the Toxiproxy container's log is in the run folder: {log}");
    let cut = finished.history().iter().any(|event| {
        event.process == Process::NEMESIS
            && event.f == Op::Reconnects
            && event.kind == EventType::Ok
            && event.value.as_ref().is_some_and(|value| value["effective"] == json!(true))
    });
    assert!(cut, "a link fault went through the Toxiproxy container");
    assert_eq!(left_within(&folder, Duration::from_secs(10)).await, 0, "no container is left");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_that_cannot_preload_libfaketime_is_refused_for_clock_skew() {
    use testcontainers::runners::AsyncBuilder;
    if skipped() {
        return;
    }
    if engine::run::cluster::libfaketime().is_none() {
        let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
        assert!(!require_all, "libfaketime is not installed (Debian: faketime), and FENCELAB_REQUIRE_ALL=1");
        eprintln!("SKIPPED: libfaketime is not installed");
        return;
    }
    // An image with no dynamic loader (here: nothing but one file). It is only looked at,
    // never run: the refusal comes before anything starts.
    let _image = testcontainers::GenericBuildableImage::new("fencelab-no-loader", "test")
        .with_dockerfile_string("FROM scratch\nCOPY nothing /nothing\n")
        .with_data(b"nothing".to_vec(), "nothing")
        .build_image()
        .await
        .expect("a local image builds");
    let dir = tempfile::tempdir().unwrap();
    let system = system_file(dir.path(), |text| {
        let runner = text.find("[runner]").unwrap();
        let (head, tail) = text.split_at(runner);
        let tail = tail.replacen(LAB_IMAGE, "fencelab-no-loader:test", 1);
        format!("{head}{tail}").replacen(
            "runner_clock = [\"libfaketime\", \"offset-file\"]",
            "runner_clock = [\"libfaketime\"]",
            1,
        )
    });
    let args = ["--system".to_string(), system.display().to_string(), "--nemesis".into(), "clock-skew".into()];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(254), "{}", finished.stderr);
    assert!(
        finished.stderr.contains("no dynamic loader") && finished.stderr.contains("clock-skew"),
        "{}",
        finished.stderr
    );
    for folder in folders(finished.store.path()) {
        assert_eq!(containers_of(&folder).await, 0, "nothing was started");
    }
}

/// A tag that is no image name is the user's input: exit 254 before Docker is asked, with
/// the flag named (no daemon is needed to say so).
#[tokio::test(flavor = "multi_thread")]
async fn image_build_with_a_tag_that_is_no_image_name_exits_254() {
    for (tag, toxiproxy_tag, flag) in
        [("Not A Name", TOXIPROXY_IMAGE, "--tag"), (LAB_IMAGE, "fencelab-toxiproxy:", "--toxiproxy-tag")]
    {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"));
        command.args(["image", "build", "--tag", tag, "--toxiproxy-tag", toxiproxy_tag]).kill_on_drop(true);
        let output = tokio::time::timeout(RUN_WAIT_MAX, command.output()).await.expect("ends in time").unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(254), "{tag} {toxiproxy_tag}: {stderr}");
        assert!(stderr.contains(flag), "the message names {flag}: {stderr}");
    }
}
