//! `fencelab import FOLDER --out scenario.toml`: from an incident's records — an evidence
//! folder (`fencelab evidence`) or a run folder — a scenario that plays the incident's shape
//! against any system (`docs/scenarios.md`, "From an incident to a scenario").
//!
//! The folder's history is checked through the one check path ([`verdict::check::check_history`]);
//! its anomalies name the jobs to play (at most [`JOBS_MAX`], the earliest anomalies first, with
//! every job an anomaly names beside them). Each job is submitted on its deployment key at its
//! time, its first attempt claimed by the runner that held it; the faults the records imply are
//! steps at the times the records give, each with a comment naming the ledger entries and log
//! lines it comes from:
//!
//! - a runner's control requests that got no answer (its log), or a gap in its reports on an
//!   attempt that expired meanwhile (the ledger alone), are a cut of its control link for that
//!   long (`control-link`; `cut-links` when its target steps went unanswered too);
//! - requests that reached the ledger long after the runner sent them, or a result the ledger
//!   received after its lease with no gap to explain it, are a held report (`latency`);
//! - an answer that never came for a report the ledger recorded is a lost response;
//! - silence in a runner's log while it held an attempt is a pause, and silence after which it
//!   claims afresh, its attempt abandoned, a kill;
//! - a runner clock the ledger shows off (`observed_ms` against `received_ms`) is a skew, and a
//!   target clock its step log shows off (its `received_ms` against the ledger's) a target skew;
//! - a step the target received long after its runner sent it, once a newer fence had been
//!   applied on its key (the step log against the runner's log), is a step held in the
//!   network (`delayed-step`, which also cuts the runner's control link), and one received
//!   after its attempt's lease ended with no newer fence before it a late step (`late-step`);
//! - every runner losing the control plane at once, or an answer whose ledger entry the ledger
//!   no longer holds, is a control-plane restart;
//! - a report the ledger holds under a runner whose log never sent it is played as that runner.
//!
//! What the records cannot tell (a runner's log absent, the job's steps, the target's mode) is
//! said in the file. The scenario expects every checker that found the incident's anomalies to
//! answer valid: it fails where the bug is, and passes where it is fixed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use checkers::{Anomaly, Verdict};
use history::{Decision, Event, EventType, Op, Process};
use workloads::faults::Variant;
use workloads::scenario::{Action, Condition, OperatorMode, Scenario, Step};

use runfolder::folder::RunFolder;
use verdict::check::FolderError;

/// Most incident jobs a scenario plays (the earliest anomalies' first).
pub const JOBS_MAX: usize = 3;
/// The first submit's time in the scenario: the system is up by then.
const START_MS: u64 = 1_000;
/// How much earlier than its claim a submit pinned to a runner is placed: it stops the
/// other idle runners and waits [`crate::scenario::SETTLE`] before it submits, so that its
/// claim lands when the incident's did, beside the other jobs' attempts and the faults.
const PIN_LEAD_MS: u64 = crate::scenario::SETTLE.as_millis() as u64;
/// A lease assumed when neither the config nor a claim says one.
const LEASE_DEFAULT_MS: u64 = 1_000;

/// What `fencelab import` is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub folder: PathBuf,
    pub out: PathBuf,
    /// Incident jobs to play (default: those of the earliest anomalies).
    pub jobs: Vec<String>,
}

/// What was imported.
#[derive(Debug)]
pub struct Imported {
    pub jobs: Vec<String>,
    pub runners: u32,
    pub faults: usize,
    pub played: usize,
    /// The checkers the scenario expects valid (they found the incident's anomalies).
    pub checkers: Vec<String>,
    /// What the records could not tell, as said in the file.
    pub unknowns: Vec<String>,
}

/// Imports `options.folder` into the scenario file `options.out`. Bad input (no history, a
/// record that cannot be read, no anomaly) writes nothing.
pub fn import(options: &Options) -> Result<Imported, FolderError> {
    let folder = RunFolder::at(&options.folder);
    if !options.folder.is_dir() {
        return Err(FolderError::Bad(format!("{}: no such folder", options.folder.display())));
    }
    let path = folder.required_history()?;
    let events = folder.history()?;
    if let Some(unreadable) = events.iter().find(|event| event.f == Op::Unreadable) {
        let why = unreadable.reason.as_deref().unwrap_or("a record could not be read");
        return Err(FolderError::Bad(format!("{}: {why}: the incident cannot be read whole", path.display())));
    }
    let checked = verdict::check::check_history(&path, results::KEPT_EVENTS_MAX)?;
    let anomalies: Vec<Anomaly> = checked
        .checkers
        .into_iter()
        .flat_map(|result| match result.verdict {
            Verdict::Invalid { anomalies } => anomalies,
            _ => Vec::new(),
        })
        .collect();
    if anomalies.is_empty() {
        return Err(FolderError::Bad(format!(
            "{}: the checkers found no anomaly in these records: nothing to import",
            options.folder.display()
        )));
    }
    let records = Records::read(&events);
    if records.claims.is_empty() {
        return Err(FolderError::Bad(format!(
            "{}: the records hold no claim (no ledger, no runner log with a grant): no job to play",
            options.folder.display()
        )));
    }
    let source = options.folder.display().to_string();
    let plan = Plan::make(&records, &anomalies, &options.jobs, &source)?;
    let text = plan.text();
    let checkers = crate::scenario::checker_names();
    if let Err(error) = workloads::scenario::parse(&text, &checkers) {
        return Err(FolderError::Write(format!("the imported scenario does not read back: {error}\n{text}")));
    }
    write_whole(&options.out, &text)?;
    Ok(Imported {
        jobs: plan.jobs.iter().map(|job| job.id.clone()).collect(),
        runners: plan.runners.len() as u32,
        faults: plan.steps.iter().filter(|step| matches!(step.action, Action::Fault { .. })).count(),
        played: plan.played,
        checkers: plan.checkers.clone(),
        unknowns: plan.unknowns.clone(),
    })
}

/// Writes a file whole or not at all.
fn write_whole(path: &Path, text: &str) -> Result<(), FolderError> {
    let named = |error: std::io::Error| FolderError::Write(format!("--out {}: {error}", path.display()));
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, text).map_err(named)?;
    std::fs::rename(&partial, path).map_err(named)
}

/// One attempt as the ledger (or its runner's log) granted it.
#[derive(Clone, Debug)]
struct Claim {
    attempt: String,
    job: String,
    runner: String,
    fence: Option<u64>,
    at_ns: u64,
    /// Its ledger entry's `seq`, when the ledger holds it.
    seq: Option<u64>,
    /// 1-based, in its job.
    number: u32,
}

/// The records of an incident, indexed.
struct Records<'a> {
    /// Ledger entries in `seq` order.
    ledger: Vec<&'a Event>,
    by_seq: BTreeMap<u64, &'a Event>,
    /// Each runner's log, in time order.
    logs: BTreeMap<String, Vec<&'a Event>>,
    claims: Vec<Claim>,
    /// Job → (deployment key, submit time, submit seq).
    submits: BTreeMap<String, (Option<String>, u64, Option<u64>)>,
    config: history::Config,
    has_target_log: bool,
    /// The target's step records, in time order.
    target_steps: Vec<&'a Event>,
    /// The end of the records.
    end_ns: u64,
}

fn seq_of(event: &Event) -> Option<u64> {
    event.value.as_ref()?.get("seq")?.as_u64()
}

fn ledger_seq_of(event: &Event) -> Option<u64> {
    event.value.as_ref()?.get("ledger_seq")?.as_u64()
}

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

impl<'a> Records<'a> {
    fn read(events: &'a [Event]) -> Records<'a> {
        let mut ledger: Vec<&Event> = events.iter().filter(|event| event.kind == EventType::Ledger).collect();
        ledger.sort_by_key(|event| (seq_of(event).unwrap_or(u64::MAX), event.index));
        let by_seq = ledger.iter().filter_map(|event| Some((seq_of(event)?, *event))).collect();
        let mut logs: BTreeMap<String, Vec<&Event>> = BTreeMap::new();
        for event in events {
            if let Process::Runner(id) = &event.process {
                logs.entry(id.clone()).or_default().push(event);
            }
        }
        let mut claims: Vec<Claim> = Vec::new();
        let mut submits = BTreeMap::new();
        for entry in &ledger {
            let Some(job) = entry.job.clone() else { continue };
            match entry.f {
                Op::Submit => {
                    submits.entry(job).or_insert((entry.key.clone(), entry.time_ns, seq_of(entry)));
                }
                Op::Claim if entry.decision != Some(Decision::Rejected) => {
                    let (Some(attempt), Some(runner)) = (entry.attempt.clone(), entry.runner.clone()) else { continue };
                    if claims.iter().any(|claim| claim.attempt == attempt) {
                        continue;
                    }
                    let number = claims.iter().filter(|claim| claim.job == job).count() as u32 + 1;
                    submits.entry(job.clone()).or_insert((entry.key.clone(), entry.time_ns, None));
                    claims.push(Claim {
                        attempt,
                        job,
                        runner,
                        fence: entry.fence,
                        at_ns: entry.time_ns,
                        seq: seq_of(entry),
                        number,
                    });
                }
                _ => {}
            }
        }
        // Grants the ledger does not hold (no ledger given): from the runners' logs.
        for (runner, log) in &logs {
            for event in log.iter().filter(|event| event.kind == EventType::Response && event.f == Op::Claim) {
                let (Some(attempt), Some(job)) = (event.attempt.clone(), event.job.clone()) else { continue };
                if event.decision != Some(Decision::Accepted) || claims.iter().any(|claim| claim.attempt == attempt) {
                    continue;
                }
                let number = claims.iter().filter(|claim| claim.job == job).count() as u32 + 1;
                submits.entry(job.clone()).or_insert((event.key.clone(), event.time_ns, None));
                claims.push(Claim {
                    attempt,
                    job,
                    runner: runner.clone(),
                    fence: event.fence,
                    at_ns: event.time_ns,
                    seq: None,
                    number,
                });
            }
        }
        claims.sort_by_key(|claim| claim.at_ns);
        let config = events.iter().find_map(history::Config::of).unwrap_or_default();
        Records {
            ledger,
            by_seq,
            logs,
            claims,
            submits,
            config,
            has_target_log: events.iter().any(|event| event.process == Process::TARGET),
            target_steps: {
                let mut steps: Vec<&Event> =
                    events.iter().filter(|event| event.process == Process::TARGET && event.f == Op::Step).collect();
                steps.sort_by_key(|event| event.time_ns);
                steps
            },
            end_ns: events.iter().map(|event| event.time_ns).max().unwrap_or(0),
        }
    }

    fn claim(&self, attempt: &str) -> Option<&Claim> {
        self.claims.iter().find(|claim| claim.attempt == attempt)
    }

    /// The lease policy: the config's, else the longest lease a claim was granted.
    fn lease_ms(&self) -> (u64, Option<String>) {
        if let Some(lease) = self.config.lease_ms {
            return (lease, None);
        }
        let granted = self.ledger.iter().filter(|entry| entry.f == Op::Claim).filter_map(|entry| {
            let lease = entry.lease_expires_ms? - entry.received_ms?;
            (lease > 0).then_some(lease as u64)
        });
        match granted.max() {
            Some(lease) => {
                let said =
                    format!("the lease policy is not in the records: {lease} ms, as the ledger's claims were granted");
                (lease.clamp(100, 60_000), Some(said))
            }
            None => (
                LEASE_DEFAULT_MS,
                Some(format!(
                    "the lease policy is not in the records, nor a lease in the ledger: {LEASE_DEFAULT_MS} ms assumed"
                )),
            ),
        }
    }

    /// Ledger entries of an attempt, in `seq` order.
    fn entries_of(&self, attempt: &str) -> Vec<&'a Event> {
        self.ledger.iter().copied().filter(|entry| entry.attempt.as_deref() == Some(attempt)).collect()
    }

    /// Ledger entries of a job, in `seq` order.
    fn job_entries(&self, job: &str) -> Vec<&'a Event> {
        self.ledger.iter().copied().filter(|entry| entry.job.as_deref() == Some(job)).collect()
    }
}

/// A runner's call and what came of it.
#[derive(Clone, Copy, Debug)]
struct Exchange<'a> {
    request: &'a Event,
    /// The response, or the `info` of no answer.
    answer: Option<&'a Event>,
    /// The ledger entry that recorded it.
    entry: Option<&'a Event>,
}

impl Exchange<'_> {
    fn answered(&self) -> bool {
        self.answer.is_some_and(|answer| answer.kind == EventType::Response)
    }

    /// Nanoseconds from the request to its ledger entry.
    fn transit_ns(&self) -> Option<u64> {
        Some(self.entry?.time_ns.saturating_sub(self.request.time_ns))
    }

    /// When the exchange ended (its answer; its request when none came).
    fn end_ns(&self) -> u64 {
        self.answer.map_or(self.request.time_ns, |answer| answer.time_ns)
    }
}

