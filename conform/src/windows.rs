//! The window between a lease's end on the server's clock and the moment the server shows
//! it: a report sent just after the end, before any sweep marked the attempt uncertain, must
//! be refused as `expired` exactly as one sent later. A system that leaves lease ends to a
//! periodic sweeper and judges reports on the attempt's state alone accepts them here, and
//! the cases that wait until the server shows the lapse never see it.
//!
//! Each case claims a job, waits on this host's wall clock (the server's, on one host) until
//! just past the granted `lease_expires_ms`, and sends one report at once. Where the ledger
//! shows the attempt was expired before the report was received (a sweep came first), the
//! try probed nothing and is made again; every try refused as it must be and every one
//! beaten by a sweep passes, saying so.

use std::time::Duration;

use history::{Decision, Op, Reason, RecordedAs};
use protocol::*;

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::session::{now_ms, said, Runner, Session};
use system::Feature;

/// How far past the lease's end (ms, server clock) the report is sent: the end itself is
/// already lapsed (a lease ending at `now` is over); a little more covers clock reading.
const PAST_END_MS: i64 = 2;

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

/// Sleeps until this host's wall clock reads at least `until_ms`.
async fn sleep_until_ms(until_ms: i64) {
    let left_ms = until_ms.saturating_sub(now_ms());
    if left_ms > 0 {
        tokio::time::sleep(Duration::from_millis(left_ms as u64)).await;
    }
    while now_ms() < until_ms {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Most tries of a window case. A try that a sweep beat probed nothing; when every try
/// was beaten, every report was still refused as it must be, and the case passes saying
/// that the window was narrower here than a report's way to the server.
const WINDOW_TRIES_MAX: u32 = 6;

async fn at_lease_end(s: &Session, case: Case, report: Op) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let mut swept = Vec::new();
    for n in 1..=WINDOW_TRIES_MAX {
        let job = case.id(&format!("j{n}"));
        s.submit(&team.project, &job, &case.id(&format!("k{n}")), 1).await?;
        let grant = runner.claim_some().await?;
        // The wait is bounded by the lease policy: a grant whose lease ends later is a
        // finding, not a reason to wait.
        let left_ms = grant.lease_expires_ms.saturating_sub(now_ms());
        ensure(left_ms <= 2 * s.lease_ms as i64, || {
            format!(
                "{} was granted a lease ending {left_ms} ms from now, past the {} ms lease policy",
                grant.claim.attempt, s.lease_ms
            )
        })?;
        sleep_until_ms(grant.lease_expires_ms + PAST_END_MS).await;
        let ruling = send(runner, &grant.claim, report).await?;
        judge(s, &job, &grant, report, &ruling).await?;
        match swept_first(s, &job, &ruling).await? {
            Some(why) => swept.push(why),
            None => {
                return Ok(format!(
                "a {} for {} sent {PAST_END_MS} ms after its lease ended at {} (server clock), before any sweep: {}",
                report.as_str(),
                grant.claim.attempt,
                grant.lease_expires_ms,
                said(&ruling)
            ))
            }
        }
    }
    Ok(format!(
        "each of {WINDOW_TRIES_MAX} {}s sent {PAST_END_MS} ms after its lease ended was refused (expired), but a sweep came first every time ({}): the window is narrower here than a report's way to the server",
        report.as_str(),
        swept.join("; ")
    ))
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
