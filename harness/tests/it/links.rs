//! The two faults of a real TCP link, end to end on the lab and on the Python example:
//! `half-open` (one side of the runner's open connections reset, the other kept silent) and
//! `partition` (its packets dropped on loopback). Each run has just that fault, given as a
//! schedule; each checks that the fault hit something (the nemesis's start says how many
//! connections were reset, or which rules were installed), that the correct system is
//! valid, and that no packet rule is left afterwards. A stored `schedule.json` with the new
//! variants plays again.

use history::{Event, EventType, Op, Process};
use serde_json::json;

use super::run::{fault, run, schedule_file, Finished};
use super::second::{python_missing, python_system};

/// A short run of two busy runners with exactly `faults`, on `system` (the lab when none).
async fn with_faults(faults: &[serde_json::Value], system: Option<&str>) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let schedule = schedule_file(dir.path(), faults);
    let mut args = vec!["--seed", "1", "--time-limit", "8", "--runners", "2", "--keys", "2", "--rate", "4"];
    args.extend(["--lease-ms", "600", "--recovery-limit", "60", "--schedule", &schedule]);
    args.extend(system.map(|system| ["--system", system]).into_iter().flatten());
    run(&args).await
}

/// The nemesis's `ok`/`info` events of fault `op` in `phase`.
fn phases<'a>(events: &'a [Event], op: Op, phase: &'a str) -> impl Iterator<Item = &'a Event> + 'a {
    events.iter().filter(move |event| {
        event.process == Process::NEMESIS
            && event.f == op
            && event.kind != EventType::Invoke
            && event.value.as_ref().is_some_and(|value| value["phase"] == phase)
    })
}

fn value(event: &Event) -> &serde_json::Value {
    event.value.as_ref().expect("a nemesis event carries its fault")
}

fn context(finished: &Finished) -> String {
    format!("{}\n{}", finished.stdout, finished.stderr)
}

/// Asserts the run is valid and that every `half-open` variant of `hows` took effect
/// (resetting a connection) and was healed.
fn half_open_took_effect(finished: &Finished, hows: &[&str]) {
    assert_eq!(finished.code, Some(0), "the correct system is valid: {}", context(finished));
    let events = finished.history();
    for how in hows {
        let started: Vec<&Event> =
            phases(&events, Op::HalfOpen, "start").filter(|event| value(event)["variant"]["how"] == *how).collect();
        let effective = started.iter().find(|event| event.kind == EventType::Ok && value(event)["effective"] == true);
        let effective = effective.unwrap_or_else(|| panic!("{how} never took effect: {started:?}"));
        let resets = value(effective)["resets"].as_u64().unwrap_or(0);
        assert!(resets >= 1, "{how}: the start says a connection was reset: {effective:?}");
        let healed = phases(&events, Op::HalfOpen, "heal").filter(|event| value(event)["variant"]["how"] == *how);
        assert!(healed.into_iter().any(|event| event.kind == EventType::Ok), "{how} was healed");
    }
}

