//! The fault schedule: which fault, on which runner, when and for how long — generated
//! from the seed, executed by the harness, and stored with the run so it can be replayed.

use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    DelayedHeartbeats,
    DuplicateResults,
    ConflictingResults,
    Reconnects,
    ClockSkew,
    DisconnectDuringMutation,
    Kill,
    RestartControlPlane,
}

impl FaultKind {
    pub const ALL: [FaultKind; 8] = [
        FaultKind::DelayedHeartbeats,
        FaultKind::DuplicateResults,
        FaultKind::ConflictingResults,
        FaultKind::Reconnects,
        FaultKind::ClockSkew,
        FaultKind::DisconnectDuringMutation,
        FaultKind::Kill,
        FaultKind::RestartControlPlane,
    ];

    /// The operation the nemesis records this fault under.
    pub fn op(self) -> history::Op {
        match self {
            FaultKind::DelayedHeartbeats => history::Op::DelayedHeartbeats,
            FaultKind::DuplicateResults => history::Op::DuplicateResults,
            FaultKind::ConflictingResults => history::Op::ConflictingResults,
            FaultKind::Reconnects => history::Op::Reconnects,
            FaultKind::ClockSkew => history::Op::ClockSkew,
            FaultKind::DisconnectDuringMutation => history::Op::DisconnectDuringMutation,
            FaultKind::Kill => history::Op::Kill,
            FaultKind::RestartControlPlane => history::Op::RestartControlPlane,
        }
    }

    /// The fault's name: the name of its operation in the history.
    pub fn name(self) -> &'static str {
        self.op().as_str()
    }

    /// Parses `a,b,...` or `all`; an unknown name is an error that lists the known ones.
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, String> {
        if list.trim() == "all" {
            return Ok(FaultKind::ALL.to_vec());
        }
        let mut kinds = Vec::new();
        for name in list.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            let Some(kind) = FaultKind::ALL.into_iter().find(|kind| kind.name() == name) else {
                let known: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.name()).collect();
                return Err(format!("unknown fault `{name}`; known: all, {}", known.join(", ")));
            };
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Ok(kinds)
    }
}

/// How a fault is realised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "kebab-case")]
pub enum Variant {
    /// Latency on the runner → control-plane link, beyond the lease.
    Latency { latency_ms: u64 },
    /// SIGSTOP the runner for the window, then SIGCONT.
    Pause,
    /// Responses on the runner's control-plane link are lost after the server acted.
    LostResponse,
    /// A captured result request of the runner is sent again.
    Replay,
    /// A different terminal result for an attempt that already committed.
    Conflict,
    /// A runner's current claim reported as the result of another running job: a report
    /// whose fence belongs to a different job, attempt and runner than it names.
    CrossJob,
    /// Both links cut for the window; the old runner reports when they return.
    CutLinks,
    /// The runner's clock moved by `offset_ms` for the window.
    StaticSkew { offset_ms: i64 },
    /// The runner's clock jumps by `offset_ms`, and back by twice that halfway.
    Jump { offset_ms: i64 },
    /// The control-plane link cut while the runner is between target steps.
    ControlLink,
    /// The target link reset while a step is in flight.
    TargetLinkMidStep,
    /// The control-plane link cut while a step is held in the network for `latency_ms`:
    /// the step reaches the target after the attempt was superseded (the seed's exercise).
    DelayedStep { latency_ms: u64 },
    /// SIGKILL the runner; start it again when the window ends.
    KillRunner,
    /// SIGKILL the control plane and start it again on the same store.
    RestartControl,
}

