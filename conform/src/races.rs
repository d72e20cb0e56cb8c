//! Races: 30 registered runners claiming one job at once (exactly one is granted), and 30
//! results for one attempt at once (one is accepted; every other is the duplicate or the
//! conflict the rules make of it once the first has committed).

use history::{ClosedBy, Decision, Reason};
use protocol::Outcome;

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::session::{now_ms, said, tries, Session, Try};

/// How many race at once.
pub const RACERS: usize = 30;

pub fn defs() -> Vec<Def> {
    vec![
        Def { name: "race/claims", needs: &[], run: |s, c| Box::pin(claims(s, c)) },
        Def { name: "race/results", needs: &[], run: |s, c| Box::pin(results(s, c)) },
    ]
}

async fn claims(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, RACERS).await?;
    let job = case.id("j1");
    s.submit(&team.project, &job, &case.id("k1"), 1).await?;
    let mut racing = tokio::task::JoinSet::new();
    for runner in team.runners.iter().cloned() {
        racing.spawn(async move { (runner.id.clone(), runner.claim().await) });
    }
    let mut granted = Vec::new();
    let mut answered = 0;
    while let Some(joined) = racing.join_next().await {
        let (runner, answer) =
            joined.map_err(|error| Finding::Fail(format!("a racing claim did not finish: {error}")))?;
        if let Some(grant) = answer? {
            granted.push((runner, grant.claim));
        }
        answered += 1;
    }
    ensure(granted.len() == 1, || {
        format!(
            "{} of {answered} racing claims for one job were granted: {:?}",
            granted.len(),
            granted
                .iter()
                .map(|(runner, claim)| format!("{runner} {} fence {}", claim.attempt, claim.fence))
                .collect::<Vec<_>>()
        )
    })?;
    let (winner, claim) = &granted[0];
    let view = s.view(&job).await?;
    let attempts: Vec<(&str, &str)> = view.attempts.iter().map(|a| (a.id.as_str(), a.runner.as_str())).collect();
    ensure(attempts == [(claim.attempt.as_str(), winner.as_str())], || {
        format!("after the race job {job} holds attempts {attempts:?}, not {}'s one", winner)
    })?;
    Ok(format!("{RACERS} runners claimed {job} at once: only {winner} was granted ({}, fence {}); the others got {{\"grant\": null}}", claim.attempt, claim.fence))
}

async fn results(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = team.runners[0].clone();
    tries(|n| {
        let (case, team, runner) = (&case, &team, runner.clone());
        async move {
            let job = case.id(&format!("j{n}"));
            s.submit(&team.project, &job, &case.id(&format!("k{n}")), 1).await?;
            let claim = runner.claim_some().await?.claim;
            let mut racing = tokio::task::JoinSet::new();
            for index in 0..RACERS {
                let (runner, claim) = (runner.clone(), claim.clone());
                let outcome = if index % 2 == 0 { Outcome::Succeeded } else { Outcome::Failed };
                racing.spawn(async move { (outcome, runner.result(&claim, outcome, now_ms()).await) });
            }
            let mut answers = Vec::new();
            while let Some(joined) = racing.join_next().await {
                let (outcome, ruling) = joined.map_err(|error| Finding::Fail(format!("a racing result did not finish: {error}")))?;
                answers.push((outcome, ruling?));
            }
            let accepted: Vec<Outcome> = answers.iter().filter(|(_, r)| r.decision == Decision::Accepted).map(|(o, _)| *o).collect();
            if accepted.is_empty() && answers.iter().all(|(_, r)| r.reason == Some(Reason::Expired)) {
                return Ok(Try::Late(format!("every result for {} was refused as expired", claim.attempt)));
            }
            ensure(accepted.len() == 1, || format!("{} of {RACERS} racing results for {} were accepted", accepted.len(), claim.attempt))?;
            let winner = accepted[0];
            let wrong: Vec<String> = answers
                .iter()
                .filter(|(_, r)| r.decision != Decision::Accepted)
                .filter(|(outcome, r)| {
                    let expected = if *outcome == winner { (Decision::Duplicate, None) } else { (Decision::Conflict, Some(Reason::Conflict)) };
                    (r.decision, r.reason) != expected
                })
                .map(|(outcome, r)| format!("{} → {}", outcome.as_str(), said(r)))
                .collect();
            ensure(wrong.is_empty(), || {
                format!("after {} committed {}, other racing results were not its duplicates and conflicts: {}", claim.attempt, winner.as_str(), wrong.join(", "))
            })?;
            let view = s.view(&job).await?;
            let closed = view.attempts.iter().filter(|a| a.closed_by == Some(ClosedBy::Result)).count();
            ensure(view.outcome == Some(winner) && closed == 1, || format!("after the race job {job} reads outcome {:?} with {closed} attempts closed by a result, not {}", view.outcome, winner.as_str()))?;
            let duplicates = answers.iter().filter(|(_, r)| r.decision == Decision::Duplicate).count();
            let conflicts = answers.iter().filter(|(_, r)| r.decision == Decision::Conflict).count();
            Ok(Try::Done(format!(
                "{RACERS} results for {} at once: one accepted ({}), {duplicates} duplicates, {conflicts} conflicts; the job kept {}",
                claim.attempt,
                winner.as_str(),
                winner.as_str()
            )))
        }
    })
    .await
}
