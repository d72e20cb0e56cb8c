//! What a run's history says about one anomaly: the jobs it names, the runners that held
//! their attempts, the faults that touched those attempts (or named those jobs) before the
//! anomaly's evidence was complete, and when that was. A shrink starts from this
//! neighbourhood — a job or two, their runners and their faults, a few seconds long —
//! instead of halving the whole run: each try is then a short run, and few are needed.

use std::collections::{BTreeMap, BTreeSet};

use checkers::Anomaly;
use history::{Event, EventType, Op, Process};
use workloads::faults::Fault;
use workloads::jobs::PlannedJob;

use super::{Case, WARM_UP_MS};

/// A pinned submit stops the other idle runners and waits a moment before it submits: the
/// job is submitted this long before the run's claim, so that it is claimed about when it
/// was in the run.
const PIN_LEAD_MS: u64 = 300;
/// A fault window is cut this many leases after the anomaly's evidence was complete:
/// what came later cannot have caused it, and every try runs the window out.
const TRIM_LEASES: u64 = 2;

/// One attempt as the history shows it: its job, the runner that held it, when it was
/// claimed and when it was last heard of (ms after the start).
#[derive(Clone, Debug, PartialEq)]
struct Held {
    job: String,
    runner: u32,
    from_ms: u64,
    until_ms: u64,
}

/// A fault as the run realised it: `at_ms` is when it took effect (after waiting for a
/// claim, or on a later try), and `jobs` the jobs its own events name (a resent, crossed or
/// borrowed report, a held step).
#[derive(Clone, Debug, PartialEq)]
struct Realised {
    fault: Fault,
    scheduled_ms: u64,
    jobs: BTreeSet<String>,
}

/// The history read once: every attempt, every job's submit, every fault that took effect.
pub struct Timeline {
    attempts: BTreeMap<String, Held>,
    submits: BTreeMap<String, u64>,
    faults: Vec<Realised>,
    /// Job → when an event last named it, its final state aside.
    last_ms: BTreeMap<String, u64>,
    /// Event index → ms after the start, and whether it is a job's final state.
    events: Vec<(u64, bool)>,
}

/// One anomaly's neighbourhood in the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Story {
    /// `checker/kind` of the anomaly.
    pub about: String,
    /// The jobs it names.
    pub jobs: BTreeSet<String>,
    /// The runners (0-based) that held their attempts until it was complete, or that a
    /// fault naming them hit.
    pub runners: BTreeSet<u32>,
    /// From the first of its jobs' submits to when its evidence was complete (its jobs'
    /// final states aside), ms after the start.
    pub from_ms: u64,
    pub until_ms: u64,
    /// The faults that touched its attempts on their runners, named its jobs, or hit the
    /// whole system (the control plane, the target's clock) inside its window.
    pub touching: Vec<Fault>,
    /// Every fault whose window overlaps its own (from a lease before it).
    pub beside: Vec<Fault>,
    /// The jobs whose attempts its runners held, or that shared its jobs' keys, inside its
    /// window (from a lease before it).
    pub nearby: BTreeSet<String>,
    /// Job → the runner of its first attempt and when it was claimed.
    pub claims: BTreeMap<String, (u32, u64)>,
}

fn ms(event: &Event) -> u64 {
    event.time_ns / 1_000_000
}

