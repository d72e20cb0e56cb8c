//! Several control-plane replicas on one store: runners fail over when their replica is
//! killed, the sweepers of every replica run at once, and the correct lab stays valid.

use history::{EventType, Op, Process};

use super::run::{postgres_or_skip, run};

#[tokio::test(flavor = "multi_thread")]
async fn runners_fail_over_when_their_replica_is_killed_and_the_lab_stays_valid() {
    let finished =
        run(&["--control-planes", "3", "--seed", "8", "--time-limit", "12", "--nemesis", "kill-replica,kill"]).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let events = finished.history();
    let kills: Vec<(u64, u64, u64)> = events
        .iter()
        .filter(|event| event.f == Op::KillReplica && event.kind == EventType::Ok)
        .filter(|event| event.value.as_ref().is_some_and(|value| value["phase"] == "start"))
        .map(|event| {
            let value = event.value.as_ref().unwrap();
            let replica = value["variant"]["replica"].as_u64().unwrap();
            (event.time_ns, event.time_ns + value["duration_ms"].as_u64().unwrap() * 1_000_000, replica)
        })
        .collect();
    assert!(!kills.is_empty(), "a replica was killed");
    // Runner rN's own replica is N-1 (modulo 3): while it is down, that runner still gets
    // the control plane's answers — from another replica.
    let answered_while_down = kills.iter().any(|(from_ns, until_ns, replica)| {
        let runner = Process::runner(&format!("r{}", replica + 1));
        events.iter().any(|event| {
            event.process == runner
                && event.kind == EventType::Response
                && event.f != Op::Step
                && (*from_ns..*until_ns).contains(&event.time_ns)
        })
    });
    assert!(answered_while_down, "a runner whose replica was down got answers from another: {kills:?}");
    let logs: Vec<String> = std::fs::read_dir(finished.folder().join("lab"))
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("control"))
        .collect();
    assert!(logs.contains(&"control-3.log".to_string()), "three replicas ran: {logs:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_fault_needs_replicas() {
    let finished = run(&["--nemesis", "kill-replica", "--time-limit", "2"]).await;
    assert_eq!(finished.code, Some(254));
    assert!(finished.stderr.contains("needs --control-planes 2 or more"), "{}", finished.stderr);
}

/// The correct lab on PostgreSQL with three replicas under every fault — the database's
/// among them: a replica's clock moved, its link to the database slowed, cut, and cut
/// right after a COMMIT — is valid, and each of those faults took effect (what a cut
/// COMMIT is answered is the next test's, where cuts always meet one).
#[tokio::test(flavor = "multi_thread")]
async fn the_correct_lab_on_postgresql_with_replicas_is_valid_under_every_fault() {
    if !postgres_or_skip() {
        return;
    }
    let args = ["--db", "postgres", "--control-planes", "3", "--seed", "4", "--time-limit", "20", "--nemesis", "all"];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let events = finished.history();
    let took_effect: std::collections::BTreeSet<String> = events
        .iter()
        .filter(|event| matches!(event.f, Op::DbLink | Op::ReplicaClockSkew) && event.kind == EventType::Ok)
        .filter_map(|event| event.value.as_ref())
        .filter(|value| value["phase"] == "start" && value["effective"] == true)
        .filter_map(|value| value["variant"]["how"].as_str().map(str::to_string))
        .collect();
    let mut expected = vec!["commit-cut", "db-cut", "db-latency"];
    if engine::run::cluster::libfaketime().is_some() {
        expected.push("replica-skew");
    }
    for how in expected {
        assert!(took_effect.contains(how), "{how} took effect: {took_effect:?}");
    }
}

/// A COMMIT whose answer the database link cuts is answered as an unknown outcome, and the
/// lab stays valid. Twelve cuts of at most a second each, four on every replica, while
/// three runners keep all of them busy; every cut's heal says how many COMMITs it cut.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_whose_answer_is_cut_is_answered_as_an_unknown_outcome() {
    if !postgres_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cuts: Vec<serde_json::Value> = (0..12u64)
        .map(|n| {
            let variant = serde_json::json!({"how": "commit-cut", "replica": n % 3});
            super::run::fault("db-link", None, 1_500 + (n / 3) * 1_500, 1_000, variant)
        })
        .collect();
    let schedule = super::run::schedule_file(dir.path(), &cuts);
    let args = [
        "--db",
        "postgres",
        "--control-planes",
        "3",
        "--seed",
        "4",
        "--time-limit",
        "9",
        "--runners",
        "3",
        "--keys",
        "6",
        "--rate",
        "8",
        // 8 jobs/s keeps every runner busy and leaves a backlog of about 40 jobs at the
        // time limit: about 13 s to drain here, over 30 s on a loaded machine. Recovery
        // ends when they are done; its bound is generous.
        "--recovery-limit",
        "120",
        "--schedule",
        &schedule,
    ];
    let finished = run(&args).await;
    assert_eq!(finished.code, Some(0), "{}\n{}", finished.stdout, finished.stderr);
    let heals: Vec<u64> = finished
        .history()
        .iter()
        .filter(|event| event.f == Op::DbLink && event.kind == EventType::Ok)
        .filter_map(|event| event.value.as_ref())
        .filter(|value| value["phase"] == "heal")
        .map(|value| value["cuts"].as_u64().expect("a commit cut's heal counts its cuts"))
        .collect();
    assert_eq!(heals.len(), 12, "every cut healed: {heals:?}");
    assert!(heals.iter().sum::<u64>() >= 1, "the cuts met a COMMIT that wrote: {heals:?}");
    let logs = std::fs::read_dir(finished.folder().join("lab")).unwrap().flatten();
    let unknown = logs
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("control"))
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .any(|log| log.contains("the outcome of a commit is unknown"));
    assert!(
        unknown,
        "a COMMIT whose answer was cut was answered as an unknown outcome (fencelab run {})",
        args.join(" ")
    );
}
