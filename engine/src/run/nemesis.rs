//! The nemesis: executes the fault schedule against the cluster. Each fault is recorded as
//! an `invoke` and an `ok` (or `info` when its effect is unknown) at its start, and again
//! at its heal. A fault cut short by the end of the run is healed by [`heal_all`].

use history::Op;
use history::Process;
use std::sync::Arc;
use std::time::Duration;

use history::EventType;
use protocol::{ClaimRef, Outcome, ResultRequest};
use proxy::{Stream, Toxic, ToxicKind};
use tokio::sync::Mutex;
use workloads::faults::{Fault, Variant};

use super::cluster::{target_link, Cluster};
use super::recorder::Recorder;
use super::Shared;

/// The name of the toxic a fault adds: its own, so that a fault retried into the window of
/// the next fault on the same link never removes that fault's toxic.
fn toxic_name(fault: &Fault) -> String {
    format!("fencelab-{}-{}", fault.variant.name(), fault.at_ms)
}

/// Runs every fault of the schedule at its time from `origin_ms` (the history's ms when the
/// workload began). Each fault runs in a task of its own, so
/// that a clock skew stays in effect while the next fault (scheduled inside its window)
/// happens; the others never overlap by construction. Aborting this aborts them all.
pub async fn run(shared: Shared, schedule: Vec<Fault>, origin_ms: u64) {
    let mut faults = tokio::task::JoinSet::new();
    let end_ms = origin_ms + shared.config.time_limit_ms;
    for fault in schedule {
        let wait_ms = (origin_ms + fault.at_ms).saturating_sub(shared.recorder.now_ms());
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        faults.spawn(one(shared.clone(), fault, end_ms));
    }
    while faults.join_next().await.is_some() {}
}

/// Most tries of a fault that found nothing to hit (an idle runner, no result to resend,
/// no two running jobs to cross): a fault that does nothing tests nothing.
const TRIES_MAX: u32 = 3;

/// What starting a fault did.
enum Started {
    /// The fault is in effect until it is healed.
    Window,
    /// A one-off fault (a resent or crossed result) was sent.
    Sent,
    /// Nothing was there to hit; nothing was changed.
    Ineffective,
    /// The fault held its window and healed itself (or could not start at all): nothing is
    /// left to hold, heal or try again.
    Done,
}

/// One fault: start (again, a lease later, while it finds nothing to hit and another try
/// still ends before `end_ms`, the history's ms), hold for its duration (jumping back
/// halfway for a jump), heal.
pub(crate) async fn one(shared: Shared, fault: Fault, end_ms: u64) {
    let fault = in_use(&shared, fault).await;
    let label = label(&fault);
    shared.active.lock().await.push(label.clone());
    let lease = Duration::from_millis(shared.config.lease_ms);
    for try_number in 1..=TRIES_MAX {
        match start(&shared, &fault, try_number).await {
            // The window is held from when the fault took effect: the wait for a claim to hit
            // (up to two leases on a loaded machine) is not taken out of it.
            Started::Window => {
                hold_and_heal(&shared, &fault, tokio::time::Instant::now()).await;
                break;
            }
            Started::Sent | Started::Done => break,
            Started::Ineffective => {
                let retry_end_ms = shared.recorder.now_ms() + shared.config.lease_ms + fault.duration_ms;
                if retry_end_ms >= end_ms {
                    break;
                }
                tokio::time::sleep(lease).await;
            }
        }
    }
    shared.active.lock().await.retain(|active| active != &label);
}

/// How long the traffic to each replica is watched to find the one in use.
const IN_USE_WATCH_MS: u64 = 300;

/// A replica's clock skew that names no replica is given the replica in use: the one whose
/// runners' links carried the most bytes over [`IN_USE_WATCH_MS`] (the first on a tie, or
/// when the proxy cannot say). Runners move between replicas as they fail over, and a
/// replica that serves no runner decides nothing for its clock to move.
async fn in_use(shared: &Shared, fault: Fault) -> Fault {
    let Variant::ReplicaSkew { replica: None, offset_ms } = fault.variant else { return fault };
    let (links, proxy) = {
        let cluster = shared.cluster.lock().await;
        let links: Vec<Vec<String>> = (0..cluster.system.replicas.len())
            .map(|replica| {
                (0..cluster.runners.len()).map(|runner| super::cluster::replica_link(runner, replica)).collect()
            })
            .collect();
        (links, cluster.proxy.clone())
    };
    let traffic = |links: Vec<Vec<String>>| {
        let proxy = proxy.clone();
        async move {
            let mut bytes = Vec::with_capacity(links.len());
            for names in links {
                let mut sum = 0u64;
                for name in names {
                    sum += proxy.traffic_bytes(&name).await.unwrap_or(0);
                }
                bytes.push(sum);
            }
            bytes
        }
    };
    let before = traffic(links.clone()).await;
    tokio::time::sleep(Duration::from_millis(IN_USE_WATCH_MS)).await;
    let after = traffic(links).await;
    let used = after.iter().zip(&before).map(|(after, before)| after.saturating_sub(*before));
    let busiest =
        used.enumerate().fold((0, 0), |best, (replica, bytes)| if bytes > best.1 { (replica, bytes) } else { best });
    Fault { variant: Variant::ReplicaSkew { replica: Some(busiest.0 as u32), offset_ms }, ..fault }
}

/// Holds the fault until `duration_ms` after it `started` (jumping back halfway for a jump),
/// then heals it. A commit cut is healed as soon as it has cut [`COMMIT_CUTS_WANTED`]
/// COMMITs: its duration bounds the wait for them.
async fn hold_and_heal(shared: &Shared, fault: &Fault, started: tokio::time::Instant) {
    let until = |share_ms: u64| started + Duration::from_millis(share_ms);
    if let Variant::Jump { offset_ms } = fault.variant {
        tokio::time::sleep_until(until(fault.duration_ms / 2)).await;
        let result = shared.cluster.lock().await.set_clock(runner(fault), -offset_ms);
        record(&shared.recorder, fault, "jump-back", result.map_err(|error| error.to_string()));
    }
    let mut fields = serde_json::Map::new();
    if let Variant::CommitCut { .. } = fault.variant {
        let cuts = commit_cuts(shared, fault, until(fault.duration_ms)).await;
        fields.insert("cuts".into(), cuts.into());
    } else {
        if let Variant::Pause | Variant::CutLinks = fault.variant {
            stale_when_lapsed(shared, fault, until(fault.duration_ms)).await;
        }
        tokio::time::sleep_until(until(fault.duration_ms)).await;
    }
    if let Variant::ResetControlSide | Variant::ResetRunnerSide = fault.variant {
        // Read before the heal removes the toxic: the connections reset over the window.
        fields.insert("resets".into(), resets(shared, fault).await.into());
    }
    heal(shared, fault, fields).await;
}

/// How many COMMITs a commit cut is held for: each is a transaction whose outcome its
/// replica cannot know (a claim, a heartbeat, a result or a sweep).
const COMMIT_CUTS_WANTED: u64 = 8;

/// Waits until commit cut `fault` has cut [`COMMIT_CUTS_WANTED`] COMMITs, or `bound`;
/// answers the count (the last one read, 0 when the proxy could not be asked).
async fn commit_cuts(shared: &Shared, fault: &Fault, bound: tokio::time::Instant) -> u64 {
    let name = toxic_name(fault);
    let (links, proxy) = {
        let cluster = shared.cluster.lock().await;
        (db_links(&fault.variant, cluster.system.replicas.len()), cluster.proxy.clone())
    };
    let mut counted = vec![0; links.len()];
    loop {
        for (link, count) in links.iter().zip(counted.iter_mut()) {
            *count = proxy.commit_cuts(link, &name).await.unwrap_or(*count);
        }
        let cuts = counted.iter().sum();
        if cuts >= COMMIT_CUTS_WANTED || tokio::time::Instant::now() >= bound {
            return cuts;
        }
        tokio::time::sleep(Duration::from_millis(HOLD_POLL_MS)).await;
    }
}

