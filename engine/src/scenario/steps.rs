//! Executing a scenario's steps against a running cluster: faults through the proxies and
//! signals, operator calls, and reports played as a runner with its token. Each step is
//! recorded in the history as `scenario` events.

use history::{Op, Process};
use std::collections::BTreeMap;
use std::time::Duration;

use history::EventType;
use protocol::client::Client;
use protocol::*;
use proxy::{Stream, Toxic, ToxicKind};

use super::conditions::{evaluate, View};
use super::format::{fault_of, runner_index, Action, Condition, Link, Step};
use crate::run::cluster::{target_link, Cluster};
use crate::run::Shared;

const TOXIC_NAME: &str = "scenario";
const REQUEST_MAX: Duration = Duration::from_secs(10);
/// How long a runner just stopped (SIGSTOP) is given for a request it had already sent to
/// land and be answered: without it a claim in flight could take a job the next step submits.
pub(crate) const SETTLE: Duration = Duration::from_millis(250);

pub struct Driver {
    pub shared: Shared,
    pub capabilities: BTreeMap<String, Capability>,
    /// Faults started by `fault` steps, each healing itself when its window ends.
    pub faults: tokio::task::JoinSet<()>,
}

/// The proxies of a runner's `link`: its links to every replica of the control plane, its
/// link to the target, or both.
fn links(cluster: &Cluster, runner: usize, link: Link) -> Vec<String> {
    match link {
        Link::Control => cluster.control_link_names(runner),
        Link::Target => vec![target_link(runner)],
        Link::Both => cluster.control_link_names(runner).into_iter().chain([target_link(runner)]).collect(),
    }
}

/// The runners holding a running attempt now.
async fn busy_runners(operator: &Client) -> std::collections::BTreeSet<String> {
    crate::run::nemesis::running_claims(operator).await.into_iter().map(|claim| claim.runner).collect()
}

fn index(name: &str, cluster: &Cluster) -> Result<usize, String> {
    runner_index(name, cluster.runners.len() as u32).map_err(|error| error.to_string())
}

