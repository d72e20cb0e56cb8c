//! The seed's rules as deterministic single-step cases: a stale completion kept as a late
//! observation, heartbeats that never revive, duplicates against conflicts, the runner's
//! clock deciding nothing, fences scoped to job, runner and project, expiry that never
//! requeues and happens on the server's clock, reconciliation that supersedes. Each case
//! drives the control plane as runners and an operator would, and judges what it answers
//! by the rules of `docs/protocol.md` (which `checkers::rules_model` also replays).

use history::{ClosedBy, Decision, Op, Reason, RecordedAs};
use protocol::Finding as Observed;
use protocol::*;

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::session::{now_ms, report_body, result_body, said, tries, Runner, Session, Try};
use system::Feature;

/// 30 days, ms: how far a runner's clock is moved.
const SKEW_MS: i64 = 30 * 24 * 3_600_000;

pub fn defs() -> Vec<Def> {
    vec![
        Def { name: "rule/stale-completion", needs: &[Feature::Ledger], run: |s, c| Box::pin(stale_completion(s, c)) },
        Def { name: "rule/heartbeat-after-expiry", needs: &[], run: |s, c| Box::pin(heartbeat_after_expiry(s, c)) },
        Def { name: "rule/no-requeue-on-expiry", needs: &[], run: |s, c| Box::pin(no_requeue(s, c)) },
        Def {
            name: "rule/expiry-on-server-clock",
            needs: &[Feature::Ledger],
            run: |s, c| Box::pin(expiry_on_server_clock(s, c)),
        },
        Def { name: "rule/duplicate-result", needs: &[], run: |s, c| Box::pin(duplicate_result(s, c)) },
        Def { name: "rule/conflicting-result", needs: &[], run: |s, c| Box::pin(conflicting_result(s, c)) },
        Def { name: "rule/runner-clock-ahead", needs: &[Feature::Ledger], run: |s, c| Box::pin(clock_ahead(s, c)) },
        Def { name: "rule/runner-clock-behind", needs: &[Feature::Ledger], run: |s, c| Box::pin(clock_behind(s, c)) },
        Def { name: "rule/fence-across-jobs", needs: &[], run: |s, c| Box::pin(across_jobs(s, c)) },
        Def { name: "rule/fence-across-runners", needs: &[], run: |s, c| Box::pin(across_runners(s, c)) },
        Def { name: "rule/fence-across-projects", needs: &[], run: |s, c| Box::pin(across_projects(s, c)) },
        Def { name: "rule/fences-global", needs: &[], run: |s, c| Box::pin(fences_global(s, c)) },
        Def {
            name: "rule/reconcile-supersedes",
            needs: &[Feature::Reconcile],
            run: |s, c| Box::pin(reconcile_supersedes(s, c)),
        },
    ]
}

/// Waits until `job`'s lease lapses and checks expiry made it uncertain, kept its attempt
/// current and uncertain, and closed nothing.
async fn lapse_to_uncertain(s: &Session, job: &str, attempt: &str) -> Result<AttemptView, Finding> {
    let view = s.wait_lapsed(job).await?;
    let current = view.attempts.iter().find(|a| a.id == attempt).cloned();
    let held = view.state == JobState::Uncertain
        && view.current_attempt.as_deref() == Some(attempt)
        && view.attempts.len() == 1
        && current.as_ref().is_some_and(|a| a.state == AttemptState::Uncertain && a.closed_by.is_none() && a.current);
    ensure(held, || {
        format!(
            "when {attempt}'s lease lapsed job {job} became {:?} (current {:?}, attempts {:?}): expiry must leave the job and its attempt uncertain, the attempt current and nothing closed",
            view.state,
            view.current_attempt,
            view.attempts.iter().map(|a| format!("{} {:?} {:?}", a.id, a.state, a.closed_by)).collect::<Vec<_>>()
        )
    })?;
    Ok(current.expect("checked above"))
}

fn is(ruling: &Ruling, decision: Decision, reason: Option<Reason>) -> bool {
    ruling.decision == decision && ruling.reason == reason
}

