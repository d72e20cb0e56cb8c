//! A crash after an acknowledgement: the control plane is SIGKILLed right after it accepted a
//! result and granted a claim, and started again on the same store and port. Nothing it
//! acknowledged may be lost: the result stays committed, the claim stays granted, its ledger
//! entries stay, and fences keep increasing past the last one granted.

use history::{ClosedBy, Decision, Op};
use protocol::*;

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::session::{now_ms, said, tries, Session, Try};
use system::Feature;

pub fn defs() -> Vec<Def> {
    vec![Def {
        name: "restart/acknowledged-survives-kill-9",
        needs: &[Feature::Restart],
        run: |s, c| Box::pin(survives(s, c)),
    }]
}

async fn survives(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (done, ruling, held) = tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            let (job, other) = (case.id(&format!("j{n}")), case.id(&format!("held{n}")));
            s.submit(&team.project, &job, &case.id(&format!("k{n}")), 1).await?;
            s.submit(&team.project, &other, &case.id(&format!("held{n}.key")), 1).await?;
            let done = runner.claim_some().await?.claim;
            let ruling = runner.result(&done, Outcome::Succeeded, now_ms()).await?;
            if ruling.decision != Decision::Accepted {
                return Ok(Try::Late(format!("{}'s result was {}", done.attempt, said(&ruling))));
            }
            let held = runner.claim_some().await?.claim;
            Ok(Try::Done((done, ruling, held)))
        }
    })
    .await?;
    s.restart_control()
        .await
        .map_err(|error| Finding::Fail(format!("the control plane did not come back after SIGKILL: {error}")))?;
    let view = s.view(&done.job).await?;
    let attempt = view.attempts.first();
    let kept = view.state == JobState::Succeeded
        && view.outcome == Some(Outcome::Succeeded)
        && attempt.is_some_and(|a| a.state == AttemptState::Succeeded && a.closed_by == Some(ClosedBy::Result));
    ensure(kept, || {
        format!("after kill -9, job {} whose success was acknowledged (ledger {}) reads {:?} (outcome {:?}, attempt {attempt:?})", done.job, ruling.ledger_seq, view.state, view.outcome)
    })?;
    if s.provides.ledger {
        let entry = view.ledger.iter().find(|entry| entry.seq == ruling.ledger_seq);
        let recorded = entry.is_some_and(|e| {
            e.kind == Op::Result
                && e.decision == Some(Decision::Accepted)
                && e.attempt.as_deref() == Some(done.attempt.as_str())
        });
        ensure(recorded, || {
            format!("after kill -9 ledger entry {} of the acknowledged success reads {entry:?}", ruling.ledger_seq)
        })?;
    }
    let claimed = s.view(&held.job).await?;
    let granted = claimed.attempts.iter().any(|a| a.id == held.attempt && a.fence == held.fence);
    ensure(granted, || {
        format!("after kill -9 the granted claim {} (fence {}) is gone from job {}", held.attempt, held.fence, held.job)
    })?;
    let duplicate = runner.result(&done, Outcome::Succeeded, now_ms()).await?;
    ensure(duplicate.decision == Decision::Duplicate, || {
        format!("after kill -9 a retry of the acknowledged success was {}, not duplicate", said(&duplicate))
    })?;
    let next = case.id("after");
    s.submit(&team.project, &next, &case.id("after.key"), 1).await?;
    let after = runner.claim_some().await?.claim;
    ensure(after.fence > held.fence, || {
        format!("after kill -9 a new claim got fence {}, not above the last granted {}", after.fence, held.fence)
    })?;
    Ok(format!(
        "SIGKILL right after {}'s success was acknowledged (ledger {}) and {} granted (fence {}): after the restart the success, its entry and the claim are there, its retry is a duplicate, and the next fence is {}",
        done.attempt, ruling.ledger_seq, held.attempt, held.fence, after.fence
    ))
}