impl Driver {
    pub(super) async fn cluster(&self) -> tokio::sync::MutexGuard<'_, Cluster> {
        self.shared.cluster.lock().await
    }

    async fn operator(&self) -> Client {
        self.cluster().await.system.operator.clone()
    }

    pub(super) async fn as_runner(&self, name: &str) -> Result<(Client, String), String> {
        let cluster = self.cluster().await;
        let slot = &cluster.runners[index(name, &cluster)?];
        Ok((cluster.system.operator.with_token(&slot.token), slot.id.clone()))
    }

    /// Runs one step (at its `at_ms`, if it has one); an error says why the step failed
    /// (the scenario then fails).
    pub(crate) async fn step(&mut self, step: &Step) -> Result<(), String> {
        if let Some(at_ms) = step.at_ms {
            let wait_ms = at_ms.saturating_sub(self.shared.recorder.now_ms());
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
        let label = format!("step {} (line {})", step.index, step.line);
        let recorder = &self.shared.recorder;
        recorder.record(Process::SCENARIO, EventType::Invoke, Op::Step, |event| event.reason = Some(label.clone()));
        let marked = step.action.named_attempt().filter(|_| step.if_attempt_exists);
        let (skipped, outcome) = match (&step.action, marked) {
            (Action::Wait(condition), marked) => match self.wait(condition, marked).await {
                Ok(skipped) => (skipped, Ok(())),
                Err(error) => (None, Err(error)),
            },
            (action, marked) => match marked {
                Some((job, number)) => match self.absent(job, number).await {
                    Some(why) => (Some(why), Ok(())),
                    None => (None, self.run(action).await),
                },
                None => (None, self.run(action).await),
            },
        };
        let kind = if outcome.is_ok() { EventType::Ok } else { EventType::Fail };
        self.shared.recorder.record(Process::SCENARIO, kind, Op::Step, |event| {
            event.reason = Some(match (&outcome, &skipped) {
                (Ok(()), Some(why)) => format!("{label}: skipped: {why}"),
                (Ok(()), None) => label.clone(),
                (Err(error), _) => format!("{label}: {error}"),
            })
        });
        outcome
    }

    /// Why a step marked `if_attempt_exists` (not a `wait`) is skipped: attempt `number` of
    /// `job` does not exist. None: the step is to run.
    async fn absent(&self, job: &str, number: u32) -> Option<String> {
        let view = self.operator().await.job(job).await.ok()?;
        (!attempt_exists(&view, number)).then(|| no_attempt(job, number, &view))
    }

    /// Runs an action that is not a `wait`.
    async fn run(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::Fault { .. } => self.fault(action).await,
            action => self.action(action).await,
        }
    }

    /// Starts a nemesis fault in the background, now: it heals itself after its window.
    async fn fault(&mut self, action: &Action) -> Result<(), String> {
        let runners = self.shared.config.runners;
        let fault = fault_of(action, self.shared.recorder.now_ms(), runners)?;
        let end_ms = self.shared.config.time_limit_ms;
        self.faults.spawn(crate::run::nemesis::one(self.shared.clone(), fault, end_ms));
        Ok(())
    }

    async fn action(&mut self, action: &Action) -> Result<(), String> {
        let error = |error: proxy::ClientError| error.to_string();
        match action {
            Action::Submit { job, key, steps, step_ms, runner } => {
                let planned = workloads::jobs::PlannedJob {
                    at_ms: self.shared.recorder.now_ms(),
                    id: job.clone(),
                    deployment_key: key.clone(),
                    steps: *steps,
                    step_ms: *step_ms,
                };
                match runner {
                    None => crate::run::submit(&self.shared, &planned).await,
                    Some(runner) => self.submit_to(runner, &planned).await,
                }
            }
            Action::Wait(condition) => self.wait(condition, None).await.map(|_| ()),
            Action::Elapse { ms } => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                Ok(())
            }
            Action::Cut { runner, link } | Action::Heal { runner, link } => {
                let enabled = matches!(action, Action::Heal { .. });
                let cluster = self.cluster().await;
                for name in links(&cluster, index(runner, &cluster)?, *link) {
                    cluster.proxy.set_enabled(&name, enabled).await.map_err(error)?;
                }
                Ok(())
            }
            Action::Latency { runner, link, ms } => {
                let kind = ToxicKind::Latency { latency_ms: *ms, jitter_ms: 0 };
                let toxic = Toxic::new(kind).on(Stream::Upstream).named(TOXIC_NAME);
                let cluster = self.cluster().await;
                for name in links(&cluster, index(runner, &cluster)?, *link) {
                    cluster.proxy.add_toxic(&name, &toxic).await.map_err(error)?;
                }
                Ok(())
            }
            Action::Clear { runner, link } => {
                let cluster = self.cluster().await;
                for name in links(&cluster, index(runner, &cluster)?, *link) {
                    cluster.proxy.remove_toxic(&name, TOXIC_NAME).await.map_err(error)?;
                }
                Ok(())
            }
            _ => self.process_action(action).await,
        }
    }

    /// Submits a job for runner `name` to claim. The other runners that are idle (running,
    /// holding no claim) are stopped first and given [`SETTLE`] for a claim already in flight
    /// to land; one that took a claim meanwhile is continued at once, since it is busy. The
    /// rest are continued when the job has its attempt (bounded). Fails when another runner
    /// claimed it, or nobody did in time.
    async fn submit_to(&self, name: &str, job: &workloads::jobs::PlannedJob) -> Result<(), String> {
        let (operator, wanted, mut held) = {
            let cluster = self.cluster().await;
            let wanted = index(name, &cluster)?;
            let busy = busy_runners(&cluster.system.operator).await;
            let held: Vec<usize> = (0..cluster.runners.len())
                .filter(|&at| at != wanted && !cluster.runners[at].is_stopped())
                .filter(|&at| !busy.contains(&cluster.runners[at].id))
                .filter(|&at| cluster.signal_runner(at, libc::SIGSTOP))
                .collect();
            (cluster.system.operator.clone(), cluster.runners[wanted].id.clone(), held)
        };
        if !held.is_empty() {
            tokio::time::sleep(SETTLE).await;
            let busy = busy_runners(&operator).await;
            let cluster = self.cluster().await;
            held.retain(|&at| !(busy.contains(&cluster.runners[at].id) && cluster.signal_runner(at, libc::SIGCONT)));
        }
        let submitted = crate::run::submit(&self.shared, job).await;
        let bound = Duration::from_millis((10 * self.shared.config.lease_ms).max(10_000));
        let deadline = tokio::time::Instant::now() + bound;
        let mut claimed_by = None;
        while submitted.is_ok() && claimed_by.is_none() && tokio::time::Instant::now() < deadline {
            match operator.job(&job.id).await {
                Ok(view) if !view.attempts.is_empty() => claimed_by = Some(view.attempts[0].runner.clone()),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let cluster = self.cluster().await;
        for at in held {
            cluster.signal_runner(at, libc::SIGCONT);
        }
        submitted?;
        match claimed_by {
            Some(runner) if runner == wanted => Ok(()),
            Some(runner) => Err(format!("`{}` was claimed by {runner}, not {name}", job.id)),
            None => Err(format!("`{}` was not claimed within {} ms", job.id, bound.as_millis())),
        }
    }

    async fn process_action(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::Pause { runner } => {
                self.signal(runner, libc::SIGSTOP).await?;
                tokio::time::sleep(SETTLE).await;
                Ok(())
            }
            Action::Resume { runner } => self.signal(runner, libc::SIGCONT).await,
            Action::Kill { runner } | Action::Restart { runner } => {
                let mut cluster = self.cluster().await;
                let at = index(runner, &cluster)?;
                if let Some(process) = cluster.runners[at].process.as_mut() {
                    process.kill().await;
                }
                if matches!(action, Action::Kill { .. }) {
                    return Ok(());
                }
                cluster.start_runner(at).map_err(|error| error.to_string())
            }
            Action::RestartControlPlane {} => {
                self.cluster().await.system.restart_control().await.map_err(|error| format!("{error:#}"))
            }
            Action::Skew { runner, offset_ms } => {
                let cluster = self.cluster().await;
                let at = index(runner, &cluster)?;
                cluster.set_clock(at, *offset_ms).map_err(|error| error.to_string())
            }
            Action::Reconcile { job, attempt, finding, outcome } => {
                self.reconcile(job, *attempt, finding, outcome.as_deref()).await
            }
            _ => self.runner_action(action).await,
        }
    }

    async fn signal(&self, runner: &str, signal: i32) -> Result<(), String> {
        let cluster = self.cluster().await;
        let at = index(runner, &cluster)?;
        if cluster.signal_runner(at, signal) {
            Ok(())
        } else {
            Err(format!("runner {runner} has no process to signal"))
        }
    }

    /// Polls the condition every 50 ms until it holds or its bound passes.
    /// Polls until `condition` holds, within its bound. A wait marked `if_attempt_exists`
    /// (`marked`: the job and the attempt it names) is skipped — Ok with why — once the job
    /// has settled without that attempt, or at its bound while the attempt is still absent;
    /// at its bound with the attempt made, it fails as any wait.
    async fn wait(&self, condition: &Condition, marked: Option<(&str, u32)>) -> Result<Option<String>, String> {
        let bound = Duration::from_millis(condition.within_ms.unwrap_or(1));
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let view = self.view(condition).await;
            let found = match &view {
                Ok(view) => evaluate(condition, view),
                Err(error) => Err(error.clone()),
            };
            let Err(found) = found else { return Ok(None) };
            let over = tokio::time::Instant::now() >= deadline;
            let job = marked.and_then(|(job, number)| Some((job, number, view.as_ref().ok()?.jobs.get(job)?)));
            if let Some((job, number, view)) = job {
                let settled = matches!(view.state, JobState::Succeeded | JobState::Failed);
                if !attempt_exists(view, number) && (settled || over) {
                    return Ok(Some(no_attempt(job, number, view)));
                }
            }
            if over {
                return Err(format!("not within {} ms: found {found}", bound.as_millis()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn view(&self, condition: &Condition) -> Result<View, String> {
        let mut view = View::default();
        if let Some(job) = &condition.job {
            if let Ok(found) = self.operator().await.job(job).await {
                view.jobs.insert(job.clone(), found);
            }
        }
        if condition.applied_steps.is_some() || condition.stale_step.is_some() {
            view.steps = self.cluster().await.target_steps(REQUEST_MAX).await?;
        }
        Ok(view)
    }

    /// Attempt `number` of `job`: its id, fence and runner.
    pub(super) async fn attempt(&self, job: &str, number: u32) -> Result<AttemptView, String> {
        let view = self.operator().await.job(job).await.map_err(|error| format!("job `{job}`: {error}"))?;
        let found = view.attempts.get((number as usize).wrapping_sub(1)).cloned();
        found.ok_or_else(|| format!("job `{job}` has {} attempts, no attempt {number}", view.attempts.len()))
    }

    async fn reconcile(&self, job: &str, number: u32, finding: &str, outcome: Option<&str>) -> Result<(), String> {
        let attempt = self.attempt(job, number).await?;
        let finding = serde_json::from_value(finding.into()).map_err(|error| error.to_string())?;
        let outcome = outcome.map(|outcome| serde_json::from_value(outcome.into())).transpose();
        let request = ReconcileRequest {
            job: job.to_string(),
            attempt: attempt.id.clone(),
            finding,
            outcome: outcome.map_err(|error| error.to_string())?,
            evidence: Some("scenario".into()),
        };
        let claim = |event: &mut history::Event| {
            *event = event.clone().with_claim(job, &attempt.id, &attempt.runner, attempt.fence);
        };
        let operator = self.operator().await;
        crate::run::operator::send_reconcile(&self.shared.recorder, &operator, &request, claim)
            .await
            .map(drop)
            .map_err(|error| error.to_string())
    }
}

/// Whether the job's view shows attempt `number` (1-based).
fn attempt_exists(view: &JobView, number: u32) -> bool {
    view.attempts.len() >= number as usize
}

/// Why a step on attempt `number` of `job` is skipped.
fn no_attempt(job: &str, number: u32, view: &JobView) -> String {
    format!("job {job} has {} attempt(s), no attempt {number}: the system did not retry it", view.attempts.len())
}