/// Nothing may be granted to `runner` now: `why` says what holds the key.
async fn granted_nothing(runner: &Runner, why: &str) -> Result<(), Finding> {
    let grant = runner.claim().await?;
    ensure(grant.is_none(), || {
        format!("{} was granted {} while {why}", runner.id, grant.map_or_else(String::new, |g| g.claim.attempt))
    })
}

async fn stale_completion(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 2).await?;
    let (a, b) = (&team.runners[0], &team.runners[1]);
    let (job, next, key) = (case.id("j1"), case.id("j2"), case.id("k1"));
    s.submit(&team.project, &job, &key, 1).await?;
    s.submit(&team.project, &next, &key, 1).await?;
    let grant = a.claim_some().await?;
    ensure(grant.claim.job == job, || format!("A was granted {} before the older {job}", grant.claim.job))?;
    let lapsed = lapse_to_uncertain(s, &job, &grant.claim.attempt).await?;
    granted_nothing(b, &format!("{job} is uncertain: key {key} stays held")).await?;
    let late = a.result(&grant.claim, Outcome::Succeeded, now_ms()).await?;
    ensure(is(&late, Decision::Rejected, Some(Reason::Expired)), || {
        format!("A's success after its lease lapsed was {}, not rejected (expired)", said(&late))
    })?;
    let entry = s.entry(&job, late.ledger_seq).await?;
    let kept = entry.kind == Op::Result
        && entry.decision == Some(Decision::Rejected)
        && entry.recorded_as == Some(RecordedAs::LateObservation)
        && entry.outcome == Some(history::OutcomeWord::Succeeded)
        && entry.attempt.as_deref() == Some(grant.claim.attempt.as_str());
    ensure(kept, || {
        format!("the late success's ledger entry is {entry:?}, not a rejected result kept as late_observation with its outcome")
    })?;
    let view = s.view(&job).await?;
    let attempt_state = view.attempts.first().map(|attempt| attempt.state);
    ensure(
        view.state == JobState::Uncertain && view.outcome.is_none() && attempt_state == Some(AttemptState::Uncertain),
        || {
            format!("after the late success job {job} reads {:?} (outcome {:?}, attempt {attempt_state:?}), not uncertain with no outcome", view.state, view.outcome)
        },
    )?;
    granted_nothing(b, &format!("{job} stays uncertain: key {key} stays held")).await?;
    Ok(format!(
        "{}'s lease lapsed at {} (server clock): the job went uncertain, not queued; A's late success was rejected (expired) and kept as late_observation (ledger {}); the job stayed uncertain and {key} held",
        grant.claim.attempt, lapsed.lease_end_ms(), late.ledger_seq
    ))
}

async fn heartbeat_after_expiry(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let job = case.id("j1");
    s.submit(&team.project, &job, &case.id("k1"), 1).await?;
    let grant = runner.claim_some().await?;
    let lapsed = lapse_to_uncertain(s, &job, &grant.claim.attempt).await?;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let ruling = runner.heartbeat(&grant.claim, now_ms()).await?;
        ensure(is(&ruling, Decision::Rejected, Some(Reason::Expired)) && ruling.lease_expires_ms.is_none(), || {
            format!(
                "a heartbeat after {}'s lease lapsed was {} (lease {:?}), not rejected (expired)",
                grant.claim.attempt,
                said(&ruling),
                ruling.lease_expires_ms
            )
        })?;
        answers.push(said(&ruling));
    }
    let wrong_fence = ClaimRef { fence: grant.claim.fence + 1_000_000, ..grant.claim.clone() };
    let scoped_first = runner.heartbeat(&wrong_fence, now_ms()).await?;
    ensure(is(&scoped_first, Decision::Rejected, Some(Reason::NotCurrent)), || {
        format!("a heartbeat with another fence on the lapsed attempt was {}, not rejected (not_current): scope is judged before expiry", said(&scoped_first))
    })?;
    answers.push(format!("another fence {}", said(&scoped_first)));
    if s.provides.capabilities {
        let ruling = runner.capability(&grant.claim, now_ms()).await?;
        ensure(is(&ruling, Decision::Rejected, Some(Reason::Expired)) && ruling.capability.is_none(), || {
            format!("a capability after the lease lapsed was {}, not rejected (expired)", said(&ruling))
        })?;
        answers.push(format!("capability {}", said(&ruling)));
    }
    let view = s.view(&job).await?;
    let attempt = view.attempts.first();
    let unrevived = view.state == JobState::Uncertain
        && attempt.is_some_and(|a| a.state == AttemptState::Uncertain && a.lease_end_ms() == lapsed.lease_end_ms());
    ensure(unrevived, || {
        format!("after heartbeats on a lapsed lease job {job} reads {:?} with attempt {attempt:?}: nothing revives an uncertain attempt", view.state)
    })?;
    Ok(format!(
        "heartbeats after {}'s lease lapsed at {}: {}; the attempt stays uncertain, its lease unmoved",
        grant.claim.attempt,
        lapsed.lease_end_ms(),
        answers.join(", ")
    ))
}

