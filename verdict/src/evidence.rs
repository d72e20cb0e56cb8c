//! `fencelab evidence`: a minimal evidence folder assembled from records a user gathered by
//! hand — a control plane's ledger (`GET /v1/ledger`), its jobs (`GET /v1/jobs/{id}`), a
//! target's step log (`GET /v1/steps`) and runners' logs — into one `history.jsonl`
//! that `fencelab check` judges. Each record goes through the one collector's conversions
//! and the one merge; the history declares exactly the sources it was given, so a rule
//! standing on one that was not given answers unknown. Every input is read and checked
//! before anything is written: bad input changes nothing.
//!
//! The records are put on one clock by their monotonic times (`mono_ns` of ledger entries
//! and step records, `time_ns` of runner log lines), as the lab's processes on one host
//! stamp them; records from hosts whose monotonic clocks differ cannot be ordered against
//! each other, and should be checked apart (the ledger alone, say).
//!
//! What the system lacks (`--lacks lease` for one that grants no lease, such as an observed
//! Buildbot) goes into the history's `config` event as `system.absent`, as a run's config
//! says it (`docs/system.md`): its claims without `lease_expires_ms` are then read, not
//! malformed, and the rules that measure a lease answer unknown.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use history::{Event, Op, Source};
use protocol::{JobView, LedgerEntry, StepRecord};
use system::Feature;

use crate::check::FolderError;
use runfolder::folder::write_whole;
use system::collect::{merge, Sources};

/// The records to assemble, each optional.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub ledger: Option<PathBuf>,
    pub jobs: Option<PathBuf>,
    pub steps: Option<PathBuf>,
    pub runner_logs: Vec<PathBuf>,
    /// The lease policy, for the rules that judge a granted lease against it.
    pub lease_ms: Option<u64>,
    /// The optional parts of the contract the system lacks (`system.absent`).
    pub lacks: Vec<Feature>,
    pub out: PathBuf,
}

/// What was assembled.
pub struct Assembled {
    pub events: usize,
    pub sources: BTreeSet<Source>,
}

/// Records of type `T` from a file holding a JSON array of them or one per line; the
/// error names the file and the line.
fn records<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, FolderError> {
    let bad = |why: String| FolderError::Bad(format!("{}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|error| bad(error.to_string()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text).map_err(|error| bad(error.to_string()));
    }
    let lines = text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty());
    lines
        .map(|(number, line)| serde_json::from_str(line).map_err(|error| bad(format!("line {}: {error}", number + 1))))
        .collect()
}

/// Assembles `inputs` into `inputs.out/history.jsonl`.
pub fn assemble(inputs: &Inputs) -> Result<Assembled, FolderError> {
    let ledger: Vec<LedgerEntry> = inputs.ledger.as_deref().map(records).transpose()?.unwrap_or_default();
    let jobs: Vec<JobView> = inputs.jobs.as_deref().map(records).transpose()?.unwrap_or_default();
    let steps: Vec<StepRecord> = inputs.steps.as_deref().map(records).transpose()?.unwrap_or_default();
    for log in &inputs.runner_logs {
        if !log.is_file() {
            return Err(FolderError::Bad(format!("--runner-log {}: no such file", log.display())));
        }
    }
    if inputs.ledger.is_none() && inputs.runner_logs.is_empty() && inputs.steps.is_none() {
        return Err(FolderError::Bad("give at least one of --ledger, --runner-log, --steps".into()));
    }
    let history = runfolder::folder::RunFolder::at(&inputs.out).history_path();
    if history.exists() {
        let said = format!("--out {} already holds a history.jsonl", inputs.out.display());
        return Err(FolderError::Bad(said));
    }
    std::fs::create_dir_all(&inputs.out)
        .map_err(|error| FolderError::Bad(format!("--out {}: {error}", inputs.out.display())))?;
    let given = Given {
        ledger: inputs.ledger.is_some().then_some(&ledger[..]),
        jobs: inputs.jobs.is_some().then_some(&jobs[..]),
        steps: inputs.steps.is_some().then_some(&steps[..]),
        runner_logs: &inputs.runner_logs,
        lease_ms: inputs.lease_ms,
        lacks: &inputs.lacks,
    };
    let events = history_of(&given);
    let written = write_whole(&history, events)
        .map_err(|error| FolderError::Write(format!("{}: {error}", inputs.out.display())))?;
    Ok(Assembled { events: written, sources: given.sources() })
}