/// A runner's exchanges (requests paired with their answers in order, per operation and
/// attempt), each matched to the ledger entry that recorded it.
fn exchanges<'a>(records: &Records<'a>, log: &[&'a Event], lease_ns: u64) -> Vec<Exchange<'a>> {
    let mut pending: BTreeMap<(Op, Option<String>), std::collections::VecDeque<usize>> = BTreeMap::new();
    let mut out: Vec<Exchange<'a>> = Vec::new();
    for event in log {
        let slot = (event.f, event.attempt.clone());
        match event.kind {
            EventType::Request => {
                pending.entry(slot).or_default().push_back(out.len());
                out.push(Exchange { request: event, answer: None, entry: None });
            }
            EventType::Response | EventType::Info => {
                // A claim's grant names the attempt its request did not.
                let at = pending
                    .get_mut(&slot)
                    .and_then(|queue| queue.pop_front())
                    .or_else(|| pending.get_mut(&(event.f, None)).and_then(|queue| queue.pop_front()));
                if let Some(at) = at {
                    out[at].answer = Some(event);
                }
            }
            _ => {}
        }
    }
    let mut taken: BTreeSet<u64> = BTreeSet::new();
    for exchange in &mut out {
        let by_seq = exchange.answer.and_then(ledger_seq_of).and_then(|seq| records.by_seq.get(&seq).copied());
        // An answer naming an entry received before its request was sent names another
        // request's entry (a duplicate answered with the committed result's): that entry
        // recorded the earlier request, whose own answer may never have come.
        let by_seq = by_seq.filter(|entry| entry.time_ns >= exchange.request.time_ns);
        if let Some(entry) = by_seq {
            taken.insert(entry.index);
            exchange.entry = Some(entry);
        }
    }
    for exchange in &mut out {
        if exchange.entry.is_some() || exchange.request.f == Op::Step {
            continue;
        }
        let request = exchange.request;
        let until = exchange.answer.map_or(request.time_ns + 2 * lease_ns, |answer| answer.time_ns);
        let attempt = exchange.answer.and_then(|answer| answer.attempt.clone()).or(request.attempt.clone());
        let found = records.ledger.iter().copied().find(|entry| {
            entry.f == request.f
                && entry.attempt == attempt
                && entry.runner == request.runner
                && (request.time_ns..=until).contains(&entry.time_ns)
                && !taken.contains(&entry.index)
        });
        if let Some(entry) = found {
            taken.insert(entry.index);
            exchange.entry = Some(entry);
        }
    }
    out
}

/// A fault the records imply, before it becomes a step.
#[derive(Clone, Debug)]
struct Found {
    at_ns: u64,
    duration_ms: u64,
    runner: Option<String>,
    variant: Variant,
    because: Vec<String>,
}

/// A report the ledger holds under a runner whose log never sent it.
#[derive(Clone, Debug)]
struct Forged<'a> {
    entry: &'a Event,
    /// The ledger entry before it on its job: the state it came in.
    after: Option<&'a Event>,
}

/// A played report: its step, the wait before it (and why), and its comments.
/// A played report: its step, the wait before it (and why), its comments, and whether it
/// keeps its incident time (`at_ms`) or runs as soon as its wait is met (a borrowed claim's).
type PlayedReport = (Action, Option<(Condition, String)>, Vec<String>, bool);

/// The scenario being made.
struct Plan {
    name: String,
    description: String,
    header_comments: Vec<String>,
    jobs: Vec<PlayedJob>,
    /// Incident runner → scenario runner (`rN`).
    runners: BTreeMap<String, String>,
    runner_count: u32,
    lease_ms: u64,
    heartbeat_interval_ms: Option<u64>,
    reconcile_after_ms: Option<u64>,
    target_mode: history::TargetMode,
    steps: Vec<Step>,
    step_comments: Vec<Vec<String>>,
    checkers: Vec<String>,
    expect_comments: Vec<String>,
    unknowns: Vec<String>,
    played: usize,
}

#[derive(Clone, Debug)]
struct PlayedJob {
    id: String,
    key: String,
    steps: u32,
    step_ms: u64,
    submit_ns: u64,
    /// When the scenario submits it, on the incident's clock: its first claim, when that came
    /// after the submit and did not wait for another played job (the queue it waited in, the
    /// runners busy with jobs not played, is not the scenario's); else its submit.
    play_ns: u64,
    end_ns: u64,
    first_runner: Option<String>,
    /// The played job whose attempt held this job's key when it was submitted, so that its
    /// first claim waited for the key (and is not pinned to a runner).
    waited_for: Option<String>,
}

/// The order anomalies are taken in: by the first event each cites.
fn first_event(anomaly: &Anomaly) -> u64 {
    anomaly.events.iter().copied().min().unwrap_or(u64::MAX)
}

impl Plan {
    fn make(records: &Records, anomalies: &[Anomaly], wanted: &[String], source: &str) -> Result<Plan, FolderError> {
        let (lease_ms, lease_said) = records.lease_ms();
        let lease_ns = lease_ms * 1_000_000;
        let mut unknowns: Vec<String> = lease_said.into_iter().collect();
        let job_of_attempt = |attempt: &str| records.claim(attempt).map(|claim| claim.job.clone());
        let named_jobs = |anomaly: &Anomaly| -> Vec<String> {
            let mut jobs: Vec<String> = anomaly.job.iter().cloned().collect();
            jobs.extend(anomaly.attempts.iter().filter_map(|attempt| job_of_attempt(attempt)));
            jobs
        };
        // The jobs: those asked for, else the earliest anomalies' (and every job they name).
        let mut ordered: Vec<&Anomaly> = anomalies.iter().collect();
        ordered.sort_by_key(|anomaly| first_event(anomaly));
        let mut chosen: Vec<String> = Vec::new();
        if wanted.is_empty() {
            for anomaly in &ordered {
                let jobs = named_jobs(anomaly);
                if jobs.is_empty() || jobs.iter().all(|job| chosen.contains(job)) {
                    continue;
                }
                if chosen.len() >= JOBS_MAX {
                    break;
                }
                for job in jobs {
                    if !chosen.contains(&job) {
                        chosen.push(job);
                    }
                }
            }
        } else {
            for job in wanted {
                if !records.submits.contains_key(job) {
                    return Err(FolderError::Bad(format!("--job {job}: the records hold no such job")));
                }
                chosen.push(job.clone());
            }
        }
        chosen.retain(|job| records.submits.contains_key(job));
        // A report played under a runner names a job of its own (a cross-job report): that
        // job is played too.
        let cited: BTreeSet<u64> = anomalies.iter().flat_map(|anomaly| anomaly.events.iter().copied()).collect();
        let relevant =
            |report: &Forged| cited.contains(&report.entry.index) || report.entry.decision != Some(Decision::Rejected);
        let sent = sent_entries(records, lease_ns);
        let forged_of = |chosen: &[String]| -> Vec<Forged> {
            let claims = records.claims.iter().filter(|claim| chosen.contains(&claim.job));
            claims.flat_map(|claim| forged_reports(records, claim, &sent)).filter(relevant).collect()
        };
        for report in forged_of(&chosen) {
            if let Some(job) = report.entry.job.clone().filter(|job| records.submits.contains_key(job)) {
                if !chosen.contains(&job) {
                    chosen.push(job);
                }
            }
        }
        let forged = forged_of(&chosen);
        if chosen.is_empty() {
            return Err(FolderError::Bad(format!(
                "{source}: the anomalies name no job the records hold a claim or a submit of: no job to play"
            )));
        }
        let picked: Vec<&Anomaly> = ordered
            .iter()
            .copied()
            .filter(|anomaly| named_jobs(anomaly).iter().any(|job| chosen.contains(job)))
            .collect();
        if picked.is_empty() {
            let jobs = chosen.join(", ");
            return Err(FolderError::Bad(format!(
                "{source}: no anomaly names {jobs}: nothing of the incident to play"
            )));
        }
        let mut checkers: Vec<String> = Vec::new();
        for anomaly in &picked {
            if !checkers.contains(&anomaly.checker) {
                checkers.push(anomaly.checker.clone());
            }
        }
        // The runners that held the chosen jobs' attempts, kept by name when they are `rN`.
        let held: Vec<&Claim> = records.claims.iter().filter(|claim| chosen.contains(&claim.job)).collect();
        let mut incident_runners: Vec<String> = Vec::new();
        for claim in &held {
            if !incident_runners.contains(&claim.runner) {
                incident_runners.push(claim.runner.clone());
            }
        }
        // A runner that held none of them but sent a played report under its own name (a
        // borrowed claim) is played too.
        let reporters: Vec<String> = forged
            .iter()
            .filter_map(|report| report.entry.runner.clone())
            .filter(|runner| !incident_runners.contains(runner))
            .collect();
        for runner in &reporters {
            if !incident_runners.contains(runner) {
                incident_runners.push(runner.clone());
            }
        }
        let numbered = |runner: &String| {
            runner.strip_prefix('r').and_then(|n| n.parse::<u32>().ok()).filter(|n| (1..=16).contains(n))
        };
        let keep_names = incident_runners.iter().all(|runner| numbered(runner).is_some());
        let runners: BTreeMap<String, String> = if keep_names {
            incident_runners.iter().map(|runner| (runner.clone(), runner.clone())).collect()
        } else {
            incident_runners.iter().enumerate().map(|(at, runner)| (runner.clone(), format!("r{}", at + 1))).collect()
        };
        let runner_count = if keep_names {
            incident_runners.iter().filter_map(numbered).max().unwrap_or(1)
        } else {
            (incident_runners.len() as u32).clamp(1, 16)
        };
        // A second runner takes the job over when its first is cut off, as in the incident.
        let runner_count = runner_count.max(if held.iter().any(|claim| claim.number > 1) { 2 } else { 1 });
        let mut plan = Plan {
            name: scenario_name(source),
            description: String::new(),
            header_comments: Vec::new(),
            jobs: Vec::new(),
            runners,
            runner_count,
            lease_ms,
            heartbeat_interval_ms: None,
            reconcile_after_ms: None,
            target_mode: history::TargetMode::Fenced,
            steps: Vec::new(),
            step_comments: Vec::new(),
            checkers,
            expect_comments: Vec::new(),
            unknowns: Vec::new(),
            played: 0,
        };
        for runner in &incident_runners {
            if !records.logs.contains_key(runner) {
                unknowns.push(format!(
                    "{runner}'s log is absent: its faults are read off the ledger alone (a gap in its reports is played as a cut; a pause, a kill or a cut look the same there)"
                ));
            }
        }
        plan.settings(records, &mut unknowns);
        // Jobs, their spec and their span.
        for job in &chosen {
            let (key, submit_ns, _) = records.submits[job].clone();
            let key = key.unwrap_or_else(|| {
                unknowns.push(format!("{job}'s deployment key is not in the records: `{job}` assumed"));
                job.clone()
            });
            let (steps, step_ms, said) = spec_of(records, job);
            if let Some(said) = said {
                unknowns.push(said);
            }
            let entries = records.job_entries(job);
            let logged = records.logs.values().flatten().filter(|event| event.job.as_deref() == Some(job.as_str()));
            let end_ns = entries
                .iter()
                .map(|entry| entry.time_ns)
                .chain(logged.map(|event| event.time_ns))
                .max()
                .unwrap_or(submit_ns);
            let first_runner = held
                .iter()
                .find(|claim| &claim.job == job && claim.number == 1)
                .map(|claim| plan.runners[&claim.runner].clone());
            let job = PlayedJob {
                id: job.clone(),
                key,
                steps,
                step_ms,
                submit_ns,
                play_ns: submit_ns,
                end_ns,
                first_runner,
                waited_for: None,
            };
            plan.jobs.push(job);
        }
        plan.jobs.sort_by_key(|job| job.submit_ns);
        // A first claim that waited for another played job's hold on the key went to whichever
        // runner was free when the key was: which one that is, the scenario cannot arrange.
        let first_claim = |job: &str| held.iter().find(|claim| claim.job == job).map(|claim| claim.at_ns);
        for at in 0..plan.jobs.len() {
            let job = &plan.jobs[at];
            let waited_for = plan.jobs.iter().find(|other| {
                other.id != job.id
                    && other.key == job.key
                    && other.end_ns > job.submit_ns
                    && match (first_claim(&other.id), first_claim(&job.id)) {
                        (Some(before), Some(ours)) => before < ours,
                        _ => false,
                    }
            });
            match waited_for.map(|other| other.id.clone()) {
                Some(other) => {
                    plan.jobs[at].first_runner = None;
                    plan.jobs[at].waited_for = Some(other);
                }
                None => {
                    let job = &mut plan.jobs[at];
                    job.play_ns = first_claim(&job.id).unwrap_or(job.submit_ns).max(job.submit_ns);
                }
            }
        }
        plan.jobs.sort_by_key(|job| job.play_ns);
        // Faults and forged reports, each attempt of the chosen jobs in turn.
        let mut found: Vec<Found> = Vec::new();
        for claim in &held {
            match records.logs.get(&claim.runner) {
                Some(log) => found.extend(from_log(records, claim, log, lease_ns)),
                None => found.extend(from_ledger(records, claim, lease_ns)),
            }
        }
        found.extend(skews(records, &held, lease_ns));
        found.extend(target_skews(records, &plan.jobs, lease_ns));
        found.extend(restarts(records, &plan.jobs, lease_ns));
        found.extend(kept_from_claiming(records, &forged, &reporters, lease_ns));
        cover_held_steps(&mut found);
        merge_overlaps(&mut found);
        plan.steps_of(records, &found, &forged, lease_ns);
        plan.header(records, source, &picked, &held);
        for checker in &plan.checkers {
            let messages: Vec<&str> =
                picked.iter().filter(|a| &a.checker == checker).map(|a| a.message.as_str()).collect();
            let more = if messages.len() > 2 { format!(" (and {} more)", messages.len() - 2) } else { String::new() };
            plan.expect_comments.push(format!(
                "{checker} found in the incident: {}{more}",
                messages.iter().take(2).copied().collect::<Vec<_>>().join("; ")
            ));
        }
        plan.unknowns = unknowns;
        Ok(plan)
    }

    /// The header's timings and the target's mode: the config's where it says them, else
    /// what the records show.
    fn settings(&mut self, records: &Records, unknowns: &mut Vec<String>) {
        let config = &records.config;
        let number = |key: &str| config.rest.get(key).and_then(serde_json::Value::as_u64);
        self.heartbeat_interval_ms = number("heartbeat_interval_ms").or_else(|| heartbeat_interval(records));
        if let Some(interval) = self.heartbeat_interval_ms {
            if interval == 0 || interval >= self.lease_ms {
                self.heartbeat_interval_ms = None;
            }
        }
        self.reconcile_after_ms =
            number("reconcile_after_ms").or_else(|| reconcile_after(records)).map(|ms| ms.min(600_000));
        match config.target_mode {
            Some(mode) => self.target_mode = mode,
            None => unknowns.push(if records.has_target_log {
                "the target's mode is not in the records: `fenced` assumed".to_string()
            } else {
                "the target's step log is absent, and its mode is not in the records: a `fenced` target assumed; what the target applied is not played"
                    .to_string()
            }),
        }
    }