async fn no_requeue(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 2).await?;
    let other = s.team_named(&case.id("other"), 1).await?;
    let key = case.id("k1");
    let (job, next, elsewhere) = (case.id("j1"), case.id("j2"), case.id("other.j1"));
    s.submit(&team.project, &job, &key, 1).await?;
    s.submit(&team.project, &next, &key, 1).await?;
    s.submit(&other.project, &elsewhere, &key, 1).await?;
    let grant = team.runners[0].claim_some().await?;
    lapse_to_uncertain(s, &job, &grant.claim.attempt).await?;
    granted_nothing(&team.runners[1], &format!("{job} is uncertain and holds {key}")).await?;
    granted_nothing(&other.runners[0], &format!("{job} of another project is uncertain and holds {key}")).await?;
    let view = s.view(&job).await?;
    ensure(view.state == JobState::Uncertain && view.attempts.len() == 1, || {
        format!("job {job} later reads {:?} with {} attempts: expiry never requeues", view.state, view.attempts.len())
    })?;
    if s.provides.ledger {
        let expiries: Vec<&LedgerEntry> = view.ledger.iter().filter(|entry| entry.kind == Op::Expire).collect();
        ensure(expiries.len() == 1 && expiries[0].recorded_as == Some(RecordedAs::Uncertain), || {
            format!(
                "job {job}'s ledger records its expiry as {:?}, not once as uncertain",
                expiries.iter().map(|e| e.recorded_as).collect::<Vec<_>>()
            )
        })?;
        let reconciled = view.ledger.iter().any(|entry| entry.kind == Op::Reconcile);
        ensure(!reconciled, || format!("job {job} was reconciled with no operator's decision"))?;
    }
    Ok(format!(
        "{}'s lease lapsed: the job is uncertain, not requeued, with one attempt; {key} stays held against {next} and against {elsewhere} of another project",
        grant.claim.attempt
    ))
}

async fn expiry_on_server_clock(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let job = case.id("j1");
    s.submit(&team.project, &job, &case.id("k1"), 1).await?;
    let grant = runner.claim_some().await?;
    let renewed = runner.heartbeat(&grant.claim, now_ms()).await?;
    s.wait_lapsed(&job).await?;
    let view = s.view(&job).await?;
    let attempt = view.attempts.first().cloned().ok_or_else(|| Finding::Fail(format!("job {job} has no attempt")))?;
    let expiries: Vec<&LedgerEntry> = view.ledger.iter().filter(|entry| entry.kind == Op::Expire).collect();
    let entry = expiries
        .first()
        .ok_or_else(|| Finding::Fail(format!("job {job} left running with no expire entry in its ledger")))?;
    ensure(entry.received_ms >= attempt.lease_end_ms(), || {
        format!(
            "{} was expired at {} (server clock), {} ms before its lease ended at {}",
            attempt.id,
            entry.received_ms,
            attempt.lease_end_ms() - entry.received_ms,
            attempt.lease_end_ms()
        )
    })?;
    ensure(entry.lease_expires_ms == Some(attempt.lease_end_ms()), || {
        format!(
            "the expire entry says the lease was {:?}; the attempt's last lease is {}",
            entry.lease_expires_ms,
            attempt.lease_end_ms()
        )
    })?;
    Ok(format!(
        "{} (heartbeat {}) was expired at {} on the server's clock, not before its lease's end {}",
        attempt.id,
        said(&renewed),
        entry.received_ms,
        attempt.lease_end_ms()
    ))
}