/// The database links a fault on replicas hits: its replica's, or every replica's (a
/// db-latency or a commit cut that names none).
fn db_links(variant: &Variant, replicas: usize) -> Vec<String> {
    let replicas = replicas.max(1);
    match variant.replica() {
        Some(replica) => vec![super::cluster::db_link(replica as usize % replicas)],
        None => (0..replicas).map(super::cluster::db_link).collect(),
    }
}

/// How the progress line names a fault in effect: `kind(r2)` on a runner, `kind(replica 2,
/// how)` on a replica.
fn label(fault: &Fault) -> String {
    match (fault.runner, fault.variant.replica()) {
        (Some(runner), _) => format!("{}(r{})", fault.kind.name(), runner + 1),
        (None, Some(replica)) => format!("{}(replica {}, {})", fault.kind.name(), replica + 1, fault.variant.name()),
        (None, None) if fault.kind.on_replicas() => {
            format!("{}(every replica, {})", fault.kind.name(), fault.variant.name())
        }
        (None, None) if fault.on_every_runner() => {
            format!("{}(every runner, {})", fault.kind.name(), fault.variant.name())
        }
        (None, None) => fault.kind.name().to_string(),
    }
}

fn runner(fault: &Fault) -> usize {
    fault.runner.unwrap_or(0) as usize
}

/// Records a phase of a fault: invoke, then ok or info with the error.
fn record(recorder: &Recorder, fault: &Fault, phase: &str, result: Result<(), String>) {
    record_with(recorder, fault, phase, result, serde_json::Map::new());
}

/// Records a fault's start: whether it took effect, and on which try.
fn record_start(recorder: &Recorder, fault: &Fault, try_number: u32, result: Result<(), String>, effective: bool) {
    record_with(recorder, fault, "start", result, effect(effective, try_number));
}

/// The fields of a start that say whether it took effect, and on which try.
fn effect(effective: bool, try_number: u32) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    fields.insert("effective".into(), effective.into());
    fields.insert("try".into(), try_number.into());
    fields
}

/// Records a phase of a fault with `fields` added to its value.
fn record_with(
    recorder: &Recorder,
    fault: &Fault,
    phase: &str,
    result: Result<(), String>,
    fields: serde_json::Map<String, serde_json::Value>,
) {
    let fill = |event: &mut history::Event| {
        event.runner = fault.runner.map(|runner| format!("r{}", runner + 1));
        let mut value = serde_json::to_value(fault).unwrap_or_default();
        value["phase"] = serde_json::Value::from(phase);
        for (field, field_value) in &fields {
            value[field] = field_value.clone();
        }
        event.value = Some(value);
    };
    recorder.record(Process::NEMESIS, EventType::Invoke, fault.kind.op(), fill);
    let kind = if result.is_ok() { EventType::Ok } else { EventType::Info };
    recorder.record(Process::NEMESIS, kind, fault.kind.op(), |event| {
        fill(event);
        event.reason = result.err();
    });
}

async fn start(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    // A fault on a runner matters while it holds a claim: wait (bounded) for one. Resent
    // results pick a claim the runner already finished; an impersonation, another's claim.
    let mid_deployment = fault.runner.is_some()
        && !matches!(
            fault.variant,
            Variant::Replay | Variant::Conflict | Variant::Impersonate | Variant::BorrowedClaim
        );
    if mid_deployment && !wait_busy(shared, index).await {
        let why = format!("runner r{} held no claim within {} ms: nothing to hit", index + 1, claim_wait_ms(shared));
        record_start(&shared.recorder, fault, try_number, Err(why), false);
        return Started::Ineffective;
    }
    let result = match &fault.variant {
        Variant::Replay | Variant::Conflict => return resend(shared, fault, try_number).await,
        Variant::CrossJob => return cross(shared, fault, try_number).await,
        Variant::Impersonate => return impersonate(shared, fault, try_number).await,
        Variant::BorrowedClaim => return borrow(shared, fault, try_number).await,
        Variant::DelayedStep { .. } | Variant::LateStep { .. } => return hold_step(shared, fault, try_number).await,
        Variant::BackwardJump { .. } => return backward_jump(shared, fault, try_number).await,
        Variant::SlowAnswers { .. } => slow_answers(shared, fault, true).await,
        Variant::ResetControlSide | Variant::ResetRunnerSide => return half_open(shared, fault, try_number).await,
        Variant::DropPackets => return partition(shared, fault, try_number).await,
        Variant::RestartControl => restart_control(shared).await,
        Variant::TargetSkew { offset_ms } => target_clock(shared, *offset_ms).await,
        Variant::KillReplica { replica } => kill_replica(shared, *replica as usize).await,
        Variant::ReplicaSkew { .. } | Variant::DbLatency { .. } | Variant::DbCut { .. } | Variant::CommitCut { .. } => {
            on_database(shared, fault, true).await
        }
        variant => start_on(&shared.cluster, index, variant, &toxic_name(fault)).await,
    };
    let effective = result.is_ok();
    record_start(&shared.recorder, fault, try_number, result, effective);
    Started::Window
}

async fn start_on(shared_cluster: &Mutex<Cluster>, index: usize, variant: &Variant, name: &str) -> Result<(), String> {
    let mut cluster = shared_cluster.lock().await;
    let toxic = |kind| Toxic::new(kind).on(Stream::Upstream).named(name);
    let outcome = match variant {
        Variant::Latency { latency_ms } => {
            let kind = ToxicKind::Latency { latency_ms: *latency_ms, jitter_ms: 0 };
            cluster.control_add_toxic(index, &toxic(kind)).await
        }
        Variant::LostResponse => {
            let lost = Toxic::new(ToxicKind::LimitData { bytes: 0 }).on(Stream::Downstream).named(name);
            cluster.control_add_toxic(index, &lost).await
        }
        Variant::Pause => {
            cluster.runners[index].paused_by_nemesis = true;
            return signal(&cluster, index, libc::SIGSTOP);
        }
        Variant::CutLinks => {
            let control = cluster.control_set_enabled(index, false).await;
            control.and(cluster.proxy.set_enabled(&target_link(index), false).await.map(drop))
        }
        Variant::ControlLink => cluster.control_set_enabled(index, false).await,
        Variant::TargetLinkMidStep => cluster.proxy.set_enabled(&target_link(index), false).await.map(drop),
        Variant::StaticSkew { offset_ms } | Variant::Jump { offset_ms } => {
            return cluster.set_clock(index, *offset_ms).map_err(|error| error.to_string())
        }
        Variant::KillRunner => {
            cluster.runners[index].killed_at_ms = Some(protocol::wall_ms());
            if let Some(mut process) = cluster.runners[index].process.take() {
                process.kill().await;
            }
            return Ok(());
        }
        Variant::Replay
        | Variant::Conflict
        | Variant::CrossJob
        | Variant::Impersonate
        | Variant::BorrowedClaim
        | Variant::DelayedStep { .. }
        | Variant::LateStep { .. }
        | Variant::BackwardJump { .. }
        | Variant::SlowAnswers { .. }
        | Variant::RestartControl
        | Variant::TargetSkew { .. }
        | Variant::KillReplica { .. }
        | Variant::ReplicaSkew { .. }
        | Variant::DbLatency { .. }
        | Variant::DbCut { .. }
        | Variant::CommitCut { .. }
        | Variant::ResetControlSide
        | Variant::ResetRunnerSide
        | Variant::DropPackets => unreachable!("started elsewhere"),
    };
    outcome.map_err(|error| error.to_string())
}