    /// The steps: submits, faults and played reports at their times, on the scenario's clock.
    fn steps_of(&mut self, records: &Records, found: &[Found], forged: &[Forged], lease_ns: u64) {
        let clock = Clock::new(&self.jobs, found, lease_ns);
        let mut steps: Vec<(u64, u64, Action, Vec<String>, bool)> = Vec::new();
        for job in &self.jobs {
            let mut said = vec![format!(
                "{} submitted at {} on key {} (ledger seq {})",
                job.id,
                secs(job.submit_ns),
                job.key,
                records.submits[&job.id].2.map_or("-".to_string(), |seq| seq.to_string())
            )];
            for claim in records.claims.iter().filter(|claim| claim.job == job.id) {
                said.push(format!(
                    "{} (fence {}) held by {}{} at {} (ledger seq {})",
                    claim.attempt,
                    claim.fence.map_or("-".to_string(), |fence| fence.to_string()),
                    claim.runner,
                    self.renamed(&claim.runner),
                    secs(claim.at_ns),
                    claim.seq.map_or("-".to_string(), |seq| seq.to_string())
                ));
            }
            if job.first_runner.is_some() {
                said.push(
                    "its first attempt is claimed by the runner that held it; later ones by whichever runner is free"
                        .into(),
                );
            }
            if job.play_ns > job.submit_ns + 100_000_000 {
                said.push(format!(
                    "it waited {} in the queue for a runner (busy with jobs not played here): submitted here at its first claim",
                    secs(job.play_ns - job.submit_ns)
                ));
            }
            if let Some(other) = &job.waited_for {
                said.push(format!(
                    "its first attempt waited for {other}'s hold on key {}: claimed by whichever runner is free then",
                    job.key
                ));
            }
            let action = Action::Submit {
                job: job.id.clone(),
                key: job.key.clone(),
                steps: job.steps,
                step_ms: job.step_ms,
                runner: job.first_runner.clone(),
            };
            steps.push((job.play_ns, 0, action, said, true));
        }
        for fault in found {
            let runner =
                fault.runner.as_ref().map(|runner| self.runners.get(runner).cloned().unwrap_or(runner.clone()));
            let parameters = serde_json::to_value(&fault.variant).unwrap_or_default();
            let action = Action::Fault {
                fault: Some(fault.variant.kind()),
                how: fault.variant.name().to_string(),
                runner,
                replica: None,
                duration_ms: fault.duration_ms,
                latency_ms: parameters.get("latency_ms").and_then(serde_json::Value::as_u64),
                offset_ms: parameters.get("offset_ms").and_then(serde_json::Value::as_i64),
            };
            steps.push((fault.at_ns, 1, action, fault.because.clone(), true));
        }
        for report in forged {
            let Some((action, wait, said, timed)) = self.played_report(records, report, lease_ns) else { continue };
            if let Some((condition, why)) = wait {
                steps.push((report.entry.time_ns, 2, Action::Wait(Box::new(condition)), vec![why], false));
            }
            steps.push((report.entry.time_ns, 3, action, said, timed));
            self.played += 1;
        }
        // A pinned submit is placed its lead before its claim; the steps in the order of their
        // times on the scenario's clock, then of the incident's.
        let placed = |at_ns: u64, action: &Action| match action {
            Action::Submit { runner: Some(_), .. } => clock.at_ms(at_ns).saturating_sub(PIN_LEAD_MS),
            _ => clock.at_ms(at_ns),
        };
        steps.sort_by_key(|(at_ns, order, action, _, _)| (placed(*at_ns, action), *at_ns, *order));
        let mut last_ms = 0;
        for (index, (at_ns, _, action, said, timed)) in steps.into_iter().enumerate() {
            let at_ms = placed(at_ns, &action).max(last_ms);
            last_ms = at_ms;
            let at_ms = timed.then_some(at_ms);
            // An attempt after the first exists only where the system retried the job: where
            // it did not (a fixed system), the steps that name it are skipped, not failed.
            let if_attempt_exists = action.named_attempt().is_some_and(|(_, number)| number > 1);
            let mut said = said;
            if if_attempt_exists {
                if let Some((job, number)) = action.named_attempt() {
                    said.push(format!(
                        "{job}'s attempt {number} exists only where {job} was retried: skipped where it was not"
                    ));
                }
            }
            self.steps.push(Step { index: index + 1, line: 0, at_ms, action, if_attempt_exists });
            self.step_comments.push(said);
        }
    }

    /// ` (here rN)` when the scenario names the runner otherwise.
    fn renamed(&self, runner: &str) -> String {
        match self.runners.get(runner) {
            Some(name) if name != runner => format!(" (here {name})"),
            _ => String::new(),
        }
    }

    /// A report the ledger holds that its runner never sent, as a played step, with the
    /// wait for the ledger entry it came after.
    fn played_report(&self, records: &Records, report: &Forged, lease_ns: u64) -> Option<PlayedReport> {
        let entry = report.entry;
        let runner = self.runners.get(entry.runner.as_deref()?)?.clone();
        let job = entry.job.clone()?;
        let attempt = records.claim(entry.attempt.as_deref()?)?;
        let attempt_job = (attempt.job != job).then(|| attempt.job.clone());
        // Another runner's attempt, borrowed. A borrowed capability is not played: the
        // borrowed heartbeat and result show the bug (a refused `capability` step once failed
        // the scenario where the bug is fixed; it is recorded now, never measured so). On a
        // later attempt, which runner claims it in the scenario is not arranged, so the report
        // waits for the claim and is played at once, while the attempt is current.
        let lent = entry.runner.as_deref() != Some(attempt.runner.as_str());
        if lent && entry.f == Op::Capability {
            return None;
        }
        let borrowed = attempt.number > 1 && lent;
        let played = |id: &str| self.jobs.iter().any(|played| played.id == id);
        if !played(&attempt.job) || !played(&job) {
            return None;
        }
        let offset = match (entry.observed_ms, entry.received_ms) {
            (Some(observed), Some(received)) if (observed - received).unsigned_abs() > lease_ns / 1_000_000 => {
                observed - received
            }
            _ => 0,
        };
        let seq = seq_of(entry).map_or("-".to_string(), |seq| seq.to_string());
        let mut said = vec![format!(
            "ledger seq {seq} at {}: a {} for {} under {}{}, {}{} — {}'s log never sent it: played with its token (who sent it, the records cannot tell)",
            secs(entry.time_ns),
            entry.f,
            entry.attempt.as_deref().unwrap_or("-"),
            entry.runner.as_deref().unwrap_or("-"),
            self.renamed(entry.runner.as_deref().unwrap_or("")),
            entry.decision.map_or("recorded".to_string(), |decision| format!("{decision:?}").to_lowercase()),
            entry.outcome.as_deref().map_or(String::new(), |outcome| format!(" ({outcome})")),
            entry.runner.as_deref().unwrap_or("-"),
        )];
        if entry.fence.is_some() && entry.fence != attempt.fence {
            said.push(format!(
                "it named fence {} where {} has fence {}: played with the attempt's own fence (the scenario's fences are its own)",
                entry.fence.unwrap_or(0),
                attempt.attempt,
                attempt.fence.unwrap_or(0)
            ));
        }
        let action = match entry.f {
            Op::Result => Action::Report {
                as_runner: runner,
                job: job.clone(),
                attempt: attempt.number,
                attempt_job,
                fence: None,
                outcome: entry.outcome.clone().filter(|outcome| outcome == "succeeded" || outcome == "failed")?,
                observed_offset_ms: offset,
            },
            Op::Heartbeat if attempt_job.is_none() => Action::Heartbeat {
                as_runner: runner,
                job: job.clone(),
                attempt: attempt.number,
                fence: None,
                observed_offset_ms: offset,
            },
            Op::Capability if attempt_job.is_none() => {
                Action::Capability { as_runner: runner, job: job.clone(), attempt: attempt.number }
            }
            _ => return None,
        };
        if borrowed {
            let condition = Condition {
                job: Some(attempt.job.clone()),
                ledger: Some(Op::Claim),
                attempt: Some(attempt.number),
                within_ms: Some((20 * self.lease_ms).clamp(10_000, workloads::scenario::WITHIN_MAX_MS)),
                ..Condition::default()
            };
            let why = format!(
                "it borrowed {}, held by {} (ledger seq {}): wait for that claim, then played at once",
                attempt.attempt,
                attempt.runner,
                attempt.seq.map_or("-".to_string(), |seq| seq.to_string())
            );
            return Some((action, Some((condition, why)), said, false));
        }
        let wait = report.after.and_then(|after| {
            let claim = after.attempt.as_deref().and_then(|id| records.claim(id));
            // The runner is named only where the scenario pins it: a first attempt of a pinned
            // job. Any other attempt goes to whichever runner is free.
            let pinned = claim.filter(|claim| claim.number == 1).and_then(|claim| {
                self.jobs.iter().find(|job| job.id == claim.job).and_then(|job| job.first_runner.clone())
            });
            let runner = after.runner.as_deref().and_then(|runner| self.runners.get(runner)).cloned();
            let condition = Condition {
                job: after.job.clone(),
                ledger: Some(after.f),
                attempt: claim.map(|claim| claim.number),
                runner: runner.filter(|runner| pinned.as_ref() == Some(runner)),
                // Not the entry's decision: a report's ruling is the system's, and a system
                // without the bug rules it otherwise (a blind-retry-on-zero-rows incident's
                // stale heartbeat waited for a result answered `duplicate` that the correct
                // lab, which never saw that retry, answered `accepted`: 0 of 10 runs valid).
                decision: None,
                within_ms: Some((20 * self.lease_ms).clamp(10_000, workloads::scenario::WITHIN_MAX_MS)),
                ..Condition::default()
            };
            let why = format!(
                "it came after ledger seq {} ({} {}): wait for that entry",
                seq_of(after).map_or("-".to_string(), |seq| seq.to_string()),
                after.f,
                after.attempt.as_deref().unwrap_or(after.job.as_deref().unwrap_or("-"))
            );
            // A wait names an attempt only with its job; a submit names none.
            (after.f != Op::Submit || condition.attempt.is_none()).then_some((condition, why))
        });
        let wait = wait
            .filter(|(condition, _)| condition.job.as_ref().is_some_and(|job| self.jobs.iter().any(|j| &j.id == job)));
        Some((action, wait, said, true))
    }