/// Claims a fresh job and commits `outcome` for it (a try: late when the result came after
/// the lease). The grant and the ruling.
async fn committed(
    s: &Session,
    runner: &Runner,
    project: &str,
    job: &str,
    key: &str,
    outcome: Outcome,
) -> Result<Try<(Grant, Ruling)>, Finding> {
    s.submit(project, job, key, 1).await?;
    let grant = runner.claim_some().await?;
    ensure(grant.claim.job == job, || format!("{} was granted {} instead of {job}", runner.id, grant.claim.job))?;
    let ruling = runner.result(&grant.claim, outcome, now_ms()).await?;
    if is(&ruling, Decision::Rejected, Some(Reason::Expired)) {
        return Ok(Try::Late(format!("{job}'s result was refused as expired")));
    }
    ensure(is(&ruling, Decision::Accepted, None), || {
        format!("the first result of a live claim of {job} was {}, not accepted", said(&ruling))
    })?;
    Ok(Try::Done((grant, ruling)))
}

async fn duplicate_result(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (grant, first) = tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            committed(
                s,
                runner,
                &team.project,
                &case.id(&format!("j{n}")),
                &case.id(&format!("k{n}")),
                Outcome::Succeeded,
            )
            .await
        }
    })
    .await?;
    let job = grant.claim.job.clone();
    let before = s.view(&job).await?;
    let again = runner.result(&grant.claim, Outcome::Succeeded, now_ms()).await?;
    ensure(is(&again, Decision::Duplicate, None) && again.lease_expires_ms.is_none(), || {
        format!("an identical retry of {}'s committed success was {}, not duplicate", grant.claim.attempt, said(&again))
    })?;
    // A timer: a job claimed now whose lease then lapses shows the server's clock has passed
    // the first attempt's lease too.
    let timer = case.id("timer");
    s.submit(&team.project, &timer, &case.id("timer.key"), 1).await?;
    runner.claim_some().await?;
    s.wait_lapsed(&timer).await?;
    let late = runner.result(&grant.claim, Outcome::Succeeded, now_ms()).await?;
    ensure(is(&late, Decision::Duplicate, None), || {
        format!(
            "an identical retry after {}'s lease had passed was {}, not duplicate",
            grant.claim.attempt,
            said(&late)
        )
    })?;
    let after = s.view(&job).await?;
    ensure(
        after.state == before.state && after.outcome == before.outcome && after.attempts == before.attempts,
        || {
            format!(
                "the duplicates changed job {job}: {:?} {:?} → {:?} {:?}",
                before.state, before.attempts, after.state, after.attempts
            )
        },
    )?;
    // An acknowledged duplicate is a ruling, kept as any other: an entry of its own.
    if s.provides.ledger {
        for ruling in [&again, &late] {
            let entry = s.entry(&job, ruling.ledger_seq).await?;
            let own = entry.seq != first.ledger_seq
                && entry.decision == Some(Decision::Duplicate)
                && entry.outcome == Some(history::OutcomeWord::Succeeded);
            ensure(own, || {
                format!(
                    "the duplicate answered as ledger entry {} is {entry:?}: an acknowledged duplicate is recorded in an entry of its own, `duplicate` with its outcome",
                    ruling.ledger_seq
                )
            })?;
        }
    }
    Ok(format!(
        "{}'s success accepted (ledger {}); identical retries answered duplicate before and after its lease passed (ledger {}, {}), renewing and changing nothing",
        grant.claim.attempt, first.ledger_seq, again.ledger_seq, late.ledger_seq
    ))
}