impl Variant {
    /// The fault of the mission this variant realises.
    pub fn kind(&self) -> FaultKind {
        match self {
            Variant::Latency { .. } | Variant::Pause => FaultKind::DelayedHeartbeats,
            Variant::LostResponse | Variant::Replay => FaultKind::DuplicateResults,
            Variant::Conflict | Variant::CrossJob => FaultKind::ConflictingResults,
            Variant::CutLinks => FaultKind::Reconnects,
            Variant::StaticSkew { .. } | Variant::Jump { .. } => FaultKind::ClockSkew,
            Variant::ControlLink | Variant::TargetLinkMidStep | Variant::DelayedStep { .. } => {
                FaultKind::DisconnectDuringMutation
            }
            Variant::KillRunner => FaultKind::Kill,
            Variant::RestartControl => FaultKind::RestartControlPlane,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// When it begins, ms after the run started.
    pub at_ms: u64,
    /// How long until it is healed.
    pub duration_ms: u64,
    pub kind: FaultKind,
    /// Index of the runner it hits (0-based), if it hits one.
    pub runner: Option<u32>,
    pub variant: Variant,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleOptions {
    pub kinds: Vec<FaultKind>,
    pub time_limit_ms: u64,
    pub runners: u32,
    pub lease_ms: u64,
}

/// Most faults in one schedule.
pub const FAULTS_MAX: usize = 10_000;

/// Sequential fault windows separated by gaps of one to two leases; the kinds are taken
/// in seeded rounds so that every chosen kind appears once before any appears twice.
pub fn schedule(seed: u64, options: &ScheduleOptions) -> Vec<Fault> {
    let mut rng = crate::rng(seed, "faults");
    let lease_ms = options.lease_ms.max(1);
    let mut faults = Vec::new();
    let mut at_ms = 2 * lease_ms;
    let mut round: Vec<FaultKind> = Vec::new();
    while !options.kinds.is_empty() && faults.len() < FAULTS_MAX {
        if round.is_empty() {
            round = options.kinds.clone();
            round.shuffle(&mut rng);
        }
        let kind = round.pop().expect("a round is refilled when empty");
        let mut fault = realise(&mut rng, kind, at_ms, options);
        if let Some(skewed) = faults.last().filter(|last: &&Fault| overlaps_next(last, at_ms)) {
            fault.runner = skewed.runner.or(fault.runner);
        }
        if fault.at_ms + fault.duration_ms >= options.time_limit_ms {
            break;
        }
        at_ms = match fault.kind {
            // A skewed clock matters when reports come late: the next fault starts inside
            // the skew window, on the same runner.
            FaultKind::ClockSkew => fault.at_ms + lease_ms,
            _ => fault.at_ms + fault.duration_ms + rng.gen_range(lease_ms..=2 * lease_ms),
        };
        faults.push(fault);
    }
    faults
}

/// Whether `last` is a clock skew still in effect when the next fault starts at `at_ms`.
fn overlaps_next(last: &Fault, at_ms: u64) -> bool {
    last.kind == FaultKind::ClockSkew && at_ms < last.at_ms + last.duration_ms
}

fn realise(rng: &mut impl Rng, kind: FaultKind, at_ms: u64, options: &ScheduleOptions) -> Fault {
    let lease_ms = options.lease_ms.max(1);
    let runner = Some(rng.gen_range(0..options.runners.max(1)));
    let skew_ms = rng.gen_range(30_000..=180_000i64) * if rng.gen_bool(0.5) { 1 } else { -1 };
    let (duration_ms, runner, variant) = match (kind, rng.gen_bool(0.5)) {
        (FaultKind::DelayedHeartbeats, true) => {
            (3 * lease_ms, runner, Variant::Latency { latency_ms: lease_ms * 3 / 2 })
        }
        (FaultKind::DelayedHeartbeats, false) => (2 * lease_ms, runner, Variant::Pause),
        (FaultKind::DuplicateResults, true) => (lease_ms / 2, runner, Variant::LostResponse),
        (FaultKind::DuplicateResults, false) => (0, runner, Variant::Replay),
        (FaultKind::ConflictingResults, true) => (0, runner, Variant::Conflict),
        (FaultKind::ConflictingResults, false) => (0, runner, Variant::CrossJob),
        (FaultKind::Reconnects, _) => (3 * lease_ms, runner, Variant::CutLinks),
        (FaultKind::ClockSkew, true) => (4 * lease_ms, runner, Variant::StaticSkew { offset_ms: skew_ms }),
        (FaultKind::ClockSkew, false) => (4 * lease_ms, runner, Variant::Jump { offset_ms: skew_ms }),
        (FaultKind::DisconnectDuringMutation, true) => match rng.gen_range(0..3) {
            0 => (2 * lease_ms, runner, Variant::ControlLink),
            1 => (lease_ms, runner, Variant::TargetLinkMidStep),
            _ => (6 * lease_ms, runner, Variant::DelayedStep { latency_ms: 4 * lease_ms }),
        },
        (FaultKind::DisconnectDuringMutation, false) => {
            (6 * lease_ms, runner, Variant::DelayedStep { latency_ms: 4 * lease_ms })
        }
        (FaultKind::Kill, _) => (2 * lease_ms, runner, Variant::KillRunner),
        (FaultKind::RestartControlPlane, _) => (lease_ms / 2, None, Variant::RestartControl),
    };
    Fault { at_ms, duration_ms, kind, runner, variant }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(kinds: Vec<FaultKind>) -> ScheduleOptions {
        ScheduleOptions { kinds, time_limit_ms: 60_000, runners: 3, lease_ms: 1_000 }
    }

    #[test]
    fn same_seed_same_schedule_and_another_seed_another() {
        let all = options(FaultKind::ALL.to_vec());
        assert_eq!(schedule(11, &all), schedule(11, &all));
        assert_ne!(schedule(11, &all), schedule(12, &all));
    }

    #[test]
    fn every_chosen_kind_appears_and_only_clock_skew_overlaps_the_next_fault() {
        let faults = schedule(5, &options(FaultKind::ALL.to_vec()));
        for kind in FaultKind::ALL {
            assert!(faults.iter().any(|fault| fault.kind == kind), "{kind:?} missing from {faults:?}");
        }
        for pair in faults.windows(2) {
            if pair[0].kind == FaultKind::ClockSkew {
                assert!(pair[1].at_ms < pair[0].at_ms + pair[0].duration_ms, "the next fault falls inside the skew");
                assert_eq!(pair[0].runner, pair[1].runner.or(pair[0].runner), "on the skewed runner");
            } else {
                assert!(pair[0].at_ms + pair[0].duration_ms < pair[1].at_ms, "{pair:?}");
            }
        }
        assert!(faults.iter().all(|fault| fault.at_ms + fault.duration_ms < 60_000));
        assert!(faults.iter().all(|fault| fault.runner.is_none_or(|runner| runner < 3)));
    }

    #[test]
    fn every_scheduled_variant_realises_its_kind() {
        for seed in 0..20 {
            for fault in schedule(seed, &options(FaultKind::ALL.to_vec())) {
                assert_eq!(fault.variant.kind(), fault.kind, "{fault:?}");
            }
        }
    }

    #[test]
    fn only_the_chosen_kinds_appear_and_none_when_none_chosen() {
        let faults = schedule(5, &options(vec![FaultKind::Kill]));
        assert!(!faults.is_empty() && faults.iter().all(|fault| fault.kind == FaultKind::Kill));
        assert!(schedule(5, &options(vec![])).is_empty());
    }

    #[test]
    fn fault_lists_parse_and_unknown_names_are_named() {
        assert_eq!(FaultKind::parse_list("all").unwrap().len(), 8);
        assert_eq!(
            FaultKind::parse_list("kill, reconnects,kill").unwrap(),
            vec![FaultKind::Kill, FaultKind::Reconnects]
        );
        let error = FaultKind::parse_list("kill,partition").unwrap_err();
        assert!(error.contains("`partition`") && error.contains("clock-skew"), "{error}");
    }
}