/// A run's history cut to the records a production system keeps: its ledger, as
/// `GET /v1/ledger` answers it (`mono_ns` on the run's clock), the target's step log, as
/// `GET /v1/steps` answers it, and each runner's log, written as files; the lease policy the
/// run's control plane ran with.
#[derive(Clone, Debug)]
pub struct Cut {
    pub ledger: PathBuf,
    /// The target's step log, when the run has one.
    pub steps: Option<PathBuf>,
    pub runner_logs: Vec<PathBuf>,
    pub lease_ms: Option<u64>,
}

/// Cuts `events` (a run's history) to its ledger, the target's step log and the runners'
/// logs, written into `dir` as `ledger.jsonl`, `steps.jsonl` and `runner-ID.jsonl`: what an
/// incident in production leaves (the target is the deployment system, which keeps its own
/// records), for [`assemble`]. The jobs' final states, the operator's and the nemesis's
/// records are left out.
pub fn cut(events: &[Event], dir: &Path) -> Result<Cut, FolderError> {
    let written = |path: &Path, error: std::io::Error| FolderError::Write(format!("{}: {error}", path.display()));
    let mut ledger = Vec::new();
    let mut steps = Vec::new();
    let mut logs: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for event in events {
        match &event.process {
            history::Process::Runner(id) => {
                let mut line = serde_json::to_value(event).map_err(|error| FolderError::Bad(error.to_string()))?;
                if let Some(fields) = line.as_object_mut() {
                    fields.remove("index");
                }
                logs.entry(id.clone()).or_default().push(line.to_string());
            }
            _ if event.process == history::Process::TARGET && event.kind == history::EventType::Step => {
                let record = step_record(event)?;
                steps.push(serde_json::to_string(&record).map_err(|error| FolderError::Bad(error.to_string()))?);
            }
            _ if event.kind == history::EventType::Ledger => {
                let unreadable = || {
                    FolderError::Bad(format!(
                        "history event {}: a ledger entry without its seq, job or receipt",
                        event.index
                    ))
                };
                let value = event.value.clone().unwrap_or_default();
                let entry = LedgerEntry {
                    seq: value["seq"].as_u64().ok_or_else(unreadable)?,
                    kind: event.f,
                    project: event.project.clone().unwrap_or_default(),
                    job: event.job.clone().ok_or_else(unreadable)?,
                    attempt: event.attempt.clone(),
                    runner: event.runner.clone(),
                    fence: event.fence,
                    deployment_key: event.key.clone().unwrap_or_default(),
                    decision: event.decision,
                    reason: event.reason.clone(),
                    recorded_as: value["recorded_as"].as_str().and_then(history::RecordedAs::parse),
                    outcome: event.outcome.as_deref().and_then(history::OutcomeWord::parse),
                    received_ms: event.received_ms.ok_or_else(unreadable)?,
                    observed_ms: event.observed_ms,
                    mono_ns: event.time_ns,
                    lease_expires_ms: event.lease_expires_ms,
                };
                ledger.push(serde_json::to_string(&entry).map_err(|error| FolderError::Bad(error.to_string()))?);
            }
            _ => {}
        }
    }
    std::fs::create_dir_all(dir).map_err(|error| written(dir, error))?;
    let ledger_path = dir.join("ledger.jsonl");
    std::fs::write(&ledger_path, ledger.join("\n") + "\n").map_err(|error| written(&ledger_path, error))?;
    let steps_path = dir.join("steps.jsonl");
    let steps = if steps.is_empty() {
        None
    } else {
        std::fs::write(&steps_path, steps.join("\n") + "\n").map_err(|error| written(&steps_path, error))?;
        Some(steps_path)
    };
    let mut runner_logs = Vec::new();
    for (runner, lines) in logs {
        let path = dir.join(format!("runner-{runner}.jsonl"));
        std::fs::write(&path, lines.join("\n") + "\n").map_err(|error| written(&path, error))?;
        runner_logs.push(path);
    }
    let lease_ms = events.iter().find_map(history::Config::of).and_then(|config| config.lease_ms);
    Ok(Cut { ledger: ledger_path, steps, runner_logs, lease_ms })
}