async fn conflicting_result(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (grant, _) = tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            committed(s, runner, &team.project, &case.id(&format!("j{n}")), &case.id(&format!("k{n}")), Outcome::Failed)
                .await
        }
    })
    .await?;
    let job = grant.claim.job.clone();
    let conflict = runner.result(&grant.claim, Outcome::Succeeded, now_ms()).await?;
    ensure(is(&conflict, Decision::Conflict, Some(Reason::Conflict)), || {
        format!("a success after {}'s committed failure was {}, not conflict", grant.claim.attempt, said(&conflict))
    })?;
    let view = s.view(&job).await?;
    let attempt = view.attempts.first();
    let kept = view.state == JobState::Failed
        && view.outcome == Some(Outcome::Failed)
        && attempt.is_some_and(|a| a.state == AttemptState::Failed && a.closed_by == Some(ClosedBy::Result));
    ensure(kept, || {
        format!("after the conflicting success job {job} reads {:?} (outcome {:?}, attempt {attempt:?}): the committed failure stays", view.state, view.outcome)
    })?;
    let mut recorded = String::from("(ledger not provided: recorded_as not read)");
    if s.provides.ledger {
        let entry = s.entry(&job, conflict.ledger_seq).await?;
        ensure(
            entry.recorded_as == Some(RecordedAs::Conflict) && entry.outcome == Some(history::OutcomeWord::Succeeded),
            || format!("the conflicting result's ledger entry is {entry:?}, not recorded as conflict with its outcome"),
        )?;
        recorded = format!("recorded as conflict (ledger {})", entry.seq);
    }
    let again = runner.result(&grant.claim, Outcome::Failed, now_ms()).await?;
    ensure(is(&again, Decision::Duplicate, None), || {
        format!("a retry of the committed failure after the conflict was {}, not duplicate", said(&again))
    })?;
    Ok(format!("{}'s failure committed; a success for it answered 409 conflict, {recorded}; the job stayed failed and the failure's retry is a duplicate", grant.claim.attempt))
}

/// Claims a fresh job and heartbeats with the runner's clock `skew_ms` away: accepted, with a
/// lease from the server's receipt time (a try: late when the lease had ended at receipt).
async fn skewed_heartbeat(
    s: &Session,
    runner: &Runner,
    project: &str,
    job: &str,
    key: &str,
    skew_ms: i64,
) -> Result<Try<(Grant, Ruling, LedgerEntry)>, Finding> {
    s.submit(project, job, key, 1).await?;
    let grant = runner.claim_some().await?;
    let observed_ms = now_ms() + skew_ms;
    let ruling = runner.heartbeat(&grant.claim, observed_ms).await?;
    let entry = s.entry(job, ruling.ledger_seq).await?;
    if entry.received_ms >= grant.lease_expires_ms {
        return Ok(Try::Late(format!(
            "{job}'s heartbeat arrived at {}, after the lease's end {}",
            entry.received_ms, grant.lease_expires_ms
        )));
    }
    ensure(is(&ruling, Decision::Accepted, None), || {
        format!(
            "a heartbeat received at {} inside the lease ending {} (server clock), with the runner's clock {} days {}, was {}",
            entry.received_ms,
            grant.lease_expires_ms,
            skew_ms.abs() / 86_400_000,
            if skew_ms > 0 { "ahead" } else { "behind" },
            said(&ruling)
        )
    })?;
    let lease = entry.received_ms + s.lease_ms as i64;
    ensure(ruling.lease_expires_ms == Some(lease) && entry.observed_ms == Some(observed_ms), || {
        format!(
            "the heartbeat observed at {observed_ms} (runner clock) and received at {} set the lease to {:?} and stored observed_ms {:?}; the rules give {lease} and store it as sent",
            entry.received_ms, ruling.lease_expires_ms, entry.observed_ms
        )
    })?;
    Ok(Try::Done((grant, ruling, entry)))
}

async fn clock_ahead(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (grant, ruling, entry) = tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            skewed_heartbeat(s, runner, &team.project, &case.id(&format!("j{n}")), &case.id(&format!("k{n}")), SKEW_MS)
                .await
        }
    })
    .await?;
    let done = runner.result(&grant.claim, Outcome::Succeeded, now_ms() + SKEW_MS).await?;
    let finished = is(&done, Decision::Accepted, None);
    ensure(finished || is(&done, Decision::Rejected, Some(Reason::Expired)), || {
        format!("a success inside the renewed lease, observed 30 days ahead, was {}", said(&done))
    })?;
    Ok(format!(
        "with the runner's clock 30 days ahead, a heartbeat received at {} was accepted with the lease {} = receipt + {} ms; observed_ms stored, not used; its success {}",
        entry.received_ms,
        ruling.lease_expires_ms.unwrap_or_default(),
        s.lease_ms,
        said(&done)
    ))
}