fn signal(cluster: &Cluster, index: usize, signal: i32) -> Result<(), String> {
    if cluster.signal_runner(index, signal) {
        Ok(())
    } else {
        Err(format!("runner r{} is not running", index + 1))
    }
}

/// Heals `fault`, recording the heal with `fields` added to its value.
async fn heal(shared: &Shared, fault: &Fault, fields: serde_json::Map<String, serde_json::Value>) {
    let index = runner(fault);
    let result = {
        let mut cluster = shared.cluster.lock().await;
        match &fault.variant {
            // Removing a one-sided reset closes the silent sides it kept open.
            Variant::Latency { .. } | Variant::LostResponse | Variant::ResetControlSide | Variant::ResetRunnerSide => {
                cluster.control_remove_toxic(index, &toxic_name(fault)).await.map_err(|error| error.to_string())
            }
            Variant::SlowAnswers { .. } => {
                drop(cluster);
                slow_answers(shared, fault, false).await
            }
            Variant::Pause => {
                cluster.runners[index].paused_by_nemesis = false;
                // A runner the operator froze meanwhile stays frozen until its finding.
                if cluster.runners[index].frozen_by_operator {
                    Ok(())
                } else {
                    signal(&cluster, index, libc::SIGCONT)
                }
            }
            Variant::CutLinks | Variant::ControlLink | Variant::TargetLinkMidStep => {
                enable_links(&cluster, index).await
            }
            Variant::StaticSkew { .. } | Variant::Jump { .. } => {
                cluster.set_clock(index, 0).map_err(|error| error.to_string())
            }
            Variant::KillRunner => cluster.start_runner(index).map_err(|error| error.to_string()),
            // The held step was released when it had come late enough (`hold_step`).
            Variant::DelayedStep { .. } | Variant::LateStep { .. } => enable_links(&cluster, index).await,
            Variant::TargetSkew { .. } => cluster.set_target_clock(0).map_err(|error| error.to_string()),
            Variant::KillReplica { replica } => {
                let replica = *replica as usize % cluster.system.replicas.len();
                cluster.system.start_replica(replica).await.map_err(|error| error.to_string())
            }
            Variant::ReplicaSkew { .. }
            | Variant::DbLatency { .. }
            | Variant::DbCut { .. }
            | Variant::CommitCut { .. } => {
                drop(cluster);
                on_database(shared, fault, false).await
            }
            Variant::Replay
            | Variant::Conflict
            | Variant::CrossJob
            | Variant::Impersonate
            | Variant::BorrowedClaim
            | Variant::RestartControl
            // A partition and a backward jump heal themselves (`partition`, `backward_jump`).
            | Variant::DropPackets
            | Variant::BackwardJump { .. } => return,
        }
    };
    record_with(&shared.recorder, fault, "heal", result, fields);
}

async fn enable_links(cluster: &Cluster, index: usize) -> Result<(), String> {
    let control = cluster.control_set_enabled(index, true).await;
    let target = cluster.proxy.set_enabled(&target_link(index), true).await.map(drop);
    control.and(target).map_err(|error| error.to_string())
}

/// Starts (`on`) or heals a fault on one replica's clock or on its link to the database.
async fn on_database(shared: &Shared, fault: &Fault, on: bool) -> Result<(), String> {
    let variant = &fault.variant;
    let cluster = shared.cluster.lock().await;
    let replica = variant.replica().unwrap_or(0) as usize % cluster.system.replicas.len().max(1);
    let link = super::cluster::db_link(replica);
    let name = toxic_name(fault);
    let toxic = match variant {
        Variant::CommitCut { .. } => Some(ToxicKind::CommitCut { distinct: true }),
        Variant::DbLatency { latency_ms, .. } => Some(ToxicKind::Latency { latency_ms: *latency_ms, jitter_ms: 0 }),
        _ => None,
    };
    if let Some(kind) = toxic {
        let mut done = Ok(());
        for link in db_links(variant, cluster.system.replicas.len()) {
            let changed = match on {
                true => {
                    let toxic = Toxic::new(kind).on(Stream::Upstream).named(&name);
                    cluster.proxy.add_toxic(&link, &toxic).await.map(drop)
                }
                false => cluster.proxy.remove_toxic(&link, &name).await,
            };
            done = done.and(changed.map_err(|error| format!("{link}: {error}")));
        }
        return done;
    }
    let done = match (variant, on) {
        (Variant::ReplicaSkew { offset_ms, .. }, on) => {
            let offset_ms = if on { *offset_ms } else { 0 };
            return cluster.set_replica_clock(replica, offset_ms).map_err(|error| error.to_string());
        }
        (Variant::DbCut { .. }, on) => cluster.proxy.set_enabled(&link, !on).await.map(drop),
        _ => unreachable!("a fault on the database or a replica's clock"),
    };
    done.map_err(|error| error.to_string())
}

/// Starts (`on`) or heals slow answers: a latency toxic on the control plane's answers
/// (downstream) of the control links of the fault's runner, or of every runner when it
/// names none.
async fn slow_answers(shared: &Shared, fault: &Fault, on: bool) -> Result<(), String> {
    let Variant::SlowAnswers { latency_ms } = fault.variant else { unreachable!("slow answers") };
    let cluster = shared.cluster.lock().await;
    let runners = match fault.runner {
        Some(runner) => vec![runner as usize],
        None => (0..cluster.runners.len()).collect(),
    };
    let name = toxic_name(fault);
    let toxic = Toxic::new(ToxicKind::Latency { latency_ms, jitter_ms: 0 }).on(Stream::Downstream).named(&name);
    let mut done = Ok(());
    for index in runners {
        let changed = match on {
            true => cluster.control_add_toxic(index, &toxic).await,
            false => cluster.control_remove_toxic(index, &name).await,
        };
        done = done.and(changed.map_err(|error| format!("r{}: {error}", index + 1)));
    }
    done
}

/// SIGKILLs one replica of the control plane (started again when the fault heals).
async fn kill_replica(shared: &Shared, replica: usize) -> Result<(), String> {
    let mut cluster = shared.cluster.lock().await;
    let replicas = cluster.system.replicas.len();
    if replicas < 2 {
        return Err("the control plane has one replica: nothing to fail over to".into());
    }
    cluster.system.kill_replica(replica % replicas).await;
    Ok(())
}

async fn target_clock(shared: &Shared, offset_ms: i64) -> Result<(), String> {
    let cluster = shared.cluster.lock().await;
    if cluster.system.launch.target_clock.is_none() {
        return Err("the target's clock cannot be moved here".into());
    }
    cluster.set_target_clock(offset_ms).map_err(|error| error.to_string())
}

async fn restart_control(shared: &Shared) -> Result<(), String> {
    let mut cluster = shared.cluster.lock().await;
    cluster.system.restart_control().await.map_err(|error| error.to_string())
}

/// Waits until runner `index` holds a running attempt (true), or 2 leases pass (false).
async fn wait_busy(shared: &Shared, index: usize) -> bool {
    let (operator, runner_id) = {
        let cluster = shared.cluster.lock().await;
        (cluster.system.operator.clone(), cluster.runners[index].id.clone())
    };
    awaited(shared, &operator, |claims: &[ClaimRef]| claims.iter().any(|claim| claim.runner == runner_id).then_some(()))
        .await
        .is_some()
}

