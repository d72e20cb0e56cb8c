//! The window between a lease's end on the server's clock and the moment the server shows
//! it: a report sent just after the end, before any sweep marked the attempt uncertain, must
//! be refused as `expired` exactly as one sent later. A system that leaves lease ends to a
//! periodic sweeper and judges reports on the attempt's state alone accepts them here, and
//! the cases that wait until the server shows the lapse never see it.
//!
//! Each case claims a job, waits on this host's wall clock (the server's, on one host) until
//! it turns to the granted `lease_expires_ms`, and sends one report at once: a lease ending
//! at `now` is over, so even a report received in that very millisecond must be refused (a
//! system that takes a lease's end as still inside it accepts it there). Where the ledger
//! shows the attempt was expired before the report was received (a sweep came first), or
//! the report received after that millisecond, the try probed less than it could and is
//! made again; every try must be refused, and the case says which millisecond it reached.

use history::{Decision, Op, Reason, RecordedAs};
use protocol::*;

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::session::{now_ms, said, Runner, Session};
use system::Feature;

pub fn defs() -> Vec<Def> {
    vec![
        Def {
            name: "window/heartbeat-at-lease-end",
            needs: &[],
            run: |s, c| Box::pin(at_lease_end(s, c, Op::Heartbeat)),
        },
        Def {
            name: "window/capability-at-lease-end",
            needs: &[Feature::Capabilities],
            run: |s, c| Box::pin(at_lease_end(s, c, Op::Capability)),
        },
        Def { name: "window/result-at-lease-end", needs: &[], run: |s, c| Box::pin(at_lease_end(s, c, Op::Result)) },
    ]
}

/// Sends `report` for `claim` from `runner`.
async fn send(runner: &Runner, claim: &ClaimRef, report: Op) -> Result<Ruling, Finding> {
    match report {
        Op::Heartbeat => runner.heartbeat(claim, now_ms()).await,
        Op::Capability => runner.capability(claim, now_ms()).await,
        _ => runner.result(claim, Outcome::Succeeded, now_ms()).await,
    }
}

/// Most tries of a window case. Each is sent ahead of the lease's end by the quickest way to
/// the server a try has taken (the receipt its ledger entry names less the send), so as to
/// arrive in the end's very millisecond. A try received inside the lease, or beaten by a sweep, probed
/// nothing, and one received after that millisecond probed less than it could; every try
/// received at or past the end must be refused, and when none reached the end's
/// millisecond the case passes saying how close it came.
const WINDOW_TRIES_MAX: u32 = 8;

/// Most a try is sent ahead of the lease's end, whatever the last try's way to the server.
const LEAD_MAX_MS: i64 = 50;

async fn at_lease_end(s: &Session, case: Case, report: Op) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (mut swept, mut early) = (Vec::new(), 0);
    let mut past_end = None;
    // How long before the end to send: the quickest way to the server a try has taken so far,
    // by its ledger entry (a try slowed by load would send the next one too early).
    let mut lead_ms: Option<i64> = None;
    for n in 1..=WINDOW_TRIES_MAX {
        let job = case.id(&format!("j{n}"));
        s.submit(&team.project, &job, &case.id(&format!("k{n}")), 1).await?;
        let grant = runner.claim_some().await?;
        let end_ms = grant.lease_expires_ms;
        // The wait is bounded by the lease policy: a grant whose lease ends later is a
        // finding, not a reason to wait.
        let left_ms = end_ms.saturating_sub(now_ms());
        ensure(left_ms <= 2 * s.lease_ms as i64, || {
            format!(
                "{} was granted a lease ending {left_ms} ms from now, past the {} ms lease policy",
                grant.claim.attempt, s.lease_ms
            )
        })?;
        protocol::clock::sleep_until_wall_ms(end_ms - lead_ms.unwrap_or(0)).await;
        let sent_ms = now_ms();
        let ruling = send(runner, &grant.claim, report).await?;
        let received = received_ms(s, &job, &ruling).await?;
        if let Some(at) = received {
            let way_ms = (at - sent_ms).clamp(0, LEAD_MAX_MS);
            lead_ms = Some(lead_ms.map_or(way_ms, |lead| lead.min(way_ms)));
            if at < end_ms {
                early += 1; // received inside its lease: the try probed nothing
                continue;
            }
        }
        judge(s, &job, &grant, report, &ruling).await?;
        if let Some(why) = swept_first(s, &job, &ruling).await? {
            swept.push(why);
            continue;
        }
        let receipt = match received {
            Some(at) if at == end_ms => "received in that very millisecond".to_string(),
            Some(at) => {
                past_end = Some(format!("{} (received {} ms past it)", said(&ruling), at - end_ms));
                continue;
            }
            None => "its receipt unknown (no ledger)".to_string(),
        };
        return Ok(format!(
            "a {} for {} sent as its lease ended at {end_ms} (server clock), before any sweep, {receipt}: {}",
            report.as_str(),
            grant.claim.attempt,
            said(&ruling)
        ));
    }
    let plural = match report {
        Op::Heartbeat => "heartbeats",
        Op::Capability => "capability requests",
        _ => "results",
    };
    let tried = format!("of {WINDOW_TRIES_MAX} {plural} aimed at their lease's end, {early} arrived inside the lease");
    if let Some(closest) = past_end {
        return Ok(format!(
            "{tried} and every other was refused (expired), none received in the lease's last millisecond itself; the last: {closest}"
        ));
    }
    Ok(format!(
        "{tried} and every other was refused (expired), but a sweep came first each time ({}): the window is narrower here than a report's way to the server",
        swept.join("; ")
    ))
}