async fn clock_behind(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (grant, ruling, _) = tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            skewed_heartbeat(s, runner, &team.project, &case.id(&format!("j{n}")), &case.id(&format!("k{n}")), -SKEW_MS)
                .await
        }
    })
    .await?;
    let lapsed = lapse_to_uncertain(s, &grant.claim.job, &grant.claim.attempt).await?;
    let behind = lapsed.claimed_ms - SKEW_MS;
    let heartbeat = runner.heartbeat(&grant.claim, behind).await?;
    ensure(is(&heartbeat, Decision::Rejected, Some(Reason::Expired)), || {
        format!("after the lease lapsed at {} (server clock), a heartbeat observed at {behind} (30 days behind, inside the lease by the runner's clock) was {}", lapsed.lease_end_ms(), said(&heartbeat))
    })?;
    let result = runner.result(&grant.claim, Outcome::Succeeded, behind).await?;
    ensure(is(&result, Decision::Rejected, Some(Reason::Expired)), || {
        format!(
            "after the lease lapsed, a success observed 30 days behind was {}, not rejected (expired)",
            said(&result)
        )
    })?;
    let view = s.view(&grant.claim.job).await?;
    ensure(view.state == JobState::Uncertain && view.outcome.is_none(), || {
        format!("job {} reads {:?} after reports from a clock 30 days behind", view.id, view.state)
    })?;
    Ok(format!(
        "with the runner's clock 30 days behind: inside the lease a heartbeat got the lease {} (receipt + {} ms); after it lapsed at {} a heartbeat and a success were rejected (expired) and the job stayed uncertain",
        ruling.lease_expires_ms.unwrap_or_default(),
        s.lease_ms,
        lapsed.lease_end_ms()
    ))
}

/// Sends each report in `probes` as `runner` (reports on a claim that is not its own): each
/// must be refused with the verdict reason `expected`, or the error `code`. Answers what was
/// said, in one phrase.
async fn probe(
    runner: &Runner,
    probes: &[(&str, serde_json::Value)],
    expected: Result<Reason, &str>,
) -> Result<String, Finding> {
    let want = match expected {
        Ok(reason) => format!("409 rejected ({reason})"),
        Err(code) => format!("404 {code}"),
    };
    for (path, body) in probes {
        let (status, answer) = runner.report(path, body).await?;
        let (holds, got) = match (&answer, expected) {
            (Ok(ruling), Ok(reason)) => {
                (status == 409 && ruling.decision == Decision::Rejected && ruling.reason == Some(reason), said(ruling))
            }
            (Ok(ruling), Err(_)) => (false, said(ruling)),
            (Err(error), Err(code)) => (status == 404 && error.code == code, error.code.clone()),
            (Err(error), Ok(_)) => (false, error.code.clone()),
        };
        ensure(holds, || format!("{} POST {path} {body} answered {status} {got}, not {want}", runner.id))?;
    }
    let paths: Vec<&str> = probes.iter().map(|(path, _)| path.trim_start_matches("/v1/")).collect();
    Ok(format!("{} reports ({}) each answered {want}", probes.len(), paths.join(", ")))
}

/// The three reports of a claim, as `claim` names it.
fn reports(claim: &ClaimRef, capabilities: bool) -> Vec<(&'static str, serde_json::Value)> {
    let mut all = vec![
        ("/v1/heartbeat", report_body(claim, now_ms())),
        ("/v1/result", result_body(claim, Outcome::Succeeded, now_ms())),
    ];
    if capabilities {
        all.push(("/v1/capability", report_body(claim, now_ms())));
    }
    all
}