/// Both variants of `half-open`, one per runner, in one schedule.
fn half_open_schedule() -> Vec<serde_json::Value> {
    vec![
        fault("half-open", Some(0), 1_500, 1_800, json!({"how": "reset-control-side"})),
        fault("half-open", Some(1), 2_000, 1_800, json!({"how": "reset-runner-side"})),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn half_open_connections_are_reset_on_one_side_and_the_lab_stays_valid_and_replays() {
    let finished = with_faults(&half_open_schedule(), None).await;
    half_open_took_effect(&finished, &["reset-control-side", "reset-runner-side"]);
    // The stored schedule, with the new variants, plays again: the same faults at the same times.
    let stored = finished.folder().join("schedule.json");
    let again = run(&["--seed", "2", "--time-limit", "8", "--runners", "2", "--rate", "4", "--lease-ms", "600"]
        .into_iter()
        .chain(["--schedule", stored.to_str().unwrap()])
        .collect::<Vec<_>>())
    .await;
    let replayed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(again.folder().join("schedule.json")).unwrap()).unwrap();
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&stored).unwrap()).unwrap();
    assert_eq!(replayed, stored, "the replay's schedule is the stored one");
    half_open_took_effect(&again, &["reset-control-side", "reset-runner-side"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn half_open_connections_of_the_python_example_are_reset_and_it_stays_valid() {
    if python_missing() {
        return;
    }
    let system = python_system();
    let finished = with_faults(&half_open_schedule(), Some(system.to_str().unwrap())).await;
    half_open_took_effect(&finished, &["reset-control-side", "reset-runner-side"]);
}

/// Skips (or, under `FENCELAB_REQUIRE_ALL=1`, fails) when this host cannot drop packets; a
/// run there must then say the fault was not run, and why.
async fn partition_or_skip() -> bool {
    let Some(why) = system::packets::unavailable() else { return true };
    eprintln!("SKIPPED: {why}");
    let require_all = std::env::var("FENCELAB_REQUIRE_ALL").is_ok_and(|value| value == "1");
    assert!(!require_all, "{why}, and FENCELAB_REQUIRE_ALL=1");
    false
}

/// Asserts the run is valid, that the partition installed its rules (a rule each way per
/// control link) and removed them, and that no rule of that harness is left on `lo`.
fn partition_took_effect(finished: &Finished) {
    assert_eq!(finished.code, Some(0), "the correct system is valid: {}", context(finished));
    let events = finished.history();
    let started: Vec<&Event> = phases(&events, Op::Partition, "start").collect();
    let effective = started.iter().find(|event| event.kind == EventType::Ok && value(event)["effective"] == true);
    let effective = effective.unwrap_or_else(|| panic!("the partition never took effect: {started:?}"));
    let rules: Vec<&str> =
        value(effective)["rules"].as_array().unwrap().iter().filter_map(|rule| rule.as_str()).collect();
    assert_eq!(rules.len(), 2, "a rule each way on the runner's control link: {rules:?}");
    assert!(rules.iter().all(|rule| rule.contains("on lo (fencelab:")), "{rules:?}");
    let healed = phases(&events, Op::Partition, "heal");
    assert!(healed.into_iter().any(|event| event.kind == EventType::Ok), "the partition was healed");
    let tag = rules[0].rsplit_once('(').map(|(_, tag)| tag.trim_end_matches(')')).unwrap();
    let tag = system::packets::Tag::parse(tag).expect("the rule names its harness");
    let left: Vec<_> = system::packets::listed().unwrap().into_iter().filter(|rule| rule.tag == tag).collect();
    assert!(left.is_empty(), "no rule of the run's harness is left: {left:?}");
}

fn partition_schedule() -> Vec<serde_json::Value> {
    vec![fault("partition", Some(0), 1_500, 1_800, json!({"how": "drop-packets"}))]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_drops_the_runners_packets_the_lab_stays_valid_and_no_rule_is_left() {
    if !partition_or_skip().await {
        return;
    }
    partition_took_effect(&with_faults(&partition_schedule(), None).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_of_the_python_example_leaves_it_valid_and_no_rule_behind() {
    if python_missing() || !partition_or_skip().await {
        return;
    }
    let system = python_system();
    partition_took_effect(&with_faults(&partition_schedule(), Some(system.to_str().unwrap())).await);
}

/// On a real Toxiproxy a one-sided reset cannot be made: the run says so through the faults
/// it did not run, and schedules none.
#[tokio::test(flavor = "multi_thread")]
async fn half_open_is_not_run_on_a_real_toxiproxy_and_the_run_says_why() {
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_fencelab"))
        .args(["toxiproxy", "--listen", "127.0.0.1:0", "--seed", "1"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(super::WAIT_MAX, lines.next_line()).await.unwrap().unwrap().unwrap();
    let url = line.split_whitespace().last().unwrap().to_string();
    // A standalone server stands for a real Toxiproxy: the harness cannot tell, and must
    // not rely on fencelab's own toxics there.
    let finished =
        run(&["--seed", "1", "--time-limit", "4", "--nemesis", "half-open,kill", "--toxiproxy-url", &url]).await;
    assert_eq!(finished.code, Some(0), "{}", context(&finished));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(finished.folder().join("config.json")).unwrap()).unwrap();
    let not_run = &config["system"]["faults_not_run"];
    assert_eq!(not_run[0]["fault"], "half-open", "{not_run}");
    assert_eq!(not_run[0]["needs"], "fencelab-proxy");
    assert!(not_run[0]["why"].as_str().unwrap().contains("real Toxiproxy"), "{not_run}");
    assert!(finished.stdout.contains("not run      half-open"), "{}", finished.stdout);
    let schedule = std::fs::read_to_string(finished.folder().join("schedule.json")).unwrap();
    assert!(!schedule.contains("half-open"), "{schedule}");
}