/// The last result of runner `index` that the control plane accepted, from its log.
fn last_accepted_result(cluster: &Cluster, index: usize) -> Option<(ClaimRef, Outcome)> {
    logged_events(cluster, index).into_iter().rev().find_map(|event| {
        let accepted = event.kind == EventType::Response
            && event.f == Op::Result
            && event.decision == Some(history::Decision::Accepted);
        let outcome = match event.outcome.as_deref()? {
            "succeeded" => Outcome::Succeeded,
            _ => Outcome::Failed,
        };
        let claim = ClaimRef { job: event.job?, attempt: event.attempt?, runner: event.runner?, fence: event.fence? };
        accepted.then_some((claim, outcome))
    })
}

/// Sends a captured result again (a duplicate) or with the other outcome (a conflict),
/// with the runner's own token, straight to the control plane.
async fn resend(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    let (_, client) = runner_client(shared, index).await;
    let captured = last_accepted_result(&*shared.cluster.lock().await, index);
    let Some((claim, outcome)) = captured else {
        let why = "no accepted result to resend yet".to_string();
        record_start(&shared.recorder, fault, try_number, Err(why), false);
        return Started::Ineffective;
    };
    let outcome = match (&fault.variant, outcome) {
        (Variant::Conflict, Outcome::Succeeded) => Outcome::Failed,
        (Variant::Conflict, Outcome::Failed) => Outcome::Succeeded,
        (_, outcome) => outcome,
    };
    send_result(shared, fault, &client, claim.clone(), outcome, try_number).await;
    if fault.variant == Variant::Replay {
        stale_requests(shared, fault, &client, claim, try_number).await;
    }
    Started::Sent
}

/// Sends again, in runner `client`'s name, the requests a runner sends while it holds a
/// claim — a heartbeat and a capability request — for claims whose lease has ended: the
/// claim whose result was just replayed (closed by that result), and the runner's latest
/// other claim that got no accepted result and that the control plane no longer holds as
/// running (expired, superseded or reconciled). A correct control plane refuses each; one
/// that renews or grants a capability on a lapsed claim is caught by the ledger's checks.
async fn stale_requests(shared: &Shared, fault: &Fault, client: &RunnerClient, replayed: ClaimRef, try_number: u32) {
    let mut stale = vec![replayed.clone()];
    stale.extend(lapsed_claim(shared, fault, Some(&replayed)).await);
    for claim in &stale {
        for report in [Report::Heartbeat, Report::Capability] {
            send_report_as(shared, fault, client, claim, report, try_number, Probe::Stale).await;
        }
    }
}

/// Runner `fault`'s latest claim (other than `except`) that got no accepted result and
/// that the control plane no longer holds as running.
async fn lapsed_claim(shared: &Shared, fault: &Fault, except: Option<&ClaimRef>) -> Option<ClaimRef> {
    let (operator, claims) = {
        let cluster = shared.cluster.lock().await;
        (cluster.system.operator.clone(), logged_claims(&cluster, runner(fault)))
    };
    for claim in claims.into_iter().rev().filter(|claim| Some(claim) != except) {
        if lease_ended(&operator, &claim).await.is_some() {
            return Some(claim);
        }
    }
    None
}

/// How often a fault that keeps a runner from renewing asks whether its claim has lapsed.
const LAPSE_POLL_MS: u64 = 50;

/// While a fault keeps a runner from renewing (`pause`, `cut-links`): as soon as the control
/// plane holds the lease of the claim the runner held at the start as ended (read every
/// [`LAPSE_POLL_MS`], until `bound`), the heartbeat and the capability request the runner
/// would send for it, sent in its name — the requests a correct runner, self-fenced, never
/// sends, arriving while the attempt may still be uncertain and current.
async fn stale_when_lapsed(shared: &Shared, fault: &Fault, bound: tokio::time::Instant) {
    let (operator, held) = {
        let cluster = shared.cluster.lock().await;
        // A system whose runners keep no log of the contract's (an observed one) has no
        // claim to send again, and no runner token to send it with.
        if cluster.info.absent.contains(&system::Feature::RunnerLog) {
            return;
        }
        (cluster.system.operator.clone(), logged_claims(&cluster, runner(fault)).pop())
    };
    let Some(claim) = held else { return };
    at_lease_end(shared, fault, &operator, &claim, bound).await;
    while lease_ended(&operator, &claim).await.is_none() {
        if tokio::time::Instant::now() >= bound {
            return;
        }
        tokio::time::sleep(Duration::from_millis(LAPSE_POLL_MS)).await;
    }
    let (_, client) = runner_client(shared, runner(fault)).await;
    for report in [Report::Heartbeat, Report::Capability] {
        send_report_as(shared, fault, &client, &claim, report, 1, Probe::Stale).await;
    }
}

/// How long before a lease's end the boundary probe reads it again (a renewal the runner
/// sent before the fault may have moved it) before its final wait.
const AIM_AGAIN_MS: i64 = 50;

/// How long before a lease's end the boundary probe's first capability request leaves, in
/// µs: more than a request's way to the control plane under load.
const AIM_LEAD_US: i64 = 3_000;

/// Most capability requests one boundary probe sends.
const AIMED_REQUESTS_MAX: u32 = 24;

/// The boundary probe of a fault that keeps a runner from renewing: capability requests for
/// the claim the runner holds, in its name, one after another with no pause, the first
/// [`AIM_LEAD_US`] before the host's wall clock — the one the lab's control plane reads —
/// turns to the millisecond its lease ends (`value.aimed_ms`; `value.offset_us`, each
/// request's send from that instant). Each one granted (received inside the lease: a
/// capability the nemesis never uses, no lease moves) is followed by the next, until one is
/// refused or [`AIMED_REQUESTS_MAX`] were sent: the first received at or past the end is
/// received within a request's way of it, and within the end's millisecond wherever a
/// request takes less than one — taken there only by a control plane that judges a lease
/// live at its end. Sent only while the control plane holds the claim running with its lease
/// still to come, the end read again [`AIM_AGAIN_MS`] before it; none when the end passes
/// `bound`.
async fn at_lease_end(
    shared: &Shared,
    fault: &Fault,
    operator: &protocol::client::Client,
    claim: &ClaimRef,
    bound: tokio::time::Instant,
) {
    let end_ms = loop {
        let Some(end_ms) = running_lease_end(operator, claim).await else { return };
        let left_ms = end_ms - protocol::wall_ms();
        let bound_ms = bound.saturating_duration_since(tokio::time::Instant::now()).as_millis() as i64;
        if left_ms <= 0 || left_ms >= bound_ms {
            return;
        }
        if left_ms <= AIM_AGAIN_MS {
            break end_ms;
        }
        tokio::time::sleep(Duration::from_millis((left_ms - AIM_AGAIN_MS / 2) as u64)).await;
    };
    let (_, client) = runner_client(shared, runner(fault)).await;
    let end_us = end_ms * 1_000;
    protocol::clock::sleep_until_wall_us(end_us - AIM_LEAD_US).await;
    for n in 1..=AIMED_REQUESTS_MAX {
        let probe = Probe::AtLeaseEnd { end_ms, offset_us: protocol::clock::wall_us() - end_us };
        let granted = send_report_as(shared, fault, &client, claim, Report::Capability, n, probe).await;
        if !granted {
            return;
        }
    }
}

/// The lease end of `claim` while the control plane holds it running.
async fn running_lease_end(operator: &protocol::client::Client, claim: &ClaimRef) -> Option<i64> {
    let view = operator.job(&claim.job).await.ok()?;
    let attempt = view.attempts.iter().find(|attempt| attempt.id == claim.attempt)?;
    (attempt.state == protocol::AttemptState::Running).then_some(attempt.lease_expires_ms).flatten()
}