/// When the server received the report its ruling names, by its ledger entry (`None`
/// without a ledger).
async fn received_ms(s: &Session, job: &str, ruling: &Ruling) -> Result<Option<i64>, Finding> {
    if !s.provides.ledger {
        return Ok(None);
    }
    let view = s.view(job).await?;
    Ok(view.ledger.iter().find(|entry| entry.seq == ruling.ledger_seq).map(|entry| entry.received_ms))
}

/// Why the try probed nothing: the ledger shows the attempt expired before the report was
/// received (a sweep, not the report's own judgement, found the lapse). `None` when the
/// report reached the window, or when the system keeps no ledger to tell.
async fn swept_first(s: &Session, job: &str, ruling: &Ruling) -> Result<Option<String>, Finding> {
    if !s.provides.ledger {
        return Ok(None);
    }
    let view = s.view(job).await?;
    let Some(entry) = view.ledger.iter().find(|entry| entry.seq == ruling.ledger_seq) else {
        return Ok(None);
    };
    let expired = view.ledger.iter().find(|other| other.kind == Op::Expire && other.received_ms < entry.received_ms);
    Ok(expired.map(|expired| {
        format!(
            "a sweep expired the attempt at {} before the report's receipt at {}",
            expired.received_ms, entry.received_ms
        )
    }))
}

/// The report must be refused as `expired`: no lease renewed, no capability, a result kept
/// only as a late observation; the job stays unsettled.
async fn judge(s: &Session, job: &str, grant: &Grant, report: Op, ruling: &Ruling) -> Result<(), Finding> {
    let refused = ruling.decision == Decision::Rejected
        && ruling.reason == Some(Reason::Expired)
        && ruling.lease_expires_ms.is_none()
        && ruling.capability.is_none();
    ensure(refused, || {
        format!(
            "a {} sent after {}'s lease ended at {} on the server's clock was {} (lease {:?}), not rejected (expired): a lapsed lease counts from its end, not from when a sweep notices it",
            report.as_str(),
            grant.claim.attempt,
            grant.lease_expires_ms,
            said(ruling),
            ruling.lease_expires_ms
        )
    })?;
    let view = s.view(job).await?;
    ensure(view.outcome.is_none() && view.state != JobState::Running, || {
        format!(
            "after the refused {} job {job} reads {:?} (outcome {:?}): its lease had ended",
            report.as_str(),
            view.state,
            view.outcome
        )
    })?;
    if report == Op::Result && s.provides.ledger {
        let entry = s.entry(job, ruling.ledger_seq).await?;
        ensure(entry.recorded_as == Some(RecordedAs::LateObservation), || {
            format!("the refused result's ledger entry is recorded as {:?}, not late_observation", entry.recorded_as)
        })?;
    }
    Ok(())
}