/// After probes, the owner's claim must still stand unchanged: its own heartbeat accepted
/// (else the try is late) and its job not finished.
async fn untouched(s: &Session, owner: &Runner, claim: &ClaimRef) -> Result<Option<String>, Finding> {
    let view = s.view(&claim.job).await?;
    let attempt = view.attempts.iter().find(|a| a.id == claim.attempt);
    // A requeue that closed the claim once its lease had really ended is the system's expiry,
    // not the probes' doing: the try is late (a slow machine), as a heartbeat refused
    // `expired` says for a system that keeps the attempt open.
    let requeued_late = attempt.and_then(|a| {
        let ended = a.lease_expires_ms.filter(|end| *end <= now_ms())?;
        (a.closed_by == Some(ClosedBy::ExpiredRequeued)).then_some(ended)
    });
    if let Some(ended) = requeued_late {
        return Ok(Some(format!(
            "{}'s lease had ended (at {ended} ms) and it was requeued before the probes were judged",
            claim.attempt
        )));
    }
    ensure(view.outcome.is_none() && attempt.is_some_and(|a| a.closed_by.is_none()), || {
        format!("reports naming another claim changed job {}: {:?}, attempt {attempt:?}", claim.job, view.state)
    })?;
    owner.still_live(claim).await
}

async fn across_jobs(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            s.submit(&team.project, &case.id(&format!("a{n}")), &case.id(&format!("ka{n}")), 1).await?;
            s.submit(&team.project, &case.id(&format!("b{n}")), &case.id(&format!("kb{n}")), 1).await?;
            let a = runner.claim_some().await?.claim;
            let b = runner.claim_some().await?.claim;
            let swapped_job = ClaimRef { job: a.job.clone(), ..b.clone() };
            let borrowed_fence = ClaimRef { fence: b.fence, ..a.clone() };
            let swapped = probe(runner, &reports(&swapped_job, s.provides.capabilities), Ok(Reason::NotCurrent)).await?;
            let borrowed = probe(runner, &reports(&borrowed_fence, s.provides.capabilities), Ok(Reason::NotCurrent)).await?;
            if let Some(late) = untouched(s, runner, &a).await? {
                return Ok(Try::Late(late));
            }
            Ok(Try::Done(format!(
                "{}'s attempt and fence {} named with job {}: {swapped}; {}'s attempt with fence {}: {borrowed}; {} stands untouched",
                b.attempt, b.fence, a.job, a.attempt, b.fence, a.attempt
            )))
        }
    })
    .await
}

async fn across_runners(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 2).await?;
    let (owner, other) = (&team.runners[0], &team.runners[1]);
    tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            s.submit(&team.project, &case.id(&format!("j{n}")), &case.id(&format!("k{n}")), 1).await?;
            let claim = owner.claim_some().await?.claim;
            let borrowed = ClaimRef { runner: other.id.clone(), ..claim.clone() };
            let answered = probe(other, &reports(&borrowed, s.provides.capabilities), Ok(Reason::NotCurrent)).await?;
            if let Some(late) = untouched(s, owner, &claim).await? {
                return Ok(Try::Late(late));
            }
            Ok(Try::Done(format!(
                "{}'s job, attempt and fence {} presented by {}: {answered}; the claim stands untouched",
                claim.attempt, claim.fence, other.id
            )))
        }
    })
    .await
}

async fn across_projects(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let stranger = s.team_named(&case.id("other"), 1).await?;
    let (owner, other) = (&team.runners[0], &stranger.runners[0]);
    tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            let job = case.id(&format!("j{n}"));
            s.submit(&team.project, &job, &case.id(&format!("k{n}")), 1).await?;
            let claim = owner.claim_some().await?.claim;
            let borrowed = ClaimRef { runner: other.id.clone(), ..claim.clone() };
            let answered = probe(other, &reports(&borrowed, s.provides.capabilities), Err("unknown_job")).await?;
            if let Some(late) = untouched(s, owner, &claim).await? {
                return Ok(Try::Late(late));
            }
            if s.provides.ledger {
                let view = s.view(&job).await?;
                let recorded = view.ledger.iter().any(|entry| entry.runner.as_deref() == Some(other.id.as_str()));
                ensure(!recorded, || format!("reports of {} (another project) were recorded against {job}", other.id))?;
            }
            Ok(Try::Done(format!(
                "{}'s claim (fence {}) presented by {} of project {}: {answered}, recorded nowhere; the claim stands",
                claim.attempt, claim.fence, other.id, other.project
            )))
        }
    })
    .await
}