/// `rN` → N - 1.
fn runner_number(name: &str) -> Option<u32> {
    name.strip_prefix('r')?.parse::<u32>().ok()?.checked_sub(1)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

fn window(fault: &Fault) -> (u64, u64) {
    (fault.at_ms, fault.at_ms + fault.duration_ms)
}

impl Timeline {
    /// Reads the attempts (from their claims: the ledger's, or the runners' answers), the
    /// client's submits, and the faults of `schedule` as the nemesis recorded them taking
    /// effect.
    pub fn read(events: &[Event], schedule: &[Fault]) -> Timeline {
        let mut timeline = Timeline {
            attempts: BTreeMap::new(),
            submits: BTreeMap::new(),
            faults: Vec::new(),
            last_ms: BTreeMap::new(),
            events: Vec::new(),
        };
        for event in events {
            let at_ms = ms(event);
            timeline.events.push((at_ms, event.f == Op::Final && event.process == Process::HARNESS));
            if event.f == Op::Final {
                continue;
            }
            if let Some(job) = &event.job {
                timeline.last_ms.insert(job.clone(), at_ms);
            }
            if event.f == Op::Submit && event.process == Process::CLIENT {
                if let Some(job) = &event.job {
                    timeline.submits.entry(job.clone()).or_insert(at_ms);
                }
            }
            timeline.heard(event, at_ms);
        }
        for event in events.iter().filter(|event| event.process == Process::NEMESIS) {
            timeline.fault_event(event, schedule);
        }
        timeline
    }

    /// Notes an attempt's claim (the first event naming it with a job and a runner) and
    /// when it was last heard of.
    fn heard(&mut self, event: &Event, at_ms: u64) {
        let Some(attempt) = &event.attempt else { return };
        if let Some(held) = self.attempts.get_mut(attempt) {
            if event.runner.as_deref().and_then(runner_number) == Some(held.runner) {
                held.until_ms = at_ms;
            }
            return;
        }
        let claimed = event.f == Op::Claim && matches!(event.kind, EventType::Ledger | EventType::Response);
        let runner = event.runner.as_deref().and_then(runner_number);
        if let (true, Some(job), Some(runner)) = (claimed, &event.job, runner) {
            let held = Held { job: job.clone(), runner, from_ms: at_ms, until_ms: at_ms };
            self.attempts.insert(attempt.clone(), held);
        }
    }

    /// A nemesis event: the start of a scheduled fault that took effect, or a job or an
    /// attempt one of its events names.
    fn fault_event(&mut self, event: &Event, schedule: &[Fault]) {
        let Some(value) = &event.value else { return };
        let Ok(fault) = serde_json::from_value::<Fault>(value.clone()) else { return };
        if !schedule.contains(&fault) {
            return;
        }
        let same = |realised: &Realised| {
            realised.scheduled_ms == fault.at_ms
                && realised.fault.runner == fault.runner
                && realised.fault.variant == fault.variant
        };
        let phase = value.get("phase").and_then(serde_json::Value::as_str);
        let effective = value.get("effective").and_then(serde_json::Value::as_bool) == Some(true);
        let start = effective && event.kind == EventType::Invoke && matches!(phase, None | Some("start"));
        if start && !self.faults.iter().any(same) {
            let started = Fault { at_ms: ms(event), ..fault.clone() };
            self.faults.push(Realised { fault: started, scheduled_ms: fault.at_ms, jobs: BTreeSet::new() });
        }
        let held = value.get("held").and_then(|held| held.get("attempt")).and_then(serde_json::Value::as_str);
        let attempts = [event.attempt.as_deref(), held].into_iter().flatten();
        let jobs: Vec<String> = attempts
            .filter_map(|attempt| self.attempts.get(attempt).map(|held| held.job.clone()))
            .chain(event.job.clone())
            .collect();
        if let Some(realised) = self.faults.iter_mut().rev().find(|realised| same(realised)) {
            realised.jobs.extend(jobs);
        }
    }

    /// The job an attempt belongs to, by its claim.
    fn job_of(&self, attempt: &str) -> Option<&str> {
        self.attempts.get(attempt).map(|held| held.job.as_str())
    }

    /// The anomaly's story, or none when the history does not show its jobs.
    pub fn story(&self, anomaly: &Anomaly, planned: &[PlannedJob], lease_ms: u64) -> Option<Story> {
        let mut jobs: BTreeSet<String> = anomaly.job.iter().cloned().collect();
        jobs.extend(anomaly.attempts.iter().filter_map(|attempt| self.job_of(attempt)).map(str::to_string));
        let named = |job: &String| planned.iter().any(|planned| &planned.id == job);
        jobs.retain(named);
        if jobs.is_empty() {
            return None;
        }
        let until_ms = self.complete_ms(anomaly, &jobs)?;
        let from_ms = jobs.iter().filter_map(|job| self.submits.get(job)).copied().min().unwrap_or(0).min(until_ms);
        let held: Vec<&Held> =
            self.attempts.values().filter(|held| jobs.contains(&held.job) && held.from_ms <= until_ms).collect();
        let mut runners: BTreeSet<u32> = held.iter().map(|held| held.runner).collect();
        runners.extend(anomaly.runners.iter().filter_map(|runner| runner_number(runner)));
        let inside = (from_ms, until_ms);
        let touches = |realised: &&Realised| {
            let on_attempt = |held: &&Held| {
                Some(held.runner) == realised.fault.runner
                    && overlaps(window(&realised.fault), (held.from_ms, held.until_ms))
            };
            let on_all = !realised.fault.kind.on_runner() || realised.fault.on_every_runner();
            let everywhere = on_all && overlaps(window(&realised.fault), inside);
            realised.fault.at_ms <= until_ms
                && (everywhere || held.iter().any(on_attempt) || realised.jobs.iter().any(|job| jobs.contains(job)))
        };
        let touching: Vec<Fault> = self.faults.iter().filter(touches).map(|realised| realised.fault.clone()).collect();
        runners.extend(touching.iter().filter(|fault| fault.kind.on_runner()).filter_map(|fault| fault.runner));
        let around = (from_ms.saturating_sub(lease_ms), until_ms);
        let beside = self.faults.iter().map(|realised| &realised.fault);
        let beside: Vec<Fault> =
            beside.filter(|fault| fault.at_ms <= until_ms && overlaps(window(fault), around)).cloned().collect();
        let keys: BTreeSet<&str> =
            planned.iter().filter(|job| jobs.contains(&job.id)).map(|job| job.deployment_key.as_str()).collect();
        let nearby = self.nearby(&runners, &keys, planned, around);
        let claims = self.first_claims();
        Some(Story {
            about: format!("{}/{}", anomaly.checker, anomaly.kind),
            jobs,
            runners,
            from_ms,
            until_ms,
            touching,
            beside,
            nearby,
            claims,
        })
    }

    /// When the anomaly's evidence was complete. An anomaly that stands on a job's final
    /// state stands on everything that moved its jobs before it: it was complete when its
    /// jobs were last named, their final states aside.
    fn complete_ms(&self, anomaly: &Anomaly, jobs: &BTreeSet<String>) -> Option<u64> {
        let evidence: Vec<(u64, bool)> =
            anomaly.events.iter().filter_map(|&index| self.events.get(index as usize).copied()).collect();
        let complete = evidence.iter().filter(|(_, last)| !last).map(|(at_ms, _)| *at_ms).max();
        let on_final = evidence.is_empty() || evidence.iter().any(|(_, last)| *last);
        let heard = jobs.iter().filter_map(|job| self.last_ms.get(job).copied()).max();
        match on_final {
            true => complete.max(heard),
            false => complete,
        }
    }

    /// The jobs held by `runners`, or on `keys`, inside `around`.
    fn nearby(
        &self,
        runners: &BTreeSet<u32>,
        keys: &BTreeSet<&str>,
        planned: &[PlannedJob],
        around: (u64, u64),
    ) -> BTreeSet<String> {
        let key_of =
            |job: &str| planned.iter().find(|planned| planned.id == job).map(|job| job.deployment_key.as_str());
        self.attempts
            .values()
            .filter(|held| overlaps((held.from_ms, held.until_ms), around))
            .filter(|held| runners.contains(&held.runner) || key_of(&held.job).is_some_and(|key| keys.contains(key)))
            .map(|held| held.job.clone())
            .collect()
    }

    /// Job → the runner of its first attempt and when it was claimed.
    fn first_claims(&self) -> BTreeMap<String, (u32, u64)> {
        let mut claims: BTreeMap<String, (u32, u64)> = BTreeMap::new();
        for held in self.attempts.values() {
            let first = claims.entry(held.job.clone()).or_insert((held.runner, held.from_ms));
            if held.from_ms < first.1 {
                *first = (held.runner, held.from_ms);
            }
        }
        claims
    }
}

impl Story {
    /// The story alone: its jobs, its runners (renumbered r1..) and the faults that touched
    /// them, each job pinned to the runner of its first attempt and submitted when it was
    /// claimed, every fault when it took effect and cut a little after the anomaly, the
    /// whole moved to start at the warm-up.
    pub fn focus(&self, planned: &[PlannedJob], lease_ms: u64) -> Case {
        let runners: Vec<u32> = self.runners.iter().copied().collect();
        self.case(&self.jobs, &self.touching, Some(&runners), planned, lease_ms)
    }

    /// The story with what was beside it: the jobs its runners held and those on its keys,
    /// every runner, every fault in its window.
    pub fn context(&self, planned: &[PlannedJob], lease_ms: u64, runners: u32) -> Case {
        let jobs: BTreeSet<String> = self.jobs.union(&self.nearby).cloned().collect();
        let mut case = self.case(&jobs, &self.beside, None, planned, lease_ms);
        case.runners = runners;
        case
    }

    fn case(
        &self,
        jobs: &BTreeSet<String>,
        faults: &[Fault],
        runners: Option<&[u32]>,
        planned: &[PlannedJob],
        lease_ms: u64,
    ) -> Case {
        let renumber = |runner: u32| match runners {
            Some(runners) => runners.iter().position(|&kept| kept == runner).map(|at| at as u32),
            None => Some(runner),
        };
        let mut case = Case {
            runners: runners.map_or(0, |runners| runners.len().max(1) as u32),
            jobs: Vec::new(),
            faults: Vec::new(),
            pins: BTreeMap::new(),
        };
        for job in planned.iter().filter(|job| jobs.contains(&job.id)) {
            let mut job = job.clone();
            if let Some(&(runner, claimed_ms)) = self.claims.get(&job.id) {
                job.at_ms = job.at_ms.max(claimed_ms.saturating_sub(PIN_LEAD_MS));
                if let Some(runner) = renumber(runner) {
                    case.pins.insert(job.id.clone(), runner);
                }
            }
            case.jobs.push(job);
        }
        let end_ms = self.until_ms + TRIM_LEASES * lease_ms;
        for fault in faults {
            let mut fault = fault.clone();
            fault.duration_ms = fault.duration_ms.min(end_ms.saturating_sub(fault.at_ms));
            fault.runner = match (fault.kind.on_runner(), fault.runner) {
                (true, Some(runner)) => match renumber(runner) {
                    Some(runner) => Some(runner),
                    None => continue,
                },
                (true, None) if !fault.on_every_runner() => continue,
                // Not on a runner, or on every runner (slow answers).
                _ => None,
            };
            case.faults.push(fault);
        }
        case.jobs.sort_by_key(|job| job.at_ms);
        case.faults.sort_by_key(|fault| fault.at_ms);
        let shift_ms = case.first_ms().saturating_sub(WARM_UP_MS);
        case.earlier(shift_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::faults::{FaultKind, Variant};

    fn at(ms: u64, process: Process, kind: EventType, f: Op) -> Event {
        Event::new(ms * 1_000_000, process, kind, f)
    }

    fn claim(ms: u64, job: &str, attempt: &str, runner: &str) -> Event {
        at(ms, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim).with_claim(job, attempt, runner, 1)
    }

    fn report(ms: u64, job: &str, attempt: &str, runner: &str) -> Event {
        at(ms, Process::runner(runner), EventType::Request, Op::Result).with_claim(job, attempt, runner, 1)
    }

    fn submit(ms: u64, job: &str) -> Event {
        at(ms, Process::CLIENT, EventType::Invoke, Op::Submit).with_job(job)
    }

    fn fault(at_ms: u64, duration_ms: u64, runner: Option<u32>, variant: Variant) -> Fault {
        Fault { at_ms, duration_ms, kind: variant.kind(), runner, variant }
    }

    /// The nemesis's start of `fault`, taking effect at `ms` (on its try `try_number`).
    fn started(ms: u64, fault: &Fault, effective: bool, job: Option<&str>) -> Event {
        let mut value = serde_json::to_value(fault).unwrap();
        value["phase"] = "start".into();
        value["effective"] = effective.into();
        let mut event = at(ms, Process::NEMESIS, EventType::Invoke, fault.kind.op());
        event.value = Some(value);
        event.job = job.map(str::to_string);
        event
    }

    fn job(id: &str, at_ms: u64, key: &str) -> PlannedJob {
        PlannedJob { at_ms, id: id.into(), deployment_key: key.into(), steps: 4, step_ms: 200 }
    }

    fn anomaly(job: &str, attempts: &[&str], events: Vec<u64>) -> Anomaly {
        Anomaly {
            checker: "stale-completion".into(),
            kind: "superseded-result-accepted".into(),
            job: Some(job.into()),
            attempts: attempts.iter().map(|attempt| attempt.to_string()).collect(),
            runners: vec![],
            fences: vec![],
            key: None,
            events,
            message: String::new(),
        }
    }

    /// j2's first attempt on r3 is cut off (its links cut while it runs), j2's second
    /// attempt goes to r2, and r3's late report is accepted. The story keeps j2, r2 and r3,
    /// the cut (when it took effect: its first try found r3 idle) and the control plane's
    /// restart inside the window; not j1 on r1, nor r1's latency, nor what came after.
    #[test]
    fn a_story_keeps_the_anomalys_jobs_runners_and_the_faults_that_touched_them() {
        let cut = fault(2_000, 3_000, Some(2), Variant::CutLinks);
        let latency = fault(2_100, 3_000, Some(0), Variant::Latency { latency_ms: 1_500 });
        let restart = fault(4_000, 0, Some(1), Variant::RestartControl);
        let late = fault(20_000, 1_000, Some(2), Variant::Pause);
        let schedule = vec![cut.clone(), latency.clone(), restart.clone(), late.clone()];
        let events = vec![
            submit(1_000, "j1"),
            claim(1_010, "j1", "j1-a1", "r1"),
            started(2_050, &cut, false, None),
            submit(2_900, "j2"),
            claim(3_000, "j2", "j2-a1", "r3"),
            started(2_100, &latency, true, None),
            started(3_100, &cut, true, None),
            started(4_000, &restart, true, None),
            claim(5_500, "j2", "j2-a2", "r2"),
            report(6_000, "j2", "j2-a2", "r2"),
            report(6_500, "j2", "j2-a1", "r3"),
            report(6_600, "j1", "j1-a1", "r1"),
            started(20_000, &late, true, None),
            at(30_000, Process::HARNESS, EventType::Ok, Op::Final).with_job("j2"),
        ];
        let planned = vec![job("j1", 1_000, "key-0"), job("j2", 2_900, "key-1")];
        let timeline = Timeline::read(&events, &schedule);
        let story = timeline.story(&anomaly("j2", &["j2-a1", "j2-a2"], vec![9, 10, 13]), &planned, 1_000).unwrap();
        assert_eq!(story.jobs, BTreeSet::from(["j2".to_string()]));
        assert_eq!(story.runners, BTreeSet::from([1, 2]));
        assert_eq!((story.from_ms, story.until_ms), (2_900, 6_500), "the final state does not count");
        let realised_cut = Fault { at_ms: 3_100, ..cut.clone() };
        assert_eq!(story.touching, vec![realised_cut, restart.clone()]);
        assert!(story.beside.contains(&latency) && !story.beside.contains(&late), "{:?}", story.beside);
        assert_eq!(story.nearby, BTreeSet::from(["j2".to_string()]), "j1 ran on r1, on another key");

        // Alone: two runners (r2, r3 → r1, r2), j2 pinned to r3's new name and submitted a
        // moment before its claim (not before its submit), the cut on it; the restart names no runner; all of it
        // moved to start at the warm-up.
        let case = story.focus(&planned, 1_000);
        assert_eq!(case.runners, 2);
        assert_eq!(case.jobs.iter().map(|job| (job.id.as_str(), job.at_ms)).collect::<Vec<_>>(), vec![("j2", 500)]);
        assert_eq!(case.pins, BTreeMap::from([("j2".to_string(), 1)]));
        let faults: Vec<(u64, Option<u32>, FaultKind)> =
            case.faults.iter().map(|fault| (fault.at_ms, fault.runner, fault.kind)).collect();
        assert_eq!(faults, vec![(700, Some(1), FaultKind::Reconnects), (1_600, None, FaultKind::RestartControlPlane)]);

        // Beside: every runner, the jobs of its runners and keys, every fault in its window.
        let wide = story.context(&planned, 1_000, 3);
        assert_eq!((wide.runners, wide.faults.len()), (3, 3));
    }

    /// A fault window that outlasts the anomaly is cut two leases after it was complete.
    #[test]
    fn a_window_that_outlasts_the_anomaly_is_cut() {
        let skew = fault(1_000, 20_000, None, Variant::TargetSkew { offset_ms: -90_000 });
        let events = vec![
            submit(1_000, "j1"),
            claim(1_100, "j1", "j1-a1", "r1"),
            started(1_200, &skew, true, None),
            report(3_000, "j1", "j1-a1", "r1"),
        ];
        let planned = vec![job("j1", 1_000, "key-0")];
        let story = Timeline::read(&events, std::slice::from_ref(&skew))
            .story(&anomaly("j1", &["j1-a1"], vec![3]), &planned, 1_000)
            .unwrap();
        let case = story.focus(&planned, 1_000);
        assert_eq!(case.faults[0].duration_ms, 3_000 + 2_000 - 1_200);
        assert_eq!(case.runners, 1);
    }
}