    fn header(&mut self, records: &Records, source: &str, picked: &[&Anomaly], held: &[&Claim]) {
        let jobs: Vec<String> = self.jobs.iter().map(|job| format!("{} (key {})", job.id, job.key)).collect();
        self.description = format!("imported from {}: {} on {}", source, self.checkers.join(", "), jobs.join(", "));
        let mut said = vec![
            format!("Imported by `fencelab import` from {source}."),
            format!(
                "The records hold: {}.",
                [
                    (!records.ledger.is_empty()).then_some("the ledger"),
                    (!records.logs.is_empty()).then_some("runner logs"),
                    records.has_target_log.then_some("the target's step log"),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            ),
            "The incident's anomalies played here:".to_string(),
        ];
        for anomaly in picked.iter().take(6) {
            said.push(format!("  {} ({}): {}", anomaly.checker, anomaly.kind, anomaly.message));
        }
        if picked.len() > 6 {
            said.push(format!("  … and {} more", picked.len() - 6));
        }
        let attempts: Vec<String> = held
            .iter()
            .map(|claim| format!("{} by {}{}", claim.attempt, claim.runner, self.renamed(&claim.runner)))
            .collect();
        said.push(format!("Attempts: {}.", attempts.join(", ")));
        said.push(
            "Each [[expect]] asks a checker that found the incident's anomalies to find none: the scenario fails (exit 1) where the bug is, and passes where it is fixed."
                .to_string(),
        );
        said.push("Run it with `fencelab scenario run FILE [--system SYSTEM.toml --variant NAME]`.".to_string());
        self.header_comments = said;
    }

    /// The scenario file: its steps and expectations through the format's own writer, each
    /// with its comments.
    fn text(&self) -> String {
        let scenario = Scenario {
            name: self.name.clone(),
            description: self.description.clone(),
            seed: 0,
            runners: self.runner_count,
            idle: Vec::new(),
            lease_ms: self.lease_ms,
            target_mode: self.target_mode,
            bugs: Vec::new(),
            db: None,
            control_planes: 1,
            operator: OperatorMode::Automatic,
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            reconcile_after_ms: self.reconcile_after_ms,
            settle_within_ms: 30_000,
            settle_quiet_ms: None,
            steps: self.steps.clone(),
            expects: self
                .checkers
                .iter()
                .map(|checker| Condition {
                    checker: Some(checker.clone()),
                    verdict: Some("valid".into()),
                    ..Condition::default()
                })
                .collect(),
        };
        let body = scenario.to_toml();
        let mut out = String::new();
        for line in &self.header_comments {
            out.push_str(&comment(line));
        }
        if !self.unknowns.is_empty() {
            out.push_str("#\n# What the records cannot tell:\n");
            for unknown in &self.unknowns {
                out.push_str(&comment(&format!("  - {unknown}")));
            }
        }
        let (mut step, mut expect) = (0, 0);
        for line in body.lines() {
            match line.trim() {
                "[[step]]" => {
                    out.push('\n');
                    for said in self.step_comments.get(step).into_iter().flatten() {
                        out.push_str(&comment(said));
                    }
                    step += 1;
                }
                "[[expect]]" => {
                    out.push('\n');
                    if let Some(said) = self.expect_comments.get(expect) {
                        out.push_str(&comment(said));
                    }
                    expect += 1;
                }
                _ => {}
            }
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

/// A comment of one or more lines, wrapped near 100 columns.
fn comment(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    let indent = text.len() - text.trim_start().len();
    for word in text.split_whitespace() {
        if line.len() + word.len() + 1 > 100 && line.trim() != "#" {
            out.push_str(&line);
            out.push('\n');
            line = format!("#{}", " ".repeat(indent + 2));
        }
        line.push(' ');
        if line == "# " && indent > 0 {
            line.push_str(&" ".repeat(indent));
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// A scenario name from the folder's: `import-` and its last parts, in the letters a name takes.
fn scenario_name(source: &str) -> String {
    let parts: Vec<&str> = Path::new(source)
        .components()
        .rev()
        .filter_map(|part| part.as_os_str().to_str())
        .filter(|part| !part.is_empty() && *part != "." && *part != "/")
        .take(1)
        .collect();
    let word: String =
        parts.join("-").chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    if word.is_empty() {
        "import".to_string()
    } else {
        format!("import-{word}")
    }
}

/// The scenario's clock: incident time → ms after the scenario's start. The first submit is
/// at [`START_MS`]; a quiet stretch longer than two leases between the jobs' spans is cut to
/// two leases.
struct Clock {
    origin_ns: u64,
    /// (incident time, ms removed from then on).
    cuts: Vec<(u64, u64)>,
}

impl Clock {
    fn new(jobs: &[PlayedJob], found: &[Found], lease_ns: u64) -> Clock {
        let origin_ns = jobs.iter().map(|job| job.play_ns).min().unwrap_or(0);
        let mut spans: Vec<(u64, u64)> = jobs.iter().map(|job| (job.play_ns, job.end_ns)).collect();
        spans.extend(found.iter().map(|fault| (fault.at_ns, fault.at_ns + fault.duration_ms * 1_000_000)));
        spans.sort_unstable();
        let mut cuts = Vec::new();
        let mut removed = 0;
        let mut reach = origin_ns;
        for (start, end) in spans {
            if start > reach + 2 * lease_ns {
                removed += ms(start - reach - 2 * lease_ns);
                cuts.push((start, removed));
            }
            reach = reach.max(end);
        }
        Clock { origin_ns, cuts }
    }

    fn at_ms(&self, at_ns: u64) -> u64 {
        let at_ns = at_ns.max(self.origin_ns);
        let removed = self.cuts.iter().rev().find(|(from, _)| *from <= at_ns).map_or(0, |(_, removed)| *removed);
        START_MS + ms(at_ns - self.origin_ns).saturating_sub(removed)
    }
}

/// The job's steps and the time each takes: its runners' step requests (`value.steps`, and
/// the time from a step's request to its answer), else its capabilities in the ledger, else
/// a guess, said.
fn spec_of(records: &Records, job: &str) -> (u32, u64, Option<String>) {
    let steps_logged =
        records.logs.values().flatten().filter(|event| event.f == Op::Step && event.job.as_deref() == Some(job));
    let mut total = None;
    let mut durations: Vec<u64> = Vec::new();
    let mut sent: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for event in steps_logged {
        let value = event.value.as_ref();
        let step = value.and_then(|value| value.get("step")).and_then(serde_json::Value::as_u64);
        if let Some(steps) = value.and_then(|value| value.get("steps")).and_then(serde_json::Value::as_u64) {
            total = Some(total.unwrap_or(0).max(steps));
        }
        let slot = (event.attempt.clone().unwrap_or_default(), step.unwrap_or(0));
        match event.kind {
            EventType::Request => {
                sent.insert(slot, event.time_ns);
            }
            EventType::Response if event.decision == Some(Decision::Accepted) => {
                if let Some(at) = sent.remove(&slot) {
                    durations.push(ms(event.time_ns.saturating_sub(at)));
                }
            }
            _ => {}
        }
    }
    if let Some(steps) = total.filter(|_| !durations.is_empty()) {
        durations.sort_unstable();
        let step_ms = (durations[durations.len() / 2] / 10) * 10;
        return (steps.clamp(1, 1_000) as u32, step_ms.min(600_000), None);
    }
    // The ledger alone: one capability per step, as the lab's runner redeems them.
    let mut best: Option<(u32, u64)> = None;
    for claim in records.claims.iter().filter(|claim| claim.job == job) {
        let times: Vec<u64> = records
            .entries_of(&claim.attempt)
            .iter()
            .filter(|entry| entry.f == Op::Capability && entry.decision == Some(Decision::Accepted))
            .map(|entry| entry.time_ns)
            .collect();
        if times.is_empty() {
            continue;
        }
        let mut gaps: Vec<u64> = times.windows(2).map(|pair| ms(pair[1] - pair[0])).collect();
        gaps.sort_unstable();
        let step_ms = (gaps.get(gaps.len() / 2).copied().unwrap_or(200) / 10) * 10;
        if best.is_none_or(|(steps, _)| times.len() as u32 > steps) {
            best = Some((times.len() as u32, step_ms));
        }
    }
    match (best, total) {
        (Some((_, step_ms)), Some(steps)) => (steps.clamp(1, 1_000) as u32, step_ms.min(600_000), None),
        (None, Some(steps)) => (
            steps.clamp(1, 1_000) as u32,
            200,
            Some(format!("how long {job}'s steps take is not in the records (none was answered): 200 ms assumed")),
        ),
        (Some((steps, step_ms)), None) => (
            steps.clamp(1, 1_000),
            step_ms.min(600_000),
            Some(format!(
                "{job}'s steps are not in the records (no runner log of its steps): {steps} of {step_ms} ms, one per capability its attempts were granted"
            )),
        ),
        (None, None) => (3, 200, Some(format!("{job}'s steps are not in the records: 3 of 200 ms assumed"))),
    }
}

/// The interval the runners' logs show between heartbeats (the median), when they show one.
fn heartbeat_interval(records: &Records) -> Option<u64> {
    let mut gaps: Vec<u64> = Vec::new();
    for log in records.logs.values() {
        let mut last: BTreeMap<&str, u64> = BTreeMap::new();
        for event in log.iter().filter(|event| event.kind == EventType::Request && event.f == Op::Heartbeat) {
            let Some(attempt) = event.attempt.as_deref() else { continue };
            if let Some(before) = last.insert(attempt, event.time_ns) {
                gaps.push(ms(event.time_ns - before));
            }
        }
    }
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2).copied().filter(|gap| *gap > 0)
}

/// How long the ledger shows attempts uncertain before a reconcile (the median), when it
/// shows one.
fn reconcile_after(records: &Records) -> Option<u64> {
    let mut waits: Vec<u64> = Vec::new();
    for claim in &records.claims {
        let entries = records.entries_of(&claim.attempt);
        let expired = entries.iter().find(|entry| entry.f == Op::Expire);
        let reconciled = entries.iter().find(|entry| entry.f == Op::Reconcile);
        if let (Some(expired), Some(reconciled)) = (expired, reconciled) {
            waits.push(ms(reconciled.time_ns.saturating_sub(expired.time_ns)));
        }
    }
    waits.sort_unstable();
    // The operator reconciles a little after its wait: a tenth taken off.
    waits.get(waits.len() / 2).map(|wait| wait * 9 / 10 / 10 * 10)
}

/// Faults read off a runner's log for one attempt: cuts, lost answers, held reports,
/// pauses and a kill.
fn from_log(records: &Records, claim: &Claim, log: &[&Event], lease_ns: u64) -> Vec<Found> {
    let all = exchanges(records, log, lease_ns);
    let on_attempt: Vec<&Exchange> = all
        .iter()
        .filter(|exchange| {
            exchange.request.attempt.as_deref() == Some(claim.attempt.as_str()) && exchange.request.f != Op::Step
        })
        .collect();
    let steps: Vec<&Exchange> = all
        .iter()
        .filter(|exchange| {
            exchange.request.attempt.as_deref() == Some(claim.attempt.as_str()) && exchange.request.f == Op::Step
        })
        .collect();
    let mut found = Vec::new();
    let runner = &claim.runner;
    let slow_ns = (lease_ns / 4).max(200_000_000);
    // A result sent again without an answer after one the ledger recorded whose answer never
    // came: the lost response going on (an identical retry is ruled a duplicate, which a
    // control plane may leave unrecorded), not a cut. Each lost response → when its last
    // retry ended.
    let mut retries: BTreeSet<usize> = BTreeSet::new();
    let mut retried_until: BTreeMap<usize, u64> = BTreeMap::new();
    for (at, exchange) in on_attempt.iter().enumerate() {
        if exchange.request.f != Op::Result || exchange.answered() || exchange.entry.is_some() {
            continue;
        }
        let unanswered =
            |before: &usize| on_attempt[*before].request.f == Op::Result && !on_attempt[*before].answered();
        if let Some(recorded) = (0..at).rev().take_while(unanswered).find(|before| on_attempt[*before].entry.is_some())
        {
            retries.insert(at);
            retried_until.insert(recorded, exchange.end_ns());
        }
    }
    // Unanswered requests the ledger never saw, in runs: a cut of the control link.
    let mut at = 0;
    while at < on_attempt.len() {
        let lost = |at: usize| {
            let exchange = on_attempt[at];
            !exchange.answered() && exchange.entry.is_none() && !retries.contains(&at)
        };
        if !lost(at) {
            at += 1;
            continue;
        }
        let first = at;
        while at < on_attempt.len() && lost(at) {
            at += 1;
        }
        let last = at - 1;
        let before = first.checked_sub(1).map(|before| on_attempt[before].end_ns()).unwrap_or(claim.at_ns);
        let start_ns = before.max(on_attempt[first].request.time_ns.saturating_sub(lease_ns / 4));
        let heard = on_attempt.get(at).map(|next| next.request.time_ns);
        // A request that hung until its timeout was cut off for as long, even where a later
        // one was answered (a heartbeat left hanging lets the lease lapse while the runner's
        // other requests pass).
        let hung_ns = on_attempt[first..=last].iter().map(|exchange| exchange.end_ns()).max().unwrap_or(0);
        let end_ns = heard.unwrap_or(on_attempt[last].end_ns() + lease_ns).max(hung_ns);
        let target_lost = steps.iter().any(|step| {
            (start_ns..=end_ns).contains(&step.request.time_ns)
                && step.answer.is_some_and(|answer| answer.kind == EventType::Info)
        });
        let variant = if target_lost { Variant::CutLinks } else { Variant::ControlLink };
        let mut because = vec![format!(
            "{runner}'s {} control request(s) on {} from {} to {} got no answer and reached no ledger entry ({} runner log event {}..{})",
            last - first + 1,
            claim.attempt,
            secs(on_attempt[first].request.time_ns),
            secs(on_attempt[last].request.time_ns),
            runner,
            on_attempt[first].request.index,
            on_attempt[last].end_ns_index(),
        )];
        match heard {
            Some(next) => because.push(format!(
                "its next one, at {}, was answered{}: its control link cut for {} ms",
                secs(next),
                on_attempt[at].entry.and_then(seq_of).map_or(String::new(), |seq| format!(" (ledger seq {seq})")),
                ms(end_ns - start_ns)
            )),
            None => because.push(format!(
                "it was not heard on {} again: its control link cut for {} ms (how long after, the records cannot tell)",
                claim.attempt,
                ms(end_ns - start_ns)
            )),
        }
        if heard.is_some_and(|next| hung_ns > next) {
            because.push(format!(
                "one of them hung unanswered until {} (its timeout) while later ones passed: the cut lasts as long",
                secs(hung_ns)
            ));
        }
        if target_lost {
            because.push("its target steps went unanswered meanwhile: both its links cut".to_string());
        }
        found.push(Found {
            at_ns: start_ns,
            duration_ms: ms(end_ns - start_ns).max(100),
            runner: Some(runner.clone()),
            variant,
            because,
        });
    }
    // Reports the ledger recorded whose answer never came: a lost response (for as long as
    // the retries of a result went unanswered too).
    for (at, exchange) in on_attempt.iter().enumerate() {
        let Some(entry) = exchange.entry.filter(|_| !exchange.answered()) else { continue };
        let at_ns = exchange.request.time_ns.saturating_sub(50_000_000);
        let retried_ms = retried_until.get(&at).map_or(0, |until| ms(until.saturating_sub(at_ns)) + 50);
        found.push(Found {
            at_ns,
            duration_ms: (ms(lease_ns) / 2).max(100).max(retried_ms),
            runner: Some(runner.clone()),
            variant: Variant::LostResponse,
            because: vec![format!(
                "{runner}'s {} on {} at {} reached the ledger (seq {}) but its answer never came (runner log event {}): a lost response",
                exchange.request.f,
                claim.attempt,
                secs(exchange.request.time_ns),
                seq_of(entry).unwrap_or(0),
                exchange.request.index
            )],
        });
    }
    // Requests that reached the ledger long after they were sent: held in the network.
    let slow: Vec<&&Exchange> =
        on_attempt.iter().filter(|exchange| exchange.transit_ns().is_some_and(|transit| transit > slow_ns)).collect();
    let mut groups: Vec<Vec<&&Exchange>> = Vec::new();
    for exchange in slow {
        match groups.last_mut() {
            Some(group)
                if exchange.request.time_ns
                    <= group.last().map_or(0, |last| last.entry.map_or(0, |e| e.time_ns)) + lease_ns =>
            {
                group.push(exchange)
            }
            _ => groups.push(vec![exchange]),
        }
    }
    for group in groups {
        let mut transits: Vec<u64> = group.iter().filter_map(|exchange| exchange.transit_ns()).collect();
        transits.sort_unstable();
        let latency_ms = (ms(transits[transits.len() / 2]) / 10) * 10;
        let first = group[0];
        let last = group[group.len() - 1];
        let start_ns = first.request.time_ns.saturating_sub(50_000_000);
        let end_ns = last.request.time_ns + 100_000_000;
        let seqs: Vec<String> =
            group.iter().filter_map(|exchange| exchange.entry.and_then(seq_of)).map(|seq| seq.to_string()).collect();
        let late_result = group.iter().any(|exchange| {
            exchange.request.f == Op::Result
                && exchange.entry.is_some_and(|entry| {
                    lease_end_before(records, &claim.attempt, entry)
                        .is_some_and(|end| entry.received_ms.unwrap_or(0) > end)
                })
        });
        let mut because = vec![format!(
            "{runner}'s control requests on {} from {} to {} reached the ledger {} to {} ms after it sent them (ledger seq {}): held in the network, a latency of {latency_ms} ms",
            claim.attempt,
            secs(first.request.time_ns),
            secs(last.request.time_ns),
            ms(transits[0]),
            ms(*transits.last().unwrap_or(&0)),
            seqs.join(", ")
        )];
        if late_result {
            because.push("among them a result that arrived after its lease: a held report".to_string());
        }
        found.push(Found {
            at_ns: start_ns,
            duration_ms: ms(end_ns - start_ns).max(latency_ms + 100),
            runner: Some(runner.clone()),
            variant: Variant::Latency { latency_ms: latency_ms.max(10) },
            because,
        });
    }
    // Steps the target received long after the runner sent them, once a newer fence had been
    // applied on their key: held in the network. The hold cuts the runner's control link
    // too (as `delayed-step` does), so the cuts it overlaps are part of it.
    if let Some(held) = held_step(records, claim, &steps, lease_ns) {
        let (start, mut end) = (held.at_ns, held.at_ns + held.duration_ms * 1_000_000);
        let mut held = held;
        found.retain(|fault| {
            let cut = matches!(fault.variant, Variant::ControlLink | Variant::CutLinks)
                && fault.at_ns <= end
                && start <= fault.at_ns + fault.duration_ms * 1_000_000;
            if cut {
                end = end.max(fault.at_ns + fault.duration_ms * 1_000_000);
                held.because.extend(fault.because.iter().cloned());
            }
            !cut
        });
        held.duration_ms = ms(end - start);
        found.push(held);
    }
    // Silence in the runner's whole log while it held the attempt: a pause, or a kill when
    // it next claims afresh and never speaks of the attempt again.
    let span_end = log
        .iter()
        .filter(|event| event.attempt.as_deref() == Some(claim.attempt.as_str()))
        .map(|event| event.time_ns)
        .max()
        .unwrap_or(claim.at_ns);
    let silent_ns = (lease_ns / 2).max(500_000_000);
    let window: Vec<&&Event> = log.iter().filter(|event| event.time_ns >= claim.at_ns).collect();
    for pair in window.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        if after.time_ns - before.time_ns <= silent_ns || before.time_ns > span_end {
            continue;
        }
        // A request outstanding across the silence that the ledger received late was held
        // in the network, not the runner.
        let held = all.iter().any(|exchange| {
            exchange.request.time_ns <= before.time_ns
                && exchange.end_ns() >= after.time_ns
                && exchange.transit_ns().is_none_or(|transit| transit > slow_ns)
                && exchange.answered()
        });
        let cut = all.iter().any(|exchange| {
            exchange.request.time_ns <= before.time_ns && exchange.end_ns() >= after.time_ns && !exchange.answered()
        });
        // A runner that had sent its result was only waiting to send it again; one cut off
        // was retrying: neither is a stopped runner.
        let reported = on_attempt
            .iter()
            .any(|exchange| exchange.request.f == Op::Result && exchange.request.time_ns <= before.time_ns);
        let in_cut = found.iter().any(|fault| {
            matches!(fault.variant, Variant::ControlLink | Variant::CutLinks | Variant::DelayedStep { .. })
                && fault.at_ns <= after.time_ns
                && before.time_ns <= fault.at_ns + fault.duration_ms * 1_000_000
        });
        if held || cut || reported || in_cut {
            continue;
        }
        let gap_ms = ms(after.time_ns - before.time_ns);
        let abandoned = after.f == Op::Claim && after.time_ns > span_end;
        let (variant, what) = if abandoned {
            (Variant::KillRunner, "then claimed afresh and never spoke of it again: killed, started again")
        } else {
            (Variant::Pause, "then went on with it: stopped (a pause)")
        };
        found.push(Found {
            at_ns: before.time_ns + 20_000_000,
            duration_ms: gap_ms.max(100),
            runner: Some(runner.clone()),
            variant,
            because: vec![format!(
                "{runner}'s log is silent for {gap_ms} ms from {} (runner log events {} and {}) while it held {}, and it {what}",
                secs(before.time_ns),
                before.index,
                after.index,
                claim.attempt
            )],
        });
    }
    found
}

impl Exchange<'_> {
    fn end_ns_index(&self) -> u64 {
        self.answer.map_or(self.request.index, |answer| answer.index)
    }
}

/// The lease the ledger had granted `attempt` before `entry` (server clock, ms).
fn lease_end_before(records: &Records, attempt: &str, entry: &Event) -> Option<i64> {
    let entry_seq = seq_of(entry)?;
    records
        .entries_of(attempt)
        .iter()
        .filter(|before| seq_of(before).is_some_and(|seq| seq < entry_seq))
        .filter(|before| matches!(before.f, Op::Claim | Op::Heartbeat) && before.decision == Some(Decision::Accepted))
        .filter_map(|before| before.lease_expires_ms)
        .max()
}

/// Faults read off the ledger alone for one attempt (its runner's log absent): a gap in its
/// reports over which the attempt expired or was taken over is a cut of its control link;
/// a result received after its lease, with no such gap, a held report.
fn from_ledger(records: &Records, claim: &Claim, lease_ns: u64) -> Vec<Found> {
    let entries = records.entries_of(&claim.attempt);
    let own: Vec<&&Event> = entries
        .iter()
        .filter(|entry| {
            entry.runner.as_deref() == Some(claim.runner.as_str())
                && matches!(entry.f, Op::Claim | Op::Heartbeat | Op::Capability | Op::Result)
        })
        .collect();
    let closing = |from: u64, to: u64| {
        records.ledger.iter().find(|entry| {
            (from..=to).contains(&entry.time_ns)
                && ((entry.f == Op::Expire && entry.attempt.as_deref() == Some(claim.attempt.as_str()))
                    || (entry.f == Op::Claim
                        && entry.job.as_deref() == Some(claim.job.as_str())
                        && entry.attempt.as_deref() != Some(claim.attempt.as_str())))
        })
    };
    let runner = &claim.runner;
    let mut found = Vec::new();
    let mut explained: BTreeSet<u64> = BTreeSet::new();
    for pair in own.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        let gap = after.time_ns - before.time_ns;
        let superseded = closing(before.time_ns, after.time_ns);
        if gap <= lease_ns / 2 && superseded.is_none() {
            continue;
        }
        let Some(superseded) = superseded else { continue };
        explained.insert(after.index);
        found.push(Found {
            at_ns: before.time_ns + 20_000_000,
            duration_ms: ms(gap).max(100),
            runner: Some(runner.clone()),
            variant: Variant::ControlLink,
            because: vec![format!(
                "the ledger holds nothing from {runner} on {} between seq {} at {} and seq {} at {}, while {} (seq {}): its control link cut for {} ms",
                claim.attempt,
                seq_of(before).unwrap_or(0),
                secs(before.time_ns),
                seq_of(after).unwrap_or(0),
                secs(after.time_ns),
                if superseded.f == Op::Expire { "the attempt expired".to_string() } else { format!("{} was claimed", superseded.attempt.as_deref().unwrap_or("another attempt")) },
                seq_of(superseded).unwrap_or(0),
                ms(gap)
            )],
        });
    }
    if let Some(last) = own.last() {
        let expired = closing(last.time_ns, records.end_ns);
        if last.f != Op::Result {
            if let Some(expired) = expired {
                let closed = entries
                    .iter()
                    .find(|entry| entry.f == Op::Reconcile)
                    .map_or(expired.time_ns, |entry| entry.time_ns);
                let until = closed.max(expired.time_ns) + lease_ns;
                found.push(Found {
                    at_ns: last.time_ns + 20_000_000,
                    duration_ms: ms(until - last.time_ns).max(100),
                    runner: Some(runner.clone()),
                    variant: Variant::ControlLink,
                    because: vec![format!(
                        "{runner} was not heard on {} after seq {} at {}, and the attempt was superseded (seq {}): played as a cut of its control link until a lease after it was closed (a kill, a pause or a cut, the ledger cannot tell)",
                        claim.attempt,
                        seq_of(last).unwrap_or(0),
                        secs(last.time_ns),
                        seq_of(expired).unwrap_or(0)
                    )],
                });
            }
        }
    }
    for result in own.iter().filter(|entry| entry.f == Op::Result && !explained.contains(&entry.index)) {
        let Some(end) = lease_end_before(records, &claim.attempt, result) else { continue };
        let Some(received) = result.received_ms else { continue };
        if received <= end {
            continue;
        }
        let before =
            own.iter().rev().find(|entry| entry.time_ns < result.time_ns).map_or(claim.at_ns, |entry| entry.time_ns);
        let held_ms = ms(result.time_ns - before);
        found.push(Found {
            at_ns: before + 20_000_000,
            duration_ms: held_ms + 100,
            runner: Some(runner.clone()),
            variant: Variant::Latency { latency_ms: (held_ms / 10 * 10).max(10) },
            because: vec![format!(
                "{runner}'s result for {} (seq {}) arrived {} ms after its lease ended: a held report, latency on its control link from its report before (when it was sent, the runner's log would tell)",
                claim.attempt,
                seq_of(result).unwrap_or(0),
                received - end
            )],
        });
    }
    found
}

/// Runner clocks the ledger shows off: each runner's reports on the chosen attempts whose
/// `observed_ms` stands well away from `received_ms` (the transit taken off where its log
/// gives it), in runs of about one offset, each a skew for its stretch.
/// The first step of the attempt the target received long after the runner sent it (more
/// than a quarter lease, at least 200 ms) and after a newer fence had been applied on its key:
/// a step held in the network until the key moved on (`delayed-step`); or, with no newer
/// fence, after the attempt's lease had ended: held until the lease was over (`late-step`).
/// The fault is armed before the step is sent (it holds the runner's next step) and holds it
/// as long as the incident did, and a lease more, so that the release waits on the newer
/// fence or the lease's end, as there.
fn held_step(records: &Records, claim: &Claim, steps: &[&Exchange], lease_ns: u64) -> Option<Found> {
    let slow_ns = (lease_ns / 4).max(200_000_000);
    let number = |event: &Event| event.value.as_ref()?.get("step")?.as_u64();
    let highest_before = |event: &Event| event.value.as_ref()?.get("highest_fence_before")?.as_u64();
    for (at, exchange) in steps.iter().enumerate() {
        let request = exchange.request;
        let Some(step) = number(request) else { continue };
        let Some(record) = records.target_steps.iter().copied().find(|record| {
            record.attempt.as_deref() == Some(claim.attempt.as_str())
                && number(record) == Some(step)
                && record.time_ns >= request.time_ns
        }) else {
            continue;
        };
        let hold_ns = record.time_ns - request.time_ns;
        let (Some(fence), Some(highest)) = (record.fence.or(claim.fence), highest_before(record)) else { continue };
        let lease_end = lease_end_ns(records, claim, record.time_ns).filter(|&end| record.time_ns > end);
        if hold_ns <= slow_ns || (highest <= fence && lease_end.is_none()) {
            continue;
        }
        let late = highest <= fence;
        // Armed between the step before it and this one.
        let before = at.checked_sub(1).map_or(claim.at_ns, |before| steps[before].end_ns());
        let at_ns = request.time_ns.saturating_sub(((request.time_ns.saturating_sub(before)) / 2).min(lease_ns / 4));
        let latency_ms = (ms(hold_ns + lease_ns) / 100 + 1) * 100;
        let newer = records
            .target_steps
            .iter()
            .find(|other| {
                other.key == record.key
                    && other.fence.is_some_and(|other| other > fence)
                    && (request.time_ns..record.time_ns).contains(&other.time_ns)
            })
            .map_or(String::new(), |other| {
                format!(
                    " after {} (fence {}) had been applied on it at {}",
                    other.attempt.as_deref().unwrap_or("-"),
                    other.fence.unwrap_or(0),
                    secs(other.time_ns)
                )
            });
        let newer = match (late, lease_end) {
            (true, Some(end)) => format!(" after its lease ended at {}", secs(end)),
            _ => newer,
        };
        return Some(Found {
            at_ns,
            duration_ms: latency_ms + ms(lease_ns),
            runner: Some(claim.runner.clone()),
            variant: if late { Variant::LateStep { latency_ms } } else { Variant::DelayedStep { latency_ms } },
            because: vec![format!(
                "{}'s step {step} of {} (fence {fence}), sent at {} (runner log event {}), reached the target at {} (step log seq {}) on key {}{newer}, {} ms later: held in the network",
                claim.runner,
                claim.attempt,
                secs(request.time_ns),
                request.index,
                secs(record.time_ns),
                seq_of(record).unwrap_or(0),
                record.key.as_deref().unwrap_or("-"),
                ms(hold_ns)
            )],
        });
    }
    None
}

/// When (the records' clock) the last lease the ledger granted `claim`'s attempt at or
/// before `at_ns` ended: its entry's time plus its lease end's distance from its receipt.
fn lease_end_ns(records: &Records, claim: &Claim, at_ns: u64) -> Option<u64> {
    let entry = records
        .ledger
        .iter()
        .rev()
        .filter(|entry| entry.attempt.as_deref() == Some(claim.attempt.as_str()) && entry.time_ns <= at_ns)
        .find(|entry| entry.lease_expires_ms.is_some() && entry.received_ms.is_some())?;
    let ahead_ms = entry.lease_expires_ms? - entry.received_ms?;
    u64::try_from(entry.time_ns as i128 + i128::from(ahead_ms) * 1_000_000).ok()
}

/// Stretches over which the target's clock stood off the control plane's (its step records'
/// `received_ms` against the ledger's, on the records' one clock) by two leases or more, at
/// least 2 s, while the played jobs ran: a target skew of that offset (`target-skew`).
fn target_skews(records: &Records, jobs: &[PlayedJob], lease_ns: u64) -> Vec<Found> {
    let threshold_ms = (2 * ms(lease_ns)).max(2_000) as i64;
    let base = |event: &Event| Some(event.received_ms? - ms(event.time_ns) as i64);
    let mut bases: Vec<i64> = records.ledger.iter().filter_map(|entry| base(entry)).collect();
    if bases.is_empty() {
        return Vec::new();
    }
    bases.sort_unstable();
    let control = bases[bases.len() / 2];
    let span = |at: u64| jobs.iter().any(|job| (job.play_ns.min(job.submit_ns)..=job.end_ns + lease_ns).contains(&at));
    let offsets: Vec<(&Event, i64)> =
        records.target_steps.iter().filter_map(|record| Some((*record, base(record)? - control))).collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < offsets.len() {
        let (first, offset) = offsets[at];
        let same = |other: i64| (other - offset).abs() <= (offset.abs() / 5).max(1_000);
        if offset.abs() < threshold_ms {
            at += 1;
            continue;
        }
        let start = at;
        while at < offsets.len() && same(offsets[at].1) {
            at += 1;
        }
        let last = offsets[at - 1].0;
        let from = start.checked_sub(1).map_or(first.time_ns.saturating_sub(lease_ns / 4), |before| {
            (offsets[before].0.time_ns + first.time_ns) / 2
        });
        let to = offsets.get(at).map_or(last.time_ns + lease_ns / 4, |next| (last.time_ns + next.0.time_ns) / 2);
        if !(span(from) || span(to) || jobs.iter().any(|job| from <= job.play_ns && job.play_ns <= to)) {
            continue;
        }
        let mut values: Vec<i64> = offsets[start..at].iter().map(|(_, offset)| *offset).collect();
        values.sort_unstable();
        let offset_ms = values[values.len() / 2] / 100 * 100;
        found.push(Found {
            at_ns: from,
            duration_ms: ms(to.saturating_sub(from)).max(100),
            runner: None,
            variant: Variant::TargetSkew { offset_ms },
            because: vec![format!(
                "the target's clock stood {offset_ms} ms off the control plane's in its step records seq {} to {} ({} to {}; received_ms against the ledger's): its clock skewed for that stretch",
                seq_of(first).unwrap_or(0),
                seq_of(last).unwrap_or(0),
                secs(first.time_ns),
                secs(last.time_ns)
            )],
        });
    }
    found
}

fn skews(records: &Records, held: &[&Claim], lease_ns: u64) -> Vec<Found> {
    let threshold_ms = (2 * ms(lease_ns)).max(2_000) as i64;
    let mut found = Vec::new();
    let runners: BTreeSet<&str> = held.iter().map(|claim| claim.runner.as_str()).collect();
    for runner in runners {
        let transits: BTreeMap<u64, u64> = records
            .logs
            .get(runner)
            .map(|log| {
                exchanges(records, log, lease_ns)
                    .iter()
                    .filter_map(|exchange| Some((exchange.entry?.index, exchange.transit_ns()?)))
                    .collect()
            })
            .unwrap_or_default();
        let attempts: BTreeSet<&str> =
            held.iter().filter(|claim| claim.runner == runner).map(|claim| claim.attempt.as_str()).collect();
        let offsets: Vec<(&Event, i64)> = records
            .ledger
            .iter()
            .copied()
            .filter(|entry| entry.runner.as_deref() == Some(runner))
            .filter(|entry| {
                entry.attempt.as_deref().is_some_and(|attempt| attempts.contains(attempt)) || entry.f == Op::Claim
            })
            .filter_map(|entry| {
                let transit = transits.get(&entry.index).map_or(0, |ns| ms(*ns) as i64);
                Some((entry, entry.observed_ms? - entry.received_ms? + transit))
            })
            .collect();
        let mut run: Vec<(&Event, i64)> = Vec::new();
        let mut flush = |run: &mut Vec<(&Event, i64)>, next: Option<&Event>, before: Option<&Event>| {
            if run.is_empty() {
                return;
            }
            let mut values: Vec<i64> = run.iter().map(|(_, offset)| *offset).collect();
            values.sort_unstable();
            let offset = values[values.len() / 2] / 100 * 100;
            let first = run[0].0;
            let last = run[run.len() - 1].0;
            let start = before
                .map_or(first.time_ns.saturating_sub(lease_ns / 4), |before| (before.time_ns + first.time_ns) / 2);
            let end = next.map_or(last.time_ns + lease_ns / 4, |next| (last.time_ns + next.time_ns) / 2);
            found.push(Found {
                at_ns: start,
                duration_ms: ms(end.saturating_sub(start)).max(100),
                runner: Some(runner.to_string()),
                variant: Variant::StaticSkew { offset_ms: offset },
                because: vec![format!(
                    "{runner}'s clock stood {offset} ms off the server's in ledger seq {} to {} ({} to {}; observed_ms against received_ms): its clock skewed for that stretch",
                    seq_of(first).unwrap_or(0),
                    seq_of(last).unwrap_or(0),
                    secs(first.time_ns),
                    secs(last.time_ns)
                )],
            });
            run.clear();
        };
        // The entry before the current run.
        let mut before: Option<&Event> = None;
        let mut previous: Option<&Event> = None;
        for (entry, offset) in offsets {
            let skewed = offset.abs() >= threshold_ms;
            let same = run.first().is_none_or(|(_, first)| (offset - first).abs() <= (first.abs() / 5).max(1_000));
            if !(skewed && same) {
                flush(&mut run, Some(entry), before);
                before = previous;
            }
            if skewed {
                run.push((entry, offset));
            }
            previous = Some(entry);
        }
        flush(&mut run, None, before);
    }
    found
}

/// Control-plane restarts the records show while the chosen jobs ran: an answer whose ledger
/// entry the ledger no longer holds (what it acknowledged was lost: it restarted after), or
/// every runner with a log losing the control plane at once.
fn restarts(records: &Records, jobs: &[PlayedJob], lease_ns: u64) -> Vec<Found> {
    let span = |at: u64| jobs.iter().any(|job| (job.submit_ns..=job.end_ns + lease_ns).contains(&at));
    let mut found: Vec<Found> = Vec::new();
    for (runner, log) in &records.logs {
        for answer in log.iter().filter(|event| event.kind == EventType::Response && span(event.time_ns)) {
            let Some(seq) = ledger_seq_of(answer) else { continue };
            let held =
                records.by_seq.get(&seq).is_some_and(|entry| entry.f == answer.f && entry.attempt == answer.attempt);
            if held || records.ledger.is_empty() {
                continue;
            }
            // The restart came after the answer, before the ledger's next entry.
            let next = records
                .ledger
                .iter()
                .find(|entry| entry.time_ns > answer.time_ns)
                .map_or(answer.time_ns, |entry| entry.time_ns);
            let at_ns = answer.time_ns + (next.saturating_sub(answer.time_ns) / 2).min(lease_ns / 2);
            if found.iter().any(|fault| fault.at_ns.abs_diff(at_ns) < lease_ns) {
                continue;
            }
            found.push(Found {
                at_ns,
                duration_ms: 0,
                runner: None,
                variant: Variant::RestartControl,
                because: vec![format!(
                    "{runner} was answered at {} with ledger seq {seq} ({} {}), which the ledger does not hold: what the control plane acknowledged was lost, a restart after it",
                    secs(answer.time_ns),
                    answer.f,
                    answer.attempt.as_deref().unwrap_or("-")
                )],
            });
        }
    }
    // Every runner's requests refused at once (two or more runners, within a tenth of a lease).
    let refused: Vec<(u64, &str)> = records
        .logs
        .iter()
        .flat_map(|(runner, log)| {
            log.iter()
                .filter(|event| event.kind == EventType::Info && event.f != Op::Step && span(event.time_ns))
                .map(move |event| (event.time_ns, runner.as_str()))
        })
        .collect();
    let active = records.logs.len();
    if active >= 2 {
        let mut sorted = refused.clone();
        sorted.sort_unstable();
        for (at, _) in &sorted {
            let within: BTreeSet<&str> = sorted
                .iter()
                .filter(|(other, _)| (*at..=*at + lease_ns / 10).contains(other))
                .map(|(_, runner)| *runner)
                .collect();
            if within.len() == active && !found.iter().any(|fault| fault.at_ns.abs_diff(*at) < 2 * lease_ns) {
                let runners: Vec<&str> = within.into_iter().collect();
                found.push(Found {
                    at_ns: at.saturating_sub(20_000_000),
                    duration_ms: 0,
                    runner: None,
                    variant: Variant::RestartControl,
                    because: vec![format!(
                        "every runner ({}) lost the control plane at {}: a control-plane restart",
                        runners.join(", "),
                        secs(*at)
                    )],
                });
            }
        }
    }
    found
}

/// The ledger entries some runner's log sent (matched to its requests).
fn sent_entries(records: &Records, lease_ns: u64) -> BTreeSet<u64> {
    let logs = records.logs.values();
    let all = logs.flat_map(|log| exchanges(records, log, lease_ns));
    all.filter_map(|exchange| exchange.entry.map(|entry| entry.index)).collect()
}

/// Reports the ledger holds for this attempt under a runner whose log never sent them
/// (`sent`: the entries the logs did send). A runner without a log says nothing either way.
fn forged_reports<'a>(records: &Records<'a>, claim: &Claim, sent: &BTreeSet<u64>) -> Vec<Forged<'a>> {
    let job_entries = records.job_entries(&claim.job);
    records
        .ledger
        .iter()
        .copied()
        .filter(|entry| {
            entry.attempt.as_deref() == Some(claim.attempt.as_str())
                && matches!(entry.f, Op::Heartbeat | Op::Capability | Op::Result)
                && entry.runner.as_deref().is_some_and(|runner| records.logs.contains_key(runner))
                && !sent.contains(&entry.index)
        })
        .map(|entry| {
            let on_job = records.job_entries(entry.job.as_deref().unwrap_or(&claim.job));
            let entries = if entry.job.as_deref() == Some(claim.job.as_str()) { &job_entries } else { &on_job };
            let after = entries.iter().rev().copied().find(|before| {
                seq_of(before) < seq_of(entry) && before.f != Op::Heartbeat && before.f != Op::Capability
            });
            Forged { entry, after }
        })
        .collect()
}

/// A runner that held no played attempt and sent a played report on another runner's later
/// attempt is paused from before that attempt's claim until after the report: in the incident
/// it was busy elsewhere, and free in the scenario it could claim the attempt itself (which
/// runner claims a later attempt, the scenario does not arrange), and the report it borrowed
/// would be its own.
fn kept_from_claiming(records: &Records, forged: &[Forged], reporters: &[String], lease_ns: u64) -> Vec<Found> {
    let mut found = Vec::new();
    for report in forged {
        let Some(runner) = report.entry.runner.as_ref().filter(|runner| reporters.contains(runner)) else { continue };
        let Some(claim) = report.entry.attempt.as_deref().and_then(|attempt| records.claim(attempt)) else { continue };
        if claim.number < 2 || &claim.runner == runner {
            continue;
        }
        let first_ns = records
            .claims
            .iter()
            .find(|first| first.job == claim.job && first.number == 1)
            .map_or(claim.at_ns, |first| first.at_ns);
        let from_ns = (first_ns + lease_ns / 2).max(claim.at_ns.saturating_sub(2 * lease_ns));
        let until_ns = report.entry.time_ns + 2 * lease_ns;
        if until_ns <= from_ns {
            continue;
        }
        found.push(Found {
            at_ns: from_ns,
            duration_ms: ms(until_ns - from_ns),
            runner: Some(runner.clone()),
            variant: Variant::Pause,
            because: vec![format!(
                "ledger seq {}: a {} for {} (held by {}) under {runner}, who held no attempt played here: {runner} is stopped from before {}'s claim (ledger seq {}) until after it, so that whichever runner claims {} is not {runner}",
                seq_of(report.entry).map_or("-".to_string(), |seq| seq.to_string()),
                report.entry.f,
                claim.attempt,
                claim.runner,
                claim.attempt,
                claim.seq.map_or("-".to_string(), |seq| seq.to_string()),
                claim.attempt,
            )],
        });
    }
    found
}

/// Faults found twice (an attempt after another on one runner, a skew seen from both) are
/// kept once: the same variant on the same runner overlapping in time becomes one window.
/// A target skew a held step landed in lasts as long as the step is held: the step reached
/// the target while its clock was off, and the scenario's release (a newer fence on the key)
/// may come later than the incident's.
fn cover_held_steps(found: &mut [Found]) {
    let end = |fault: &Found| fault.at_ns + fault.duration_ms * 1_000_000;
    let holds: Vec<(u64, u64)> = found
        .iter()
        .filter(|fault| matches!(fault.variant, Variant::DelayedStep { .. }))
        .map(|fault| (fault.at_ns, end(fault)))
        .collect();
    for skew in found.iter_mut().filter(|fault| matches!(fault.variant, Variant::TargetSkew { .. })) {
        for (start, until) in &holds {
            if *start <= end(skew) && skew.at_ns <= *until && *until > end(skew) {
                skew.duration_ms = ms(until - skew.at_ns);
                let why = "kept as long as the step held meanwhile is out: it landed while the clock was off";
                if !skew.because.iter().any(|because| because == why) {
                    skew.because.push(why.into());
                }
            }
        }
    }
}

fn merge_overlaps(found: &mut Vec<Found>) {
    found.sort_by_key(|fault| fault.at_ns);
    let mut merged: Vec<Found> = Vec::new();
    for fault in found.drain(..) {
        let same = merged.iter_mut().rev().find(|kept| {
            kept.runner == fault.runner
                && match (&kept.variant, &fault.variant) {
                    // Two offsets are two skews.
                    (Variant::StaticSkew { .. } | Variant::TargetSkew { .. }, _) => kept.variant == fault.variant,
                    (kept, fault) => std::mem::discriminant(kept) == std::mem::discriminant(fault),
                }
                && fault.at_ns <= kept.at_ns + kept.duration_ms * 1_000_000
        });
        match same {
            Some(kept) => {
                let end = (kept.at_ns + kept.duration_ms * 1_000_000).max(fault.at_ns + fault.duration_ms * 1_000_000);
                kept.duration_ms = ms(end - kept.at_ns);
                for because in fault.because {
                    if !kept.because.contains(&because) {
                        kept.because.push(because);
                    }
                }
            }
            None => merged.push(fault),
        }
    }
    for fault in &mut merged {
        fault.duration_ms = fault.duration_ms.min(workloads::scenario::FAULT_DURATION_MAX_MS);
    }
    *found = merged;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scenario `fencelab import` writes from these ledger lines (lease 1000 ms, no
    /// runner log), read back.
    fn imported(ledger: &str) -> (Scenario, String) {
        imported_with(ledger, &[])
    }

    /// As [`imported`], with these runners' logs.
    fn imported_with(ledger: &str, runner_logs: &[PathBuf]) -> (Scenario, String) {
        imported_from(ledger, runner_logs, None)
    }

    /// As [`imported_with`], with the target's step log when given.
    fn imported_from(ledger: &str, runner_logs: &[PathBuf], steps: Option<&str>) -> (Scenario, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        std::fs::write(&path, ledger).unwrap();
        let steps = steps.map(|steps| {
            let path = dir.path().join("steps.jsonl");
            std::fs::write(&path, steps).unwrap();
            path
        });
        let evidence = dir.path().join("evidence");
        let inputs = verdict::evidence::Inputs {
            ledger: Some(path),
            steps,
            runner_logs: runner_logs.to_vec(),
            lease_ms: Some(1_000),
            out: evidence.clone(),
            ..verdict::evidence::Inputs::default()
        };
        verdict::evidence::assemble(&inputs).unwrap();
        let out = dir.path().join("incident.toml");
        import(&Options { folder: evidence, out: out.clone(), jobs: Vec::new() }).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let scenario = workloads::scenario::parse(&text, &crate::scenario::checker_names())
            .unwrap_or_else(|error| panic!("{error}\n{text}"));
        (scenario, text)
    }

    /// Each step's `at_ms`, by what it does: `submit JOB` or `fault HOW RUNNER`.
    fn times(scenario: &Scenario) -> BTreeMap<String, u64> {
        let mut times = BTreeMap::new();
        for step in &scenario.steps {
            let what = match &step.action {
                Action::Submit { job, .. } => format!("submit {job}"),
                Action::Fault { how, runner, .. } => format!("fault {how} {}", runner.as_deref().unwrap_or("-")),
                _ => continue,
            };
            times.entry(what).or_insert(step.at_ms.unwrap_or(0));
        }
        times
    }

    /// Two jobs on keys of their own, each claimed long after its submit (the runners were
    /// busy with jobs not in the records), each cut off after its claim until its attempt
    /// expired, its result then accepted anyway.
    const QUEUED: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k1","received_ms":1000,"mono_ns":10}
{"seq":2,"kind":"submit","project":"p","job":"j2","deployment_key":"k2","received_ms":1100,"mono_ns":100000000}
{"seq":3,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k1","decision":"accepted","received_ms":2500,"mono_ns":1500000000,"lease_expires_ms":3500}
{"seq":4,"kind":"claim","project":"p","job":"j2","attempt":"j2-a1","runner":"r2","fence":2,"deployment_key":"k2","decision":"accepted","received_ms":3100,"mono_ns":2100000000,"lease_expires_ms":4100}
{"seq":5,"kind":"expire","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k1","recorded_as":"uncertain","received_ms":3600,"mono_ns":2600000000}
{"seq":6,"kind":"expire","project":"p","job":"j2","attempt":"j2-a1","runner":"r2","fence":2,"deployment_key":"k2","recorded_as":"uncertain","received_ms":4200,"mono_ns":3200000000}
{"seq":7,"kind":"result","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k1","decision":"accepted","outcome":"succeeded","received_ms":5000,"mono_ns":4000000000}
{"seq":8,"kind":"result","project":"p","job":"j2","attempt":"j2-a1","runner":"r2","fence":2,"deployment_key":"k2","decision":"accepted","outcome":"succeeded","received_ms":5600,"mono_ns":4600000000}
"#;

    /// A job that waited in the queue is submitted at its claim, so that the faults after the
    /// claim keep their distance to it (a heartbeat-revives-expired incident, seed 1, had its
    /// job claimed 1.7 s after its submit: the held heartbeats were played on an attempt long
    /// finished, 0 of 10 runs reproduced).
    #[test]
    fn a_job_that_waited_in_the_queue_is_submitted_at_its_claim() {
        let (scenario, text) = imported(QUEUED);
        let times = times(&scenario);
        let (submit, cut) = (times["submit j1"], times["fault control-link r1"]);
        // The cut began 20 ms after the claim; the submit is placed the pin's lead before it.
        assert_eq!(cut - submit, 20 + PIN_LEAD_MS, "{times:?}\n{text}");
        assert!(text.contains("waited 1.500 s in the queue"), "{text}");
    }

    /// Two pinned jobs are claimed as far apart as in the incident: a pinned submit is placed
    /// its lead before its claim, and shifts nothing after it (a 300-ms shift after each pinned
    /// submit let an ack-before-commit incident's `j2` be claimed by the runner that had just
    /// finished `j1`, not by its own: 8 of 10 runs on the correct lab failed).
    #[test]
    fn pinned_jobs_are_claimed_as_far_apart_as_in_the_incident() {
        let (scenario, text) = imported(QUEUED);
        let times = times(&scenario);
        assert_eq!(times["submit j2"] - times["submit j1"], 600, "claims 600 ms apart: {times:?}\n{text}");
        assert_eq!(times["submit j1"], START_MS - PIN_LEAD_MS, "the first claim at the start: {times:?}");
        let cut = times["fault control-link r2"];
        assert_eq!(cut - times["submit j2"], 20 + PIN_LEAD_MS, "{times:?}\n{text}");
    }

    /// A ledger whose second attempt (r2's, after r1's expired and was reconciled) committed
    /// its result, and then refused an identical retry that r2's log never sent.
    const RETRY_REFUSED: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k","received_ms":1000,"mono_ns":10000000}
{"seq":2,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1100,"mono_ns":100000000,"lease_expires_ms":2100}
{"seq":3,"kind":"expire","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","recorded_as":"uncertain","received_ms":2200,"mono_ns":1200000000,"lease_expires_ms":2100}
{"seq":4,"kind":"reconcile","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","reason":"execution stopped","outcome":"stopped","received_ms":3300,"mono_ns":2300000000,"lease_expires_ms":2100}
{"seq":5,"kind":"claim","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3400,"mono_ns":2400000000,"lease_expires_ms":4400}
{"seq":6,"kind":"result","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","outcome":"succeeded","received_ms":3900,"observed_ms":3899,"mono_ns":2900000000}
{"seq":7,"kind":"result","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"rejected","reason":"not_current","outcome":"succeeded","received_ms":4100,"observed_ms":4099,"mono_ns":3100000000}
"#;

    /// r2's log: its claim of `j1-a2` and its result, each answered.
    const RETRY_REFUSED_R2: &str = r#"{"f":"claim","process":"runner:r2","runner":"r2","time_ns":2390000000,"type":"request","observed_ms":3390}
{"attempt":"j1-a2","decision":"accepted","f":"claim","fence":2,"job":"j1","key":"k","process":"runner:r2","runner":"r2","time_ns":2410000000,"type":"response","value":{"ledger_seq":5}}
{"attempt":"j1-a2","f":"result","fence":2,"job":"j1","outcome":"succeeded","process":"runner:r2","runner":"r2","time_ns":2890000000,"type":"request","observed_ms":3899}
{"attempt":"j1-a2","decision":"accepted","f":"result","fence":2,"job":"j1","outcome":"succeeded","process":"runner:r2","runner":"r2","time_ns":2910000000,"type":"response","value":{"ledger_seq":6}}
"#;

    /// The wait before a played report names the runner of the entry it waits for only where
    /// the scenario pins that runner, and never the entry's decision (a job's first attempt): a later attempt goes to
    /// whichever runner is free (a refuse-duplicate-result incident's wait named r1 for `j47`'s
    /// second attempt, which r2 or r3 claimed: 6 of 10 runs on the correct lab failed).
    #[test]
    fn a_wait_names_no_runner_for_an_attempt_the_scenario_does_not_pin() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r2.jsonl");
        std::fs::write(&log, RETRY_REFUSED_R2).unwrap();
        let (scenario, text) = imported_with(RETRY_REFUSED, &[log]);
        let waits: Vec<&Condition> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Wait(condition) => Some(condition.as_ref()),
                _ => None,
            })
            .collect();
        assert_eq!(waits.len(), 1, "one wait, before the played retry:\n{text}");
        assert_eq!((waits[0].attempt, waits[0].runner.as_deref()), (Some(2), None), "{text}");
        // The entry waited for by its kind, not by the ruling the incident's system gave it.
        assert_eq!((waits[0].ledger, waits[0].decision), (Some(Op::Result), None), "{text}");
        let played = scenario.steps.iter().any(|step| {
            matches!(&step.action, Action::Report { as_runner, attempt: 2, outcome, .. } if as_runner == "r2" && outcome == "succeeded")
        });
        assert!(played, "the retry is played as r2:\n{text}");
    }

    /// A ledger where r2, holding nothing of `j1`, sent a heartbeat, a capability and a result
    /// on r3's `j1-a2` under its own name (a borrowed claim), all accepted.
    const BORROWED: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k","received_ms":1000,"mono_ns":10000000}
{"seq":2,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1100,"mono_ns":100000000,"lease_expires_ms":2100}
{"seq":3,"kind":"expire","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","recorded_as":"uncertain","received_ms":2200,"mono_ns":1200000000,"lease_expires_ms":2100}
{"seq":4,"kind":"reconcile","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","reason":"execution stopped","outcome":"stopped","received_ms":3300,"mono_ns":2300000000,"lease_expires_ms":2100}
{"seq":5,"kind":"claim","project":"p","job":"j1","attempt":"j1-a2","runner":"r3","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3400,"mono_ns":2400000000,"lease_expires_ms":4400}
{"seq":6,"kind":"heartbeat","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3600,"observed_ms":3600,"mono_ns":2600000000,"lease_expires_ms":4600}
{"seq":7,"kind":"capability","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3601,"observed_ms":3601,"mono_ns":2601000000,"lease_expires_ms":4600}
{"seq":8,"kind":"result","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","outcome":"failed","received_ms":3602,"observed_ms":3602,"mono_ns":2602000000}
"#;

    /// r2's log: a claim that found no job.
    const BORROWED_R2: &str = r#"{"f":"claim","process":"runner:r2","runner":"r2","time_ns":2000000000,"type":"request","observed_ms":3000}
{"f":"claim","process":"runner:r2","runner":"r2","time_ns":2010000000,"type":"response","value":{}}
"#;

    /// Reports under a runner that held no played attempt, on another runner's later attempt
    /// (an accept-borrowed-claim incident, seed 1: 0 of 10 runs reproduced, none played as r2
    /// held nothing; played at their incident times they came after the attempt had ended):
    /// played as that runner, right after the attempt's claim, the capability left out (a
    /// refused one fails the scenario where the bug is fixed), the runner paused over the
    /// claim so that it does not claim the attempt itself.
    #[test]
    fn a_borrowed_claim_is_played_as_its_runner_right_after_the_claim() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r2.jsonl");
        std::fs::write(&log, BORROWED_R2).unwrap();
        let (scenario, text) = imported_with(BORROWED, &[log]);
        let played: Vec<(String, Option<u64>)> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Heartbeat { as_runner, .. } => Some((format!("heartbeat {as_runner}"), step.at_ms)),
                Action::Capability { as_runner, .. } => Some((format!("capability {as_runner}"), step.at_ms)),
                Action::Report { as_runner, .. } => Some((format!("result {as_runner}"), step.at_ms)),
                _ => None,
            })
            .collect();
        assert_eq!(
            played,
            [("heartbeat r2".to_string(), None), ("result r2".to_string(), None)],
            "played as r2, at once after their wait:\n{text}"
        );
        let waits = scenario.steps.iter().filter(|step| {
            matches!(&step.action, Action::Wait(condition) if condition.ledger == Some(Op::Claim) && condition.attempt == Some(2) && condition.runner.is_none())
        });
        assert_eq!(waits.count(), 2, "each waits for j1-a2's claim:\n{text}");
        let times = times(&scenario);
        let pause = scenario.steps.iter().find_map(|step| match &step.action {
            Action::Fault { how, runner: Some(runner), duration_ms, .. } if how == "pause" && runner == "r2" => {
                Some((step.at_ms.unwrap_or(0), *duration_ms))
            }
            _ => None,
        });
        let (from_ms, duration_ms) = pause.unwrap_or_else(|| panic!("r2 paused:\n{text}"));
        // j1-a2's claim came 2.3 s after j1-a1's, at 1000 + 2300 ms on the scenario's clock.
        let claim_ms = times["submit j1"] + PIN_LEAD_MS + 2_300;
        assert!(from_ms < claim_ms && from_ms + duration_ms > claim_ms + 1_000, "{from_ms} +{duration_ms}:\n{text}");
        assert!(scenario.runners >= 3, "{text}");
    }

    /// A borrowed capability on a first attempt (the runner pinned) is not played either: an
    /// accept-borrowed-claim incident (seed 1, all faults, release build) had r2 borrow r3's
    /// `j51-a1`; its played capability was refused on the correct lab, 0 of 10 runs valid.
    #[test]
    fn a_borrowed_capability_on_a_first_attempt_is_not_played() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r2.jsonl");
        std::fs::write(&log, BORROWED_R2).unwrap();
        let first =
            BORROWED.replace("\"attempt\":\"j1-a2\",\"runner\":\"r2\"", "\"attempt\":\"j1-a1\",\"runner\":\"r2\"");
        let (scenario, text) = imported_with(&first, &[log]);
        let played: Vec<&str> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Heartbeat { as_runner, attempt: 1, .. } if as_runner == "r2" => Some("heartbeat"),
                Action::Capability { .. } => Some("capability"),
                Action::Report { as_runner, attempt: 1, .. } if as_runner == "r2" => Some("result"),
                _ => None,
            })
            .collect();
        assert_eq!(played, ["heartbeat", "result"], "{text}");
    }

    /// A ledger where r1's result was committed (seq 3) and an identical retry was answered
    /// `duplicate` with no entry of its own.
    const DUPLICATE_ACK: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k","received_ms":1000,"mono_ns":10000000}
{"seq":2,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1100,"mono_ns":100000000,"lease_expires_ms":2100}
{"seq":3,"kind":"result","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","outcome":"succeeded","received_ms":1600,"observed_ms":1600,"mono_ns":600000000}
"#;

    /// r1's log: its claim, its result unanswered (the answer lost), sent again unanswered, and
    /// again, answered `duplicate`, naming the committed result's entry.
    const DUPLICATE_ACK_R1: &str = r#"{"f":"claim","process":"runner:r1","runner":"r1","time_ns":90000000,"type":"request","observed_ms":1090}
{"attempt":"j1-a1","decision":"accepted","f":"claim","fence":1,"job":"j1","key":"k","process":"runner:r1","runner":"r1","time_ns":110000000,"type":"response","value":{"ledger_seq":2}}
{"attempt":"j1-a1","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":590000000,"type":"request","observed_ms":1590}
{"attempt":"j1-a1","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":601000000,"type":"info","reason":"connection closed before message completed"}
{"attempt":"j1-a1","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":1290000000,"type":"request","observed_ms":2290}
{"attempt":"j1-a1","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":1291000000,"type":"info","reason":"connection closed before message completed"}
{"attempt":"j1-a1","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":1600000000,"type":"request","observed_ms":2600}
{"attempt":"j1-a1","decision":"duplicate","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":1610000000,"type":"response","value":{"ledger_seq":3}}
"#;

    /// An answer naming an entry received before its request was sent is not that request's
    /// entry: the entry recorded the earlier request, whose answer was lost (a
    /// duplicate-ack-unrecorded incident, seed 1, duplicate-results: the retry's `duplicate`
    /// answer named the committed result, the first result matched no entry and was played as
    /// a cut, 0 of 10 runs reproduced).
    #[test]
    fn a_duplicate_answered_with_the_committed_entry_is_a_lost_response() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r1.jsonl");
        std::fs::write(&log, DUPLICATE_ACK_R1).unwrap();
        let (scenario, text) = imported_with(DUPLICATE_ACK, &[log]);
        let faults: Vec<(String, u64)> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Fault { how, duration_ms, .. } => Some((how.clone(), *duration_ms)),
                _ => None,
            })
            .collect();
        assert_eq!(faults.len(), 1, "one fault, no cut:\n{text}");
        // From 50 ms before the result to past its unanswered retry's end (1.291 s).
        assert_eq!(faults[0].0, "lost-response", "{text}");
        assert!(faults[0].1 >= 1_291 - 540, "the retries' answers lost too:\n{text}");
    }

    /// A ledger where r1's heartbeat renewed j1-a1 to 1.35 s (mono), its capability was
    /// answered, and its result was accepted at 2.65 s, after the lease.
    const HUNG_HEARTBEAT: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k","received_ms":1000,"mono_ns":10000000}
{"seq":2,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1100,"mono_ns":100000000,"lease_expires_ms":2100}
{"seq":3,"kind":"heartbeat","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1350,"observed_ms":1350,"mono_ns":350000000,"lease_expires_ms":2350}
{"seq":4,"kind":"capability","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1808,"observed_ms":1808,"mono_ns":808000000,"lease_expires_ms":2350}
{"seq":5,"kind":"result","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","outcome":"succeeded","received_ms":3650,"observed_ms":3650,"mono_ns":2650000000}
"#;

    /// r1's log: its heartbeat at 0.6 s hangs until its timeout at 2.6 s, while its capability
    /// at 0.807 s is answered; its result at 2.649 s is answered.
    const HUNG_HEARTBEAT_R1: &str = r#"{"f":"claim","process":"runner:r1","runner":"r1","time_ns":90000000,"type":"request","observed_ms":1090}
{"attempt":"j1-a1","decision":"accepted","f":"claim","fence":1,"job":"j1","key":"k","process":"runner:r1","runner":"r1","time_ns":110000000,"type":"response","value":{"ledger_seq":2}}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":349000000,"type":"request","observed_ms":1349}
{"attempt":"j1-a1","decision":"accepted","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":351000000,"type":"response","value":{"ledger_seq":3}}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":600000000,"type":"request","observed_ms":1600}
{"attempt":"j1-a1","f":"capability","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":807000000,"type":"request","observed_ms":1807}
{"attempt":"j1-a1","decision":"accepted","f":"capability","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":809000000,"type":"response","value":{"ledger_seq":4}}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":2600000000,"type":"info","reason":"operation timed out"}
{"attempt":"j1-a1","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":2649000000,"type":"request","observed_ms":3649}
{"attempt":"j1-a1","decision":"accepted","f":"result","fence":1,"job":"j1","outcome":"succeeded","process":"runner:r1","runner":"r1","time_ns":2651000000,"type":"response","value":{"ledger_seq":5}}
"#;

    /// A heartbeat that hung until its timeout while the runner's later requests were answered
    /// cut the runner off for as long as it hung (a lease-judged-by-sweeper incident, seed 1:
    /// a heartbeat hung 2 s, the import read a cut until the next request, 207 ms, and the
    /// scenario's heartbeats renewed the lease: 0 of 10 runs reproduced).
    #[test]
    fn a_hung_heartbeat_cuts_the_runner_off_for_as_long_as_it_hung() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r1.jsonl");
        std::fs::write(&log, HUNG_HEARTBEAT_R1).unwrap();
        let (scenario, text) = imported_with(HUNG_HEARTBEAT, &[log]);
        let cut = scenario.steps.iter().find_map(|step| match &step.action {
            Action::Fault { how, duration_ms, .. } if how == "control-link" => Some(*duration_ms),
            _ => None,
        });
        // From the heartbeat before it (0.351 s) to the hung one's timeout (2.6 s).
        assert_eq!(cut, Some(2_600 - 351), "{text}");
    }

    /// j1-a1 (r1, fence 1) is cut off while its step 1 is in flight; it expires, is
    /// reconciled, and j1-a2 (r2, fence 2) applies step 0 on key k; then r1's step 1 reaches
    /// the target, which applies it: a stale step. The target's clock stood 120 s behind from
    /// 2.0 s to 3.0 s. The control plane's clock reads 1000 ms at mono 0.
    const HELD_STEP: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k","received_ms":1010,"mono_ns":10000000}
{"seq":2,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1100,"mono_ns":100000000,"lease_expires_ms":2100}
{"seq":3,"kind":"capability","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1110,"observed_ms":1110,"mono_ns":110000000,"lease_expires_ms":2100}
{"seq":4,"kind":"capability","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","decision":"accepted","received_ms":1350,"observed_ms":1350,"mono_ns":350000000,"lease_expires_ms":2100}
{"seq":5,"kind":"expire","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","recorded_as":"uncertain","received_ms":2200,"mono_ns":1200000000,"lease_expires_ms":2100}
{"seq":6,"kind":"reconcile","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k","reason":"execution stopped","outcome":"stopped","received_ms":3300,"mono_ns":2300000000,"lease_expires_ms":2100}
{"seq":7,"kind":"claim","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3400,"mono_ns":2400000000,"lease_expires_ms":4400}
{"seq":8,"kind":"capability","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3410,"observed_ms":3410,"mono_ns":2410000000,"lease_expires_ms":4400}
{"seq":9,"kind":"capability","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","received_ms":3650,"observed_ms":3650,"mono_ns":2650000000,"lease_expires_ms":4400}
{"seq":10,"kind":"result","project":"p","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"deployment_key":"k","decision":"accepted","outcome":"succeeded","received_ms":4000,"observed_ms":4000,"mono_ns":3000000000}
"#;

    /// r1's log: step 0 answered; step 1 sent at 0.352 s and never answered; its heartbeats
    /// from 0.6 s refused (its link cut).
    const HELD_STEP_R1: &str = r#"{"f":"claim","process":"runner:r1","runner":"r1","time_ns":90000000,"type":"request","observed_ms":1090}
{"attempt":"j1-a1","decision":"accepted","f":"claim","fence":1,"job":"j1","key":"k","process":"runner:r1","runner":"r1","time_ns":101000000,"type":"response","value":{"ledger_seq":2}}
{"attempt":"j1-a1","f":"capability","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":109000000,"type":"request","observed_ms":1109}
{"attempt":"j1-a1","decision":"accepted","f":"capability","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":111000000,"type":"response","value":{"ledger_seq":3}}
{"attempt":"j1-a1","f":"step","fence":1,"job":"j1","key":"k","process":"runner:r1","runner":"r1","time_ns":112000000,"type":"request","value":{"step":0,"steps":2}}
{"attempt":"j1-a1","decision":"accepted","f":"step","fence":1,"job":"j1","key":"k","process":"runner:r1","runner":"r1","time_ns":120000000,"type":"response","value":{"step":0,"steps":2}}
{"attempt":"j1-a1","f":"capability","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":349000000,"type":"request","observed_ms":1349}
{"attempt":"j1-a1","decision":"accepted","f":"capability","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":351000000,"type":"response","value":{"ledger_seq":4}}
{"attempt":"j1-a1","f":"step","fence":1,"job":"j1","key":"k","process":"runner:r1","runner":"r1","time_ns":352000000,"type":"request","value":{"step":1,"steps":2}}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":600000000,"type":"request","observed_ms":1600}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":601000000,"type":"info","reason":"connection refused"}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":850000000,"type":"request","observed_ms":1850}
{"attempt":"j1-a1","f":"heartbeat","fence":1,"job":"j1","process":"runner:r1","runner":"r1","time_ns":851000000,"type":"info","reason":"connection refused"}
"#;

    /// The target's step log: its clock reads 1000 ms at mono 0, and 120 s less from 2.0 s
    /// to 3.0 s; r1's step 1 lands at 2.6 s, after j1-a2's fence 2, and is applied.
    const HELD_STEP_TARGET: &str = r#"{"seq":1,"deployment_key":"k","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"step":0,"steps":2,"applied":true,"revision":1,"highest_fence_before":0,"received_ms":1115,"mono_ns":115000000}
{"seq":2,"deployment_key":"k","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"step":0,"steps":2,"applied":true,"revision":2,"highest_fence_before":1,"received_ms":-116585,"mono_ns":2415000000}
{"seq":3,"deployment_key":"k","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"step":1,"steps":2,"applied":true,"revision":3,"highest_fence_before":2,"received_ms":-116400,"mono_ns":2600000000}
{"seq":4,"deployment_key":"k","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"step":1,"steps":2,"applied":true,"revision":4,"highest_fence_before":2,"received_ms":-116345,"mono_ns":2655000000}
{"seq":5,"deployment_key":"k","job":"j0","attempt":"j0-a1","runner":"r2","fence":3,"step":0,"steps":1,"applied":true,"revision":1,"highest_fence_before":0,"received_ms":4300,"mono_ns":3300000000}
"#;

    /// A step the target received after a newer fence on its key, long after its runner sent
    /// it, is a held step (`delayed-step`, armed before the step is sent and covering the
    /// runner's cut), and the target's clock the step log shows behind is a target skew (a
    /// target-ignores-fence incident, seed 1: the import played neither, 0 of 10 runs
    /// reproduced).
    #[test]
    fn a_step_that_reached_the_target_after_a_newer_fence_is_held_and_its_clock_skewed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r1.jsonl");
        std::fs::write(&log, HELD_STEP_R1).unwrap();
        let (scenario, text) = imported_from(HELD_STEP, &[log], Some(HELD_STEP_TARGET));
        // how, runner, duration, latency, offset
        type Played = (String, Option<String>, u64, Option<u64>, Option<i64>);
        let faults: Vec<Played> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Fault { how, runner, duration_ms, latency_ms, offset_ms, .. } => {
                    Some((how.clone(), runner.clone(), *duration_ms, *latency_ms, *offset_ms))
                }
                _ => None,
            })
            .collect();
        let held = faults.iter().find(|fault| fault.0 == "delayed-step").unwrap_or_else(|| panic!("{text}"));
        assert_eq!(held.1.as_deref(), Some("r1"), "{text}");
        // Held 2.248 s in the incident, and a lease more before the bound.
        assert!(held.3.is_some_and(|latency| latency >= 3_248), "{text}");
        assert!(
            !faults.iter().any(|fault| fault.0 == "control-link" || fault.0 == "cut-links"),
            "the hold is the cut:\n{text}"
        );
        let times = times(&scenario);
        assert!(
            times["fault delayed-step r1"] < times["submit j1"] + 352 - 100 + PIN_LEAD_MS,
            "armed before step 1:\n{text}"
        );
        let skew = faults.iter().find(|fault| fault.0 == "target-skew").unwrap_or_else(|| panic!("{text}"));
        assert_eq!(skew.4, Some(-120_000), "{text}");
        let ends = |how: &str| {
            times[&format!("fault {how}")]
                + faults.iter().find(|fault| fault.0 == how.split(' ').next().unwrap()).unwrap().2
        };
        assert!(ends("target-skew -") >= ends("delayed-step r1"), "the skew outlasts the hold:\n{text}");
        assert!(text.contains("step log seq 3"), "{text}");
    }

    /// The same step landing after j1-a1's lease ended (1.09 s on the records' clock) with no
    /// newer fence on its key before it, the target's clock true.
    const LATE_STEP_TARGET: &str = r#"{"seq":1,"deployment_key":"k","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"step":0,"steps":2,"applied":true,"revision":1,"highest_fence_before":0,"received_ms":1115,"mono_ns":115000000}
{"seq":2,"deployment_key":"k","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"step":1,"steps":2,"applied":true,"revision":2,"highest_fence_before":1,"received_ms":2130,"mono_ns":1130000000}
{"seq":3,"deployment_key":"k","job":"j1","attempt":"j1-a2","runner":"r2","fence":2,"step":0,"steps":2,"applied":true,"revision":3,"highest_fence_before":1,"received_ms":3415,"mono_ns":2415000000}
"#;

    /// A step the target received long after its runner sent it and after its attempt's
    /// lease ended, with no newer fence on its key, is a late step (`late-step`, armed before
    /// the step is sent): a target-expiry-in-whole-seconds incident (seed 1, all faults)
    /// imported only the runner's control-link cut, its step landed on time, 0 of 10 runs
    /// reproduced.
    #[test]
    fn a_step_that_reached_the_target_after_its_lease_ended_is_a_late_step() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner-r1.jsonl");
        std::fs::write(&log, HELD_STEP_R1).unwrap();
        let (scenario, text) = imported_from(HELD_STEP, &[log], Some(LATE_STEP_TARGET));
        let held: Vec<(&str, Option<&str>)> = scenario
            .steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Fault { how, runner, .. } if how.ends_with("-step") => Some((how.as_str(), runner.as_deref())),
                _ => None,
            })
            .collect();
        assert_eq!(held, [("late-step", Some("r1"))], "{text}");
        assert!(text.contains("after its lease ended at 1.090 s"), "{text}");
        let times = times(&scenario);
        assert!(
            times["fault late-step r1"] < times["submit j1"] + 352 - 100 + PIN_LEAD_MS,
            "armed before step 1:\n{text}"
        );
    }
}