async fn fences_global(s: &Session, case: Case) -> CaseOutcome {
    let first = s.team(&case, 1).await?;
    let second = s.team_named(&case.id("other"), 1).await?;
    let mut fences = Vec::new();
    for n in 1..=3 {
        for team in [&first, &second] {
            let job = format!("{}.j{n}", team.project);
            s.submit(&team.project, &job, &format!("{job}.key"), 1).await?;
            let grant = team.runners[0].claim_some().await?;
            fences.push((grant.claim.attempt, grant.claim.fence));
        }
    }
    let increasing = fences.windows(2).all(|pair| pair[0].1 < pair[1].1);
    ensure(increasing, || format!("claims of two projects, in order, got fences {fences:?}: not strictly increasing"))?;
    Ok(format!(
        "six claims alternating between two projects got strictly increasing fences {:?}",
        fences.iter().map(|(_, fence)| fence).collect::<Vec<_>>()
    ))
}

async fn reconcile_supersedes(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 2).await?;
    let (old, new) = (&team.runners[0], &team.runners[1]);
    tries(|n| {
        let (case, team) = (&case, &team);
        async move {
            let job = case.id(&format!("j{n}"));
            s.submit(&team.project, &job, &case.id(&format!("k{n}")), 1).await?;
            let first = old.claim_some().await?.claim;
            lapse_to_uncertain(s, &job, &first.attempt).await?;
            let request = ReconcileRequest { job: job.clone(), attempt: first.attempt.clone(), finding: Observed::Stopped, outcome: None, evidence: Some("conform: the old execution was stopped".into()) };
            s.reconcile(&request).await.map_err(|error| Finding::Fail(format!("reconcile `stopped` of {}: {error}", first.attempt)))?;
            let second = new.claim_some().await?.claim;
            ensure(second.job == job && second.fence > first.fence, || format!("after `stopped` {} was granted {} (fence {}), not {job} above fence {}", new.id, second.attempt, second.fence, first.fence))?;
            let heartbeat = old.heartbeat(&first, now_ms()).await?;
            let late = old.result(&first, Outcome::Succeeded, now_ms()).await?;
            for (what, ruling) in [("heartbeat", &heartbeat), ("success", &late)] {
                ensure(is(ruling, Decision::Rejected, Some(Reason::Superseded)), || {
                    format!("the old attempt {}'s {what} after {} was granted was {}, not rejected (superseded)", first.attempt, second.attempt, said(ruling))
                })?;
            }
            let done = new.result(&second, Outcome::Succeeded, now_ms()).await?;
            if is(&done, Decision::Rejected, Some(Reason::Expired)) {
                return Ok(Try::Late(format!("{}'s result was refused as expired", second.attempt)));
            }
            ensure(is(&done, Decision::Accepted, None), || format!("the current attempt {}'s success was {}", second.attempt, said(&done)))?;
            let again = old.result(&first, Outcome::Succeeded, now_ms()).await?;
            ensure(is(&again, Decision::Rejected, Some(Reason::Superseded)), || {
                format!("the old attempt's success after the job succeeded was {}, not rejected (superseded): a reconciled attempt's result is never a duplicate", said(&again))
            })?;
            let view = s.view(&job).await?;
            let closed: Vec<(AttemptState, Option<ClosedBy>)> = view.attempts.iter().map(|a| (a.state, a.closed_by)).collect();
            let expected = [(AttemptState::Failed, Some(ClosedBy::ObservedStopped)), (AttemptState::Succeeded, Some(ClosedBy::Result))];
            ensure(view.state == JobState::Succeeded && closed == expected, || format!("job {job} ends {:?} with attempts {closed:?}, not succeeded by {} with {} stopped", view.state, second.attempt, first.attempt))?;
            Ok(Try::Done(format!(
                "after `stopped`, {} (fence {}) superseded {} (fence {}): the old heartbeat and successes were rejected (superseded), the new success completed the job",
                second.attempt, second.fence, first.attempt, first.fence
            )))
        }
    })
    .await
}