/// The events of runner `index`'s log read so far, in its order (none when it cannot be
/// read; a line being written is skipped).
fn logged_events(cluster: &Cluster, index: usize) -> Vec<history::Event> {
    let text = std::fs::read_to_string(cluster.system.runner_log(&cluster.runners[index].id)).unwrap_or_default();
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Runner `index`'s granted claims that got no accepted result, oldest first, from its log.
fn logged_claims(cluster: &Cluster, index: usize) -> Vec<ClaimRef> {
    let mut claims: Vec<ClaimRef> = Vec::new();
    for event in logged_events(cluster, index) {
        if event.kind != EventType::Response || event.decision != Some(history::Decision::Accepted) {
            continue;
        }
        let (Some(job), Some(attempt), Some(runner), Some(fence)) =
            (event.job, event.attempt, event.runner, event.fence)
        else {
            continue;
        };
        let claim = ClaimRef { job, attempt, runner, fence };
        match event.f {
            Op::Claim => claims.push(claim),
            Op::Result => claims.retain(|held| *held != claim),
            _ => {}
        }
    }
    claims
}

/// A client holding one runner's token, and that runner's id.
type RunnerClient = (protocol::client::Client, String);

/// Whether a report is a probe on top of the fault's own act, not another application of
/// it (`value.stale`): one for a claim whose lease has ended, or one aimed at the
/// millisecond its lease ends (`value.aimed_ms`, sent `value.offset_us` from it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    No,
    Stale,
    AtLeaseEnd { end_ms: i64, offset_us: i64 },
}

/// A report the nemesis sends in a runner's name: a result, or (under a borrowed claim) a
/// heartbeat or a capability request.
#[derive(Clone, Copy)]
enum Report {
    Heartbeat,
    Capability,
    Result(Outcome),
}

impl Report {
    fn op(self) -> Op {
        match self {
            Report::Heartbeat => Op::Heartbeat,
            Report::Capability => Op::Capability,
            Report::Result(_) => Op::Result,
        }
    }
}

/// Sends a result for `claim` with the token of `client`'s runner (`value.token_of` in the
/// history; `claim.runner` unless the fault impersonates), recording it as the nemesis's
/// operation.
async fn send_result(
    shared: &Shared,
    fault: &Fault,
    client: &RunnerClient,
    claim: ClaimRef,
    outcome: Outcome,
    try_number: u32,
) {
    send_report(shared, fault, client, &claim, Report::Result(outcome), try_number).await;
}

/// Sends `report` for `claim` with the token of `client`'s runner, recorded as the
/// nemesis's operation: `value.report` names the report's kind, `value.token_of` whose
/// token it carried.
async fn send_report(
    shared: &Shared,
    fault: &Fault,
    client: &RunnerClient,
    claim: &ClaimRef,
    report: Report,
    try_number: u32,
) {
    send_report_as(shared, fault, client, claim, report, try_number, Probe::No).await;
}

/// [`send_report`]; a probe (`value.stale`, see [`Probe`]) is sent on top of the fault's own
/// act, and is not another application of the fault.
async fn send_report_as(
    shared: &Shared,
    fault: &Fault,
    (client, token_of): &RunnerClient,
    claim: &ClaimRef,
    report: Report,
    try_number: u32,
    probe: Probe,
) -> bool {
    let observed_ms = protocol::wall_ms();
    let fill = |event: &mut history::Event| {
        *event = event.clone().with_claim(&claim.job, &claim.attempt, &claim.runner, claim.fence);
        if let Report::Result(outcome) = report {
            event.outcome = Some(outcome.as_str().to_string());
        }
        let mut value = serde_json::to_value(fault).unwrap_or_default();
        value["effective"] = serde_json::Value::from(true);
        value["try"] = serde_json::Value::from(try_number);
        value["token_of"] = serde_json::Value::from(token_of.as_str());
        value["report"] = serde_json::Value::from(report.op().as_str());
        if probe != Probe::No {
            value["stale"] = serde_json::Value::from(true);
        }
        if let Probe::AtLeaseEnd { end_ms, offset_us } = probe {
            value["aimed_ms"] = serde_json::Value::from(end_ms);
            value["offset_us"] = serde_json::Value::from(offset_us);
        }
        event.value = Some(value);
    };
    shared.recorder.record(Process::NEMESIS, EventType::Invoke, fault.kind.op(), fill);
    let claim = claim.clone();
    let answer = match report {
        Report::Heartbeat => client.heartbeat(&protocol::HeartbeatRequest { claim, observed_ms }).await,
        Report::Capability => client.capability(&protocol::CapabilityRequest { claim, observed_ms }).await,
        Report::Result(outcome) => client.result(&ResultRequest { claim, outcome, observed_ms, detail: None }).await,
    };
    let kind = match &answer {
        Ok(_) => EventType::Ok,
        Err(error) if error.outcome_unknown() => EventType::Info,
        Err(_) => EventType::Fail,
    };
    shared.recorder.record(Process::NEMESIS, kind, fault.kind.op(), |event| {
        fill(event);
        match &answer {
            Ok(verdict) => {
                *event = event.clone().with_decision(verdict.decision, verdict.reason);
                // The ledger entry the control plane says records it, as a runner logs it.
                if let Some(value) = event.value.as_mut() {
                    value["ledger_seq"] = serde_json::Value::from(verdict.ledger_seq);
                }
            }
            Err(error) => event.reason = Some(error.to_string()),
        }
    });
    answer.is_ok_and(|verdict| verdict.decision == history::Decision::Accepted)
}

/// Reports another runner's current claim — its job, attempt and fence — under runner
/// `index`'s own id and token: a heartbeat, a capability request and a result (failed).
/// The claim is not the reporter's, so the control plane must refuse each
/// (`not_current`) and accept none.
async fn borrow(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let Some((client, owned)) = claim_of_another(shared, fault, try_number, "borrow").await else {
        return Started::Ineffective;
    };
    let borrowed = ClaimRef { runner: client.1.clone(), ..owned };
    for report in [Report::Heartbeat, Report::Capability, Report::Result(Outcome::Failed)] {
        send_report(shared, fault, &client, &borrowed, report, try_number).await;
    }
    Started::Sent
}

/// The running attempts the control plane holds now.
pub(crate) async fn running_claims(operator: &protocol::client::Client) -> Vec<ClaimRef> {
    running_claims_knowing(operator, &mut std::collections::HashMap::new()).await
}

/// [`running_claims`], reading a running job whole only when the list names a current
/// attempt `known` does not hold (or names none); `known` is left holding this read's.
async fn running_claims_knowing(
    operator: &protocol::client::Client,
    known: &mut std::collections::HashMap<(String, String), ClaimRef>,
) -> Vec<ClaimRef> {
    let mut claims = Vec::new();
    let mut now_known = std::collections::HashMap::new();
    for job in operator.jobs().await.unwrap_or_default() {
        if job.state != protocol::JobState::Running {
            continue;
        }
        let seen = job.current_attempt.as_ref().and_then(|attempt| known.remove(&(job.id.clone(), attempt.clone())));
        let claim = match seen {
            Some(claim) => claim,
            None => {
                let Ok(view) = operator.job(&job.id).await else { continue };
                let Some(attempt) = view.attempts.iter().find(|attempt| attempt.current) else { continue };
                let (attempt, runner, fence) = (attempt.id.clone(), attempt.runner.clone(), attempt.fence);
                ClaimRef { job: view.id.clone(), attempt, runner, fence }
            }
        };
        now_known.insert((claim.job.clone(), claim.attempt.clone()), claim.clone());
        claims.push(claim);
    }
    *known = now_known;
    claims
}

