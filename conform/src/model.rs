//! The session's whole ledger replayed through the contract's rules model
//! (`checkers::rules_model`): every entry the cases caused — claims, reports, expiries,
//! reconciles — must be the decision the rules give from the state before it, and every
//! job's final state the one its ledger replays to. A divergence fails the model case and
//! the case whose job it names, so each case's expectations are the rules' too.

use std::collections::BTreeMap;

use checkers::Verdict;
use history::Event;

use super::case::{CaseResult, Status};
use super::session::Session;

pub const NAME: &str = "model/rules-replay";

/// The most divergences told in one case's evidence.
const LINES_MAX: usize = 2;

/// The session's history: its configuration (the lease), the operator's decisions, the
/// ledger and every job's final state, in time order; read through the one collector, so a
/// record that cannot be read is an error, never an empty ledger.
async fn history(s: &Session) -> Result<(Vec<Event>, usize, usize), String> {
    let records = system::collect::read(&s.operator, None, true).await;
    if !records.unreadable.is_empty() {
        return Err(records.unreadable.join("; "));
    }
    let config = history::Config { lease_ms: Some(s.lease_ms), ..history::Config::default() };
    let mut events = vec![config.event()];
    events.extend(s.decisions());
    let ledger = records.ledger.iter().map(|entry| system::collect::ledger_event(entry, s.rebase(entry.mono_ns)));
    events.extend(ledger);
    events.sort_by_key(|event| event.time_ns);
    let end_ns = events.last().map_or(0, |event| event.time_ns).max(s.now_ns());
    for mut event in records.closing_events(true) {
        event.time_ns = end_ns;
        events.push(event);
    }
    for (index, event) in events.iter_mut().enumerate() {
        event.index = index as u64;
    }
    Ok((events, records.ledger.len(), records.jobs.len()))
}

/// Replays the ledger; marks every case whose job diverged as failed; answers the model's
/// own case.
pub async fn judge(s: &Session, results: &mut [CaseResult], tags: &BTreeMap<String, usize>) -> CaseResult {
    let started = std::time::Instant::now();
    let (status, evidence) = match history(s).await {
        Err(error) => (Status::Fail, format!("the ledger could not be read for the replay: {error}")),
        Ok((events, entries, jobs)) => match checkers::check_one(checkers::rules_model::NAME, &events).map(|result| result.verdict) {
            Some(Verdict::Valid) => (Status::Pass, format!("all {entries} ledger entries of {jobs} jobs are the decisions the rules give; every final state is its ledger's")),
            Some(Verdict::Unknown { reason }) => (Status::Skip, format!("the rules model could not judge the ledger: {reason}")),
            None => (Status::Fail, "the rules model is not among the checkers".to_string()),
            Some(Verdict::Invalid { anomalies }) => {
                for anomaly in &anomalies {
                    let tag = anomaly.job.as_deref().and_then(|job| job.split('.').next()).unwrap_or_default();
                    if let Some(case) = tags.get(tag).and_then(|index| results.get_mut(*index)) {
                        let line = format!("rules model: {}", anomaly.message);
                        if case.status == Status::Fail {
                            if case.evidence.matches("rules model: ").count() < LINES_MAX {
                                case.evidence = format!("{}; {line}", case.evidence);
                            }
                        } else {
                            case.status = Status::Fail;
                            case.evidence = line;
                        }
                    }
                }
                let first = anomalies.first().map_or(String::new(), |anomaly| format!(": {} ({})", anomaly.message, anomaly.kind));
                (Status::Fail, format!("{} of {entries} ledger entries diverge from the rules{first}", anomalies.len()))
            }
        },
    };
    CaseResult { name: NAME.to_string(), status, evidence, duration_ms: started.elapsed().as_millis() as u64 }
}