/// A target step event of a history as the step record the target keeps.
fn step_record(event: &Event) -> Result<StepRecord, FolderError> {
    let unreadable = || FolderError::Bad(format!("history event {}: a target step without its record", event.index));
    let value = event.value.clone().unwrap_or_default();
    let number = |key: &str| value[key].as_u64().ok_or_else(unreadable);
    Ok(StepRecord {
        seq: number("seq")?,
        deployment_key: event.key.clone().ok_or_else(unreadable)?,
        job: event.job.clone().ok_or_else(unreadable)?,
        attempt: event.attempt.clone().ok_or_else(unreadable)?,
        runner: event.runner.clone().ok_or_else(unreadable)?,
        fence: event.fence.ok_or_else(unreadable)?,
        step: number("step")? as u32,
        steps: number("steps")? as u32,
        applied: event.decision == Some(history::Decision::Accepted),
        reason: event.reason.as_deref().and_then(history::Reason::parse),
        revision: number("revision")?,
        highest_fence_before: number("highest_fence_before")?,
        received_ms: event.received_ms.ok_or_else(unreadable)?,
        mono_ns: event.time_ns,
    })
}

/// `fencelab evidence --from-run RUN --out OUT`: the run's history cut ([`cut`]) into
/// `OUT/records/`, then assembled from those files as records gathered by hand are
/// (`--ledger`, `--steps`, `--runner-log`, `--lease-ms`: the run's unless `lease_ms` says one).
pub fn assemble_run(run: &Path, lease_ms: Option<u64>, out: &Path) -> Result<(Inputs, Assembled), FolderError> {
    let folder = runfolder::folder::RunFolder::at(run);
    folder.required_history()?;
    let events = folder.history()?;
    let history = runfolder::folder::RunFolder::at(out).history_path();
    if history.exists() {
        return Err(FolderError::Bad(format!("--out {} already holds a history.jsonl", out.display())));
    }
    let records = cut(&events, &out.join("records"))?;
    let inputs = Inputs {
        ledger: Some(records.ledger),
        steps: records.steps,
        runner_logs: records.runner_logs,
        lease_ms: lease_ms.or(records.lease_ms),
        out: out.to_path_buf(),
        ..Inputs::default()
    };
    let assembled = assemble(&inputs)?;
    Ok((inputs, assembled))
}

/// Records read, each `None` when not given (a given record may be empty).
pub struct Given<'a> {
    pub ledger: Option<&'a [LedgerEntry]>,
    pub jobs: Option<&'a [JobView]>,
    pub steps: Option<&'a [StepRecord]>,
    pub runner_logs: &'a [PathBuf],
    pub lease_ms: Option<u64>,
    /// The parts the system lacks, said in the `config` event with the lease policy.
    pub lacks: &'a [Feature],
}

impl Given<'_> {
    /// The sources these records are.
    pub fn sources(&self) -> BTreeSet<Source> {
        let given = [
            (self.ledger.is_some(), Source::Ledger),
            (!self.runner_logs.is_empty(), Source::RunnerLogs),
            (self.steps.is_some(), Source::TargetLog),
            (self.jobs.is_some(), Source::Finals),
            (self.lease_ms.is_some() || !self.lacks.is_empty(), Source::Config),
        ];
        given.iter().filter(|(given, _)| *given).map(|(_, source)| *source).collect()
    }
}

/// The history of these records: merged on their monotonic times, starting at 0, declaring
/// exactly the sources given.
pub fn history_of(given: &Given<'_>) -> Vec<Event> {
    let said = given.lease_ms.is_some() || !given.lacks.is_empty();
    let own: Vec<Event> = said.then(|| config_event(given.lease_ms, given.lacks)).into_iter().collect();
    let mut closing: Vec<Event> = given.jobs.unwrap_or_default().iter().map(system::collect::final_event).collect();
    closing.push(history::sources_event(&given.sources()));
    let parts = Sources {
        own,
        runner_logs: given.runner_logs,
        ledger: given.ledger.unwrap_or_default(),
        steps: given.steps.unwrap_or_default(),
        closing,
    };
    let mut events = merge(0, 0, parts);
    let start_ns = events.iter().filter(|event| event.f != Op::Config).map(|event| event.time_ns).min().unwrap_or(0);
    for event in &mut events {
        event.time_ns = event.time_ns.saturating_sub(start_ns);
    }
    events
}