/// The running claims as every waiting fault sees them: read at most once per
/// [`CLAIMS_FRESH_MS`] (or per the last read's own duration, when longer), however many
/// faults wait, so that a hundred faults waiting on a hundred runners cost the control
/// plane what one does.
async fn shared_claims(shared: &Shared, operator: &protocol::client::Client) -> Arc<Vec<ClaimRef>> {
    let mut view = shared.claims.lock().await;
    let fresh = Duration::from_millis(CLAIMS_FRESH_MS).max(view.took);
    if let Some(read_at) = view.read_at {
        if read_at.elapsed() < fresh {
            return view.claims.clone();
        }
    }
    let started = tokio::time::Instant::now();
    let claims = running_claims_knowing(operator, &mut view.known).await;
    view.took = started.elapsed();
    view.read_at = Some(tokio::time::Instant::now());
    view.claims = Arc::new(claims);
    view.claims.clone()
}

/// How long a read of the running claims serves every waiting fault.
const CLAIMS_FRESH_MS: u64 = 50;

/// The last read of the running claims (see [`shared_claims`]).
#[derive(Default)]
pub struct ClaimsView {
    read_at: Option<tokio::time::Instant>,
    took: Duration,
    claims: Arc<Vec<ClaimRef>>,
    known: std::collections::HashMap<(String, String), ClaimRef>,
}

/// Reports runner `index`'s current claim as the result of another running job whose fence
/// is lower: a report scoped to the wrong job, carrying a fence that looks newer.
async fn cross(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    let (operator, client) = runner_client(shared, index).await;
    let runner_id = client.1.clone();
    let pair = |claims: &[ClaimRef]| {
        let own = claims.iter().filter(|claim| claim.runner == runner_id).max_by_key(|claim| claim.fence)?.clone();
        // The telling cross: another job whose current fence is below the reporter's, so a
        // bare number comparison would take the report for a newer claim of that job.
        let other = claims
            .iter()
            .filter(|claim| claim.job != own.job && claim.fence < own.fence)
            .min_by_key(|claim| claim.fence)?
            .clone();
        Some((own, other))
    };
    let Some((own, other)) = awaited(shared, &operator, pair).await else {
        let why = "no running job of another job with a lower fence to cross within 2 leases".to_string();
        record_start(&shared.recorder, fault, try_number, Err(why), false);
        return Started::Ineffective;
    };
    let crossed = ClaimRef { job: other.job.clone(), ..own.clone() };
    send_result(shared, fault, &client, crossed, Outcome::Succeeded, try_number).await;
    Started::Sent
}

/// How long a fault looks for the claims it needs before the try is ineffective: 2 leases.
fn claim_wait_ms(shared: &Shared) -> u64 {
    2 * shared.config.lease_ms
}

/// What `pick` finds among the running claims, looked for (every 50 ms) for at most
/// [`claim_wait_ms`], as a fault on a runner waits for its runner to hold a claim.
async fn awaited<T>(
    shared: &Shared,
    operator: &protocol::client::Client,
    pick: impl Fn(&[ClaimRef]) -> Option<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(claim_wait_ms(shared));
    loop {
        if let Some(found) = pick(&shared_claims(shared, operator).await) {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The operator's client, and a client with runner `index`'s token.
async fn runner_client(shared: &Shared, index: usize) -> (protocol::client::Client, RunnerClient) {
    let cluster = shared.cluster.lock().await;
    let slot = &cluster.runners[index];
    let operator = cluster.system.operator.clone();
    let client = operator.with_token(&slot.token);
    (operator, (client, slot.id.clone()))
}

/// Reports another runner's current claim as failed with runner `index`'s token: a report
/// by a runner that does not hold the claim. The control plane must refuse it
/// (`runner_mismatch`) and record nothing.
async fn impersonate(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let Some((client, victim)) = claim_of_another(shared, fault, try_number, "report for").await else {
        return Started::Ineffective;
    };
    send_result(shared, fault, &client, victim, Outcome::Failed, try_number).await;
    Started::Sent
}

/// A client with the token of the fault's runner, and the running claim (lowest fence) of
/// another runner, looked for during up to 2 leases; when there is none the try is
/// recorded as ineffective (nothing to `purpose`).
async fn claim_of_another(
    shared: &Shared,
    fault: &Fault,
    try_number: u32,
    purpose: &str,
) -> Option<(RunnerClient, ClaimRef)> {
    let index = runner(fault);
    let (operator, client) = runner_client(shared, index).await;
    let others = |claims: &[ClaimRef]| {
        claims.iter().filter(|claim| claim.runner != client.1).min_by_key(|claim| claim.fence).cloned()
    };
    let found = awaited(shared, &operator, others).await;
    if found.is_none() {
        let why = format!("no running claim of a runner other than r{} to {purpose} within 2 leases", index + 1);
        record_start(&shared.recorder, fault, try_number, Err(why), false);
    }
    Some((client, found?))
}

/// Heals everything: toxics removed and proxies enabled, paused runners continued, clocks
/// true, killed runners started again.
pub(crate) async fn heal_all(cluster: &Arc<Mutex<Cluster>>) -> Result<(), String> {
    // A partition's rules go with its fault's task; any left are removed here all the same.
    let _ = tokio::task::spawn_blocking(system::packets::remove_own).await;
    let mut cluster = cluster.lock().await;
    cluster.proxy.reset().await.map_err(|error| error.to_string())?;
    for replica in 0..cluster.system.replicas.len() {
        if cluster.system.launch.replica_clock.is_some() {
            cluster.set_replica_clock(replica, 0).map_err(|error| error.to_string())?;
        }
        cluster.system.start_replica(replica).await.map_err(|error| error.to_string())?;
    }
    if cluster.system.launch.target_clock.is_some() {
        cluster.set_target_clock(0).map_err(|error| error.to_string())?;
    }
    for index in 0..cluster.runners.len() {
        // A system whose runner clocks cannot be moved has none to set back.
        if cluster.clock != super::cluster::ClockControl::Fixed {
            cluster.set_clock(index, 0).map_err(|error| error.to_string())?;
        }
        cluster.runners[index].paused_by_nemesis = false;
        if cluster.runners[index].process.is_none() {
            cluster.start_runner(index).map_err(|error| error.to_string())?;
        }
        if !cluster.runners[index].frozen_by_operator {
            cluster.signal_runner(index, libc::SIGCONT);
        }
    }
    Ok(())
}

/// Between two looks at whether a held step has come late enough.
const HOLD_POLL_MS: u64 = 50;

/// Holds one of runner `index`'s target steps in the network and cuts its control link, so
/// that the step reaches the target after its attempt lost its authority: a latency toxic
/// on its target link catches the next step it sends (the start records which), and the
/// toxic is removed — releasing the step at once — when the step has become late enough:
///
/// - a late step, [`LATE_STEP_PAST_END_MS`] after the attempt's lease ended on the wall
///   clock (the lease end the control plane shows, read again at the release to see that it
///   held), or a tenth of a lease after the control plane no longer holds the attempt
///   running, whichever comes first: it lands before the job is reconciled and another
///   attempt writes its key, and as close to the lease's end as the checks can tell it
///   from a step on time, where a capability judged in coarse units still counts as live;
/// - a delayed step, once the target applied a newer fence on the attempt's key.
///
/// The toxic's latency bounds the hold either way; the release is recorded with what was
/// seen (or that it was not). A runner that sends no step within a lease had nothing to
/// hold: the toxic is removed and the try is ineffective.
async fn hold_step(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    let lease_ms = shared.config.lease_ms;
    let (operator, (_, runner_id)) = runner_client(shared, index).await;
    let ineffective = |why: String| {
        record_start(&shared.recorder, fault, try_number, Err(why), false);
        Started::Ineffective
    };
    let (log, target) = {
        let cluster = shared.cluster.lock().await;
        (cluster.system.runner_log(&runner_id), cluster.target_client(Duration::from_millis(lease_ms)))
    };
    let latency_ms = match fault.variant {
        Variant::DelayedStep { latency_ms } | Variant::LateStep { latency_ms } => latency_ms,
        _ => unreachable!("a held step"),
    };
    let name = toxic_name(fault);
    let link = target_link(index);
    let held = ToxicKind::Latency { latency_ms, jitter_ms: 0 };
    let added =
        shared.cluster.lock().await.proxy.add_toxic(&link, &Toxic::new(held).on(Stream::Upstream).named(&name)).await;
    if let Err(error) = added {
        return ineffective(format!("the target link cannot be slowed: {error}"));
    }
    // The log is read only once the toxic is in place: a step logged after this was sent
    // after it too (a runner logs a request before sending it), so it is held. Read
    // before, a step sent while the toxic was being added (the cluster's lock can take a
    // while under load) passed unheld and was taken for the held one.
    let seen = std::fs::read_to_string(&log).map_or(0, |text| text.lines().count());
    // Whichever claim the runner holds by now: the step its log shows names it.
    let Some((claim, key, step)) = step_sent(&log, seen, Duration::from_millis(lease_ms), |_| true).await else {
        let removed = shared.cluster.lock().await.proxy.remove_toxic(&link, &name).await;
        let removed = removed.map_or_else(|error| format!("; removing its toxic failed: {error}"), |()| String::new());
        return ineffective(format!("runner r{} sent no step within {lease_ms} ms{removed}", index + 1));
    };
    let cut = shared.cluster.lock().await.control_set_enabled(index, false).await.map_err(|error| error.to_string());
    let mut fields = effect(cut.is_ok(), try_number);
    fields.insert("held".into(), serde_json::json!({"attempt": claim.attempt, "step": step, "key": key}));
    record_with(&shared.recorder, fault, "start", cut, fields);
    let bound = tokio::time::Instant::now() + Duration::from_millis(latency_ms);
    let late = matches!(fault.variant, Variant::LateStep { .. });
    let mut steps_read = 0;
    let seen_late = loop {
        let why = if late {
            late_step_due(&operator, &claim, lease_ms).await
        } else {
            newer_fence_applied(target.as_ref(), &mut steps_read, &key, claim.fence).await
        };
        if why.is_some() || tokio::time::Instant::now() >= bound {
            break why;
        }
        tokio::time::sleep(Duration::from_millis(HOLD_POLL_MS)).await;
    };
    let released = shared.cluster.lock().await.proxy.remove_toxic(&link, &name).await;
    let mut fields = serde_json::Map::new();
    let because = seen_late.unwrap_or_else(|| {
        let awaited = if late { "the attempt's lease to end" } else { "a newer fence on its key" };
        format!("held its whole {latency_ms} ms without seeing {awaited}")
    });
    fields.insert("released".into(), because.into());
    record_with(&shared.recorder, fault, "release", released.map_err(|error| error.to_string()), fields);
    Started::Window
}

/// Moves runner `index`'s wall clock back and cuts its control link while it is between two
/// steps of an attempt, for the fault's window: its renewals are lost while its wall clock
/// says its lease has long to run, and only a deadline kept on its monotonic clock stops
/// it. The runner is caught sending a step that is not its attempt's last (its log shows
/// which; waited for at most 2 leases), so that it has another step to ask a capability for
/// while it is cut. The link is cut first and the clock moved after it, and at the heal the
/// clock is set true first and the link enabled after it, so that no report reaches the
/// control plane stamped by the moved clock. The start is recorded, and the window timed,
/// from the clock's move: the proxy may be slow to cut the link on a loaded host, and a
/// start recorded after it would leave the runner's requests read on the moved clock before
/// the start, and the window short of the fault's length. The start names the step
/// (`value.between`); a runner that sends no such step within 2 leases had nothing to hit,
/// and the try is ineffective.
async fn backward_jump(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    let Variant::BackwardJump { offset_ms } = fault.variant else { unreachable!("a backward jump") };
    let lease_ms = shared.config.lease_ms;
    let log = {
        let cluster = shared.cluster.lock().await;
        cluster.system.runner_log(&cluster.runners[index].id)
    };
    let seen = std::fs::read_to_string(&log).map_or(0, |text| text.lines().count());
    let not_last = |value: &serde_json::Value| {
        let number = |field: &str| value.get(field).and_then(serde_json::Value::as_u64);
        number("step").zip(number("steps")).is_some_and(|(step, steps)| step + 1 < steps)
    };
    let Some((claim, _, step)) = step_sent(&log, seen, Duration::from_millis(2 * lease_ms), not_last).await else {
        let why = format!("runner r{} sent no step but its attempt's last within {} ms", index + 1, 2 * lease_ms);
        record_start(&shared.recorder, fault, try_number, Err(why), false);
        return Started::Ineffective;
    };
    let moved = {
        let cluster = shared.cluster.lock().await;
        let cut = cluster.control_set_enabled(index, false).await.map_err(|error| error.to_string());
        cut.and_then(|()| cluster.set_clock(index, offset_ms).map_err(|error| error.to_string()))
    };
    let started = tokio::time::Instant::now();
    let mut fields = effect(moved.is_ok(), try_number);
    fields.insert("between".into(), serde_json::json!({"attempt": claim.attempt, "step": step}));
    record_with(&shared.recorder, fault, "start", moved, fields);
    tokio::time::sleep_until(started + Duration::from_millis(fault.duration_ms)).await;
    let healed = {
        let cluster = shared.cluster.lock().await;
        let clock = cluster.set_clock(index, 0).map_err(|error| error.to_string());
        clock.and(cluster.control_set_enabled(index, true).await.map_err(|error| error.to_string()))
    };
    record_with(&shared.recorder, fault, "heal", healed, serde_json::Map::new());
    Started::Done
}

/// The first step request runner's log shows after its first `seen` lines for which `wanted`
/// holds (given its `value`: `step` and `steps`) — its claim, deployment key and step number
/// — waiting at most `bound` for one.
async fn step_sent(
    log: &std::path::Path,
    seen: usize,
    bound: Duration,
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> Option<(ClaimRef, String, u64)> {
    let deadline = tokio::time::Instant::now() + bound;
    let step_wanted = |event: &history::Event| {
        let value = event.value.as_ref().unwrap_or(&serde_json::Value::Null);
        event.kind == EventType::Request && event.f == Op::Step && wanted(value)
    };
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let mut events = text.lines().skip(seen).filter_map(|line| serde_json::from_str::<history::Event>(line).ok());
        let sent = events.find(&step_wanted);
        if let Some(event) = sent {
            let step = event.value.as_ref().and_then(|value| value["step"].as_u64()).unwrap_or(0);
            let claim =
                ClaimRef { job: event.job?, attempt: event.attempt?, runner: event.runner?, fence: event.fence? };
            return Some((claim, event.key?, step));
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(HOLD_POLL_MS / 5)).await;
    }
}

/// How long after a lease's end (on the wall clock) a late step is released: just past the
/// tolerance `stale-side-effect` gives the target's and the lease's clocks, so that a step
/// the target applies is one the checks call late, and as close to the end as that allows.
pub const LATE_STEP_PAST_END_MS: i64 = checkers::stale_side_effect::CLOCK_TOLERANCE_MS + 5;

/// Why `claim`'s attempt no longer holds a lease, when the control plane says so: it no
/// longer holds the attempt running.
async fn lease_ended(operator: &protocol::client::Client, claim: &ClaimRef) -> Option<String> {
    let view = operator.job(&claim.job).await.ok()?;
    let attempt = view.attempts.iter().find(|attempt| attempt.id == claim.attempt)?;
    closed(attempt)
}

/// Why an attempt no longer holds a lease: the control plane holds it not running.
fn closed(attempt: &protocol::AttemptView) -> Option<String> {
    let state = serde_json::to_value(attempt.state).ok()?;
    (attempt.state != protocol::AttemptState::Running)
        .then(|| format!("the control plane holds {} {}: its lease ended", attempt.id, state.as_str().unwrap_or("?")))
}

/// Whether a step held for `claim`'s attempt is to be released now (why), by the control
/// plane's view of the attempt: once the wall clock is [`LATE_STEP_PAST_END_MS`] past its
/// lease's end. A running attempt is released only when its end is at most a poll away,
/// waited for, and read again unmoved (a renewal that landed meanwhile moved it: not yet);
/// a closed one at once if its end is past, or at most a tenth of a lease later. A view
/// with no lease end (a system that grants none) is released a tenth of a lease after the
/// attempt closed.
async fn late_step_due(operator: &protocol::client::Client, claim: &ClaimRef, lease_ms: u64) -> Option<String> {
    let view = |job: protocol::JobView| job.attempts.into_iter().find(|attempt| attempt.id == claim.attempt);
    let attempt = view(operator.job(&claim.job).await.ok()?)?;
    let closed = closed(&attempt);
    let tenth_ms = (lease_ms / 10) as i64;
    let Some(end_ms) = attempt.lease_expires_ms else {
        let why = closed?;
        tokio::time::sleep(Duration::from_millis(lease_ms / 10)).await;
        return Some(format!("{why}; released a tenth of a lease after"));
    };
    let release_ms = end_ms + LATE_STEP_PAST_END_MS;
    let now_ms = protocol::wall_ms();
    if let Some(why) = closed {
        protocol::clock::sleep_until_wall_ms(release_ms.min(now_ms + tenth_ms)).await;
        return Some(format!("{why}; its lease ended at {end_ms} ms (wall clock)"));
    }
    if now_ms + (HOLD_POLL_MS as i64) < release_ms {
        return None;
    }
    protocol::clock::sleep_until_wall_ms(release_ms).await;
    let again = view(operator.job(&claim.job).await.ok()?)?;
    (again.lease_expires_ms == Some(end_ms)).then(|| {
        format!("{}'s lease ended at {end_ms} ms (wall clock): released {LATE_STEP_PAST_END_MS} ms after", attempt.id)
    })
}

/// Which newer fence the target applied on `key`, when it has applied one above `fence`,
/// reading its step log from record `read` on (and moving `read` past what it read).
async fn newer_fence_applied(
    target: Option<&protocol::client::Client>,
    read: &mut usize,
    key: &str,
    fence: u64,
) -> Option<String> {
    let steps = target?.steps_after(*read).await.ok()?;
    *read += steps.len();
    let newer = steps.iter().filter(|step| step.applied && step.deployment_key == key && step.fence > fence);
    newer.map(|step| step.fence).max().map(|newer| format!("the target applied fence {newer} on {key}"))
}

/// Most time a one-sided reset waits for a connection to reset: one lease (a runner that
/// opens a connection per request is caught in its next request).
fn reset_wait_ms(shared: &Shared) -> u64 {
    shared.config.lease_ms
}

/// How many connections fault `fault`'s one-sided reset has reset, over all of its runner's
/// control links (0 for a link the proxy cannot say of).
async fn resets(shared: &Shared, fault: &Fault) -> u64 {
    let (links, proxy) = {
        let cluster = shared.cluster.lock().await;
        (cluster.control_link_names(runner(fault)), cluster.proxy.clone())
    };
    let name = toxic_name(fault);
    let mut total = 0;
    for link in links {
        total += proxy.resets(&link, &name).await.unwrap_or(0);
    }
    total
}

/// Makes runner `index`'s connections to the control plane half-open: a one-sided reset
/// (the proxy's `reset_upstream` for the control plane's side, `reset_downstream` for the
/// runner's) on every one of its control links resets one side of each connection open
/// there and keeps the other open and silent until the heal removes it. The start waits (at
/// most a lease) until a connection was reset and records how many (`value.resets`); none
/// is an ineffective try, and the toxic is removed.
async fn half_open(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    let kind = match fault.variant {
        Variant::ResetControlSide => ToxicKind::ResetUpstream,
        _ => ToxicKind::ResetDownstream,
    };
    let toxic = Toxic::new(kind).named(toxic_name(fault));
    let added = shared.cluster.lock().await.control_add_toxic(index, &toxic).await;
    if let Err(error) = added {
        let _ = shared.cluster.lock().await.control_remove_toxic(index, &toxic.name).await;
        record_start(&shared.recorder, fault, try_number, Err(error.to_string()), false);
        return Started::Done;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(reset_wait_ms(shared));
    let mut reset = resets(shared, fault).await;
    while reset == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(HOLD_POLL_MS)).await;
        reset = resets(shared, fault).await;
    }
    if reset == 0 {
        let removed = shared.cluster.lock().await.control_remove_toxic(index, &toxic.name).await;
        let removed = removed.map_or_else(|error| format!("; removing its toxic failed: {error}"), |()| String::new());
        let why = format!(
            "runner r{} had no connection to the control plane open, nor opened one, within {} ms: nothing to \
             reset{removed}",
            index + 1,
            reset_wait_ms(shared)
        );
        record_start(&shared.recorder, fault, try_number, Err(why), false);
        return Started::Ineffective;
    }
    let mut fields = effect(true, try_number);
    fields.insert("resets".into(), reset.into());
    record_with(&shared.recorder, fault, "start", Ok(()), fields);
    Started::Window
}

/// Partitions runner `index` from the control plane at the packet level: iptables rules on
/// loopback drop every TCP packet to and from the listening ports of its control links
/// (`system::packets`), for the fault's window; then the rules are removed. The rules live
/// in this task: aborted (the run's end, Ctrl-C), they are removed as it is dropped. The
/// start records the rules (`value.rules`); a host that cannot install them records why,
/// and the fault ends there.
async fn partition(shared: &Shared, fault: &Fault, try_number: u32) -> Started {
    let index = runner(fault);
    let started = tokio::time::Instant::now();
    let (links, proxy) = {
        let cluster = shared.cluster.lock().await;
        (cluster.control_link_names(index), cluster.proxy.clone())
    };
    let mut ports = Vec::with_capacity(links.len());
    for link in &links {
        match proxy.proxy(link).await.and_then(|info| info.listen_addr()) {
            Ok(addr) => ports.push(addr.port()),
            Err(error) => {
                let why = format!("{link}: its listening port cannot be read: {error}");
                record_start(&shared.recorder, fault, try_number, Err(why), false);
                return Started::Done;
            }
        }
    }
    let installed = tokio::task::spawn_blocking(move || system::packets::Partition::install(&ports)).await;
    let rules = match installed {
        Ok(Ok(rules)) => rules,
        Ok(Err(why)) => {
            record_start(&shared.recorder, fault, try_number, Err(why.to_string()), false);
            return Started::Done;
        }
        Err(error) => {
            record_start(&shared.recorder, fault, try_number, Err(error.to_string()), false);
            return Started::Done;
        }
    };
    let mut fields = effect(true, try_number);
    let described: Vec<String> = rules.rules().iter().map(system::packets::Rule::describe).collect();
    fields.insert("rules".into(), described.into());
    record_with(&shared.recorder, fault, "start", Ok(()), fields);
    tokio::time::sleep_until(started + Duration::from_millis(fault.duration_ms)).await;
    let removed = tokio::task::spawn_blocking(move || rules.remove()).await;
    let removed =
        removed.map_err(|error| error.to_string()).and_then(|removed| removed.map_err(|error| error.to_string()));
    record_with(&shared.recorder, fault, "heal", removed, serde_json::Map::new());
    Started::Done
}