/// The lease policy and the parts the system lacks as a `config` event: each only when given.
fn config_event(lease_ms: Option<u64>, lacks: &[Feature]) -> Event {
    let absent = lacks.iter().map(|part| part.name().to_string()).collect();
    let system = (!lacks.is_empty()).then(|| history::SystemConfig { absent: Some(absent), ..Default::default() });
    history::Config { lease_ms, system, ..history::Config::default() }.event()
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkers::Verdict;

    /// A ledger of a system that grants no lease (Buildbot's shape): a build lost with its
    /// worker, put back in the queue by the system (`requeued`), built again and succeeded.
    const REQUEUED: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j","deployment_key":"k","received_ms":1000,"mono_ns":10}
{"seq":2,"kind":"claim","project":"p","job":"j","attempt":"j-b1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":2000,"mono_ns":20}
{"seq":3,"kind":"expire","project":"p","job":"j","attempt":"j-b1","runner":"r1","fence":1,"deployment_key":"k","recorded_as":"requeued","received_ms":5000,"mono_ns":30}
{"seq":4,"kind":"claim","project":"p","job":"j","attempt":"j-b2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":6000,"mono_ns":40}
{"seq":5,"kind":"result","project":"p","job":"j","attempt":"j-b2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","outcome":"succeeded","received_ms":9000,"mono_ns":50}
"#;

    fn checked(lacks: Vec<Feature>) -> (Vec<Event>, Vec<checkers::CheckerResult>) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.jsonl");
        std::fs::write(&ledger, REQUEUED).unwrap();
        let out = dir.path().join("evidence");
        let inputs = Inputs { ledger: Some(ledger), lacks, out: out.clone(), ..Inputs::default() };
        assemble(&inputs).unwrap();
        let history = runfolder::folder::RunFolder::at(&out).history_path();
        let events = crate::check::read_history(&history).unwrap();
        (events, crate::check::check_history(&history, 1_000).unwrap().checkers)
    }

    fn verdict<'a>(results: &'a [checkers::CheckerResult], name: &str) -> &'a Verdict {
        &results.iter().find(|result| result.checker == name).unwrap().verdict
    }

    #[test]
    fn lacks_lease_says_so_in_the_config_and_a_leaseless_ledger_is_judged_not_malformed() {
        let (events, results) = checked(vec![Feature::Lease]);
        let config = events.iter().find(|event| event.f == Op::Config).expect("a config event");
        assert_eq!(config.value, Some(serde_json::json!({ "system": { "absent": ["lease"] } })));
        for result in &results {
            if let Verdict::Unknown { reason } = &result.verdict {
                assert!(!reason.contains("malformed"), "{}: {reason}", result.checker);
            }
        }
        assert!(matches!(verdict(&results, "explicit-uncertainty"), Verdict::Invalid { .. }), "{results:?}");
        assert!(
            matches!(verdict(&results, "single-owner"), Verdict::Unknown { reason } if reason.contains("no lease"))
        );

        // Without it the same ledger's claims lack their lease: malformed, nothing judged.
        let (events, results) = checked(Vec::new());
        assert!(events.iter().all(|event| event.f != Op::Config));
        let unknown = verdict(&results, "explicit-uncertainty");
        assert!(matches!(unknown, Verdict::Unknown { reason } if reason.contains("malformed")), "{unknown:?}");
    }

    /// The cut keeps the target's step log, record for record (the target is the deployment
    /// system, which keeps its own records): a stale step applied there is judged from the cut
    /// (a target-ignores-fence run's cut held no anomaly without it, `check` exit 2).
    #[test]
    fn the_cut_keeps_the_targets_step_log() {
        let record = StepRecord {
            seq: 3,
            deployment_key: "k".into(),
            job: "j".into(),
            attempt: "j-a1".into(),
            runner: "r1".into(),
            fence: 1,
            step: 2,
            steps: 4,
            applied: false,
            reason: Some(history::Reason::StaleFence),
            revision: 5,
            highest_fence_before: 2,
            received_ms: 1_000,
            mono_ns: 7_000_000,
        };
        let events = [system::collect::step_event(&record, record.mono_ns)];
        let dir = tempfile::tempdir().unwrap();
        let cut = cut(&events, dir.path()).unwrap();
        let steps = cut.steps.expect("the step log written");
        let kept: Vec<StepRecord> = records(&steps).unwrap();
        assert_eq!(kept, vec![record]);
    }
}
