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
    /// One replica of the control plane killed and started again (runs with replicas only).
    KillReplica,
    /// One replica's clock moved (libfaketime), on a store with a clock of its own.
    ReplicaClockSkew,
    /// The link between one replica and its database slowed, cut, or cut after a COMMIT.
    DbLink,
    /// The target's clock moved behind (libfaketime): capabilities look live past their
    /// lease there, and only the fence keeps a late step of an old attempt off.
    TargetClockSkew,
    /// The runner's open connections to the control plane made half-open: one side reset
    /// (an RST), the other kept open and silent (the proxy's own toxics).
    HalfOpen,
    /// The runner's packets to and from its control-plane proxy dropped on loopback
    /// (iptables): TCP retransmits and gives up, where a cut link closes connections.
    Partition,
}

/// The word for every fault, as `--nemesis`, a suite's `nemesis` and a system file's
/// variant take it: the default faults of a run.
pub const EVERY_FAULT: &str = "all";

/// The word for no fault at all.
pub const NO_FAULT: &str = "none";

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        FaultKind::DelayedHeartbeats,
        FaultKind::DuplicateResults,
        FaultKind::ConflictingResults,
        FaultKind::Reconnects,
        FaultKind::ClockSkew,
        FaultKind::DisconnectDuringMutation,
        FaultKind::Kill,
        FaultKind::RestartControlPlane,
        FaultKind::TargetClockSkew,
        FaultKind::HalfOpen,
        FaultKind::Partition,
    ];

    /// The faults only a control plane of several replicas can take; `all` includes them
    /// when a run has replicas.
    pub const REPLICAS: [FaultKind; 1] = [FaultKind::KillReplica];

    /// The faults of a control plane on a database server (its replicas' clocks and their
    /// links to the database); `all` includes them on PostgreSQL.
    pub const DATABASE: [FaultKind; 2] = [FaultKind::ReplicaClockSkew, FaultKind::DbLink];

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
            FaultKind::KillReplica => history::Op::KillReplica,
            FaultKind::ReplicaClockSkew => history::Op::ReplicaClockSkew,
            FaultKind::DbLink => history::Op::DbLink,
            FaultKind::TargetClockSkew => history::Op::TargetClockSkew,
            FaultKind::HalfOpen => history::Op::HalfOpen,
            FaultKind::Partition => history::Op::Partition,
        }
    }

    /// The fault's name: the name of its operation in the history.
    pub fn name(self) -> &'static str {
        self.op().as_str()
    }

    /// Every fault's name, comma-separated.
    fn known() -> String {
        let every = FaultKind::ALL.into_iter().chain(FaultKind::REPLICAS).chain(FaultKind::DATABASE);
        every.map(|kind| kind.name()).collect::<Vec<_>>().join(", ")
    }

    /// Parses `a,b,...` or `all`; an unknown or empty name is an error that lists the known
    /// ones.
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, FaultListError> {
        if list.trim() == EVERY_FAULT {
            return Ok(FaultKind::ALL.to_vec());
        }
        let mut kinds = Vec::new();
        for name in list.split(',').map(str::trim) {
            if name.is_empty() {
                return Err(FaultListError::Empty { list: list.to_string(), known: FaultKind::known() });
            }
            let every = FaultKind::ALL.into_iter().chain(FaultKind::REPLICAS).chain(FaultKind::DATABASE);
            let Some(kind) = every.clone().find(|kind| kind.name() == name) else {
                return Err(FaultListError::Unknown { name: name.to_string(), known: FaultKind::known() });
            };
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Ok(kinds)
    }
}

/// Why a list of fault names cannot be read; each names every known fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultListError {
    #[error("`{list}` names an empty fault (a comma too many); known: all, {known}")]
    Empty { list: String, known: String },
    #[error("unknown fault `{name}`; known: all, {known}")]
    Unknown { name: String, known: String },
}

/// How a fault is realised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "kebab-case")]
pub enum Variant {
    /// Latency on the runner → control-plane link, beyond the lease.
    Latency { latency_ms: u64 },
    /// SIGSTOP the runner for the window, then SIGCONT.
    Pause,
    /// Latency on the control plane's answers (control plane → runner) on every runner's
    /// control-plane links — on one runner's when the fault names one — below the lease: every
    /// renewal is taken in time and answered late, and so is every claim.
    SlowAnswers { latency_ms: u64 },
    /// Responses on the runner's control-plane link are lost after the server acted.
    LostResponse,
    /// A captured result request of the runner is sent again.
    Replay,
    /// A different terminal result for an attempt that already committed.
    Conflict,
    /// A runner's current claim reported as the result of another running job: a report
    /// whose fence belongs to a different job, attempt and runner than it names.
    CrossJob,
    /// Another runner's current claim reported as failed with runner `runner`'s token: a
    /// report made by a runner that does not hold the claim it names.
    Impersonate,
    /// Another runner's current claim — its job, attempt and fence — reported by runner
    /// `runner` under its own id and token: a heartbeat, a capability request and a
    /// result made under a borrowed claim.
    BorrowedClaim,
    /// Both links cut for the window; the old runner reports when they return.
    CutLinks,
    /// The runner's clock moved by `offset_ms` for the window.
    StaticSkew { offset_ms: i64 },
    /// The runner's clock jumps by `offset_ms`, and back by twice that halfway.
    Jump { offset_ms: i64 },
    /// While the runner is between two steps of an attempt, its clock jumps back by
    /// `offset_ms` (negative) and its control-plane link is cut, for the window: its
    /// renewals are lost while its wall clock says the lease has long to run.
    BackwardJump { offset_ms: i64 },
    /// The control-plane link cut while the runner is between target steps.
    ControlLink,
    /// The target link reset while a step is in flight.
    TargetLinkMidStep,
    /// The control-plane link cut while a step is held in the network for `latency_ms`:
    /// the step reaches the target after the attempt was superseded (the seed's exercise).
    DelayedStep { latency_ms: u64 },
    /// As [`Variant::DelayedStep`], held for less: the step reaches the target after its
    /// attempt's lease ended and before any newer attempt has written its key.
    LateStep { latency_ms: u64 },
    /// SIGKILL the runner; start it again when the window ends.
    KillRunner,
    /// SIGKILL the control plane and start it again on the same store.
    RestartControl,
    /// SIGKILL replica `replica` (0-based) of the control plane; start it again when the
    /// window ends. Runners fail over to the other replicas.
    KillReplica { replica: u32 },
    /// The target's clock moved by `offset_ms` (behind) for the window.
    TargetSkew { offset_ms: i64 },
    /// Replica `replica`'s clock moved by `offset_ms` for the window; when absent, the clock
    /// of the replica in use when it starts (the one its runners' links carry the most
    /// traffic to), since a replica no runner talks to decides nothing.
    ReplicaSkew {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replica: Option<u32>,
        offset_ms: i64,
    },
    /// Latency on the statements of replica `replica` (of every replica when absent) to the
    /// database (client to server).
    DbLatency {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replica: Option<u32>,
        latency_ms: u64,
    },
    /// Replica `replica`'s link to the database cut (its connections closed, new ones
    /// refused) for the window.
    DbCut { replica: u32 },
    /// Each connection of replica `replica` (of every replica when absent) to the database
    /// closed right after it sends the COMMIT of a transaction that wrote, before the answer:
    /// the transaction commits and the replica cannot know.
    CommitCut {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replica: Option<u32>,
    },
    /// The connections open on the runner's control-plane links when it starts have the
    /// control plane's side reset (an RST) and the runner's side kept open and silent for
    /// the window; new connections pass.
    ResetControlSide,
    /// As [`Variant::ResetControlSide`] with the sides swapped: the runner's side reset, the
    /// control plane's kept open and silent.
    ResetRunnerSide,
    /// The TCP packets to and from the runner's control-plane proxies dropped on loopback
    /// (iptables) for the window.
    DropPackets,
}

impl Variant {
    /// The fault of the mission this variant realises.
    pub fn kind(&self) -> FaultKind {
        match self {
            Variant::Latency { .. } | Variant::Pause | Variant::SlowAnswers { .. } => FaultKind::DelayedHeartbeats,
            Variant::LostResponse | Variant::Replay => FaultKind::DuplicateResults,
            Variant::Conflict | Variant::CrossJob | Variant::Impersonate | Variant::BorrowedClaim => {
                FaultKind::ConflictingResults
            }
            Variant::CutLinks => FaultKind::Reconnects,
            Variant::StaticSkew { .. } | Variant::Jump { .. } | Variant::BackwardJump { .. } => FaultKind::ClockSkew,
            Variant::ControlLink
            | Variant::TargetLinkMidStep
            | Variant::DelayedStep { .. }
            | Variant::LateStep { .. } => FaultKind::DisconnectDuringMutation,
            Variant::KillRunner => FaultKind::Kill,
            Variant::RestartControl => FaultKind::RestartControlPlane,
            Variant::KillReplica { .. } => FaultKind::KillReplica,
            Variant::ReplicaSkew { .. } => FaultKind::ReplicaClockSkew,
            Variant::TargetSkew { .. } => FaultKind::TargetClockSkew,
            Variant::DbLatency { .. } | Variant::DbCut { .. } | Variant::CommitCut { .. } => FaultKind::DbLink,
            Variant::ResetControlSide | Variant::ResetRunnerSide => FaultKind::HalfOpen,
            Variant::DropPackets => FaultKind::Partition,
        }
    }

    /// The replica of the control plane the variant hits, if it hits one.
    pub fn replica(&self) -> Option<u32> {
        match *self {
            Variant::KillReplica { replica } | Variant::DbCut { replica } => Some(replica),
            Variant::ReplicaSkew { replica, .. }
            | Variant::DbLatency { replica, .. }
            | Variant::CommitCut { replica } => replica,
            _ => None,
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

impl Fault {
    /// Whether the fault hits every runner at once (slow answers that name no runner).
    pub fn on_every_runner(&self) -> bool {
        self.runner.is_none() && self.variant.hits_every_runner()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleOptions {
    pub kinds: Vec<FaultKind>,
    pub time_limit_ms: u64,
    pub runners: u32,
    pub lease_ms: u64,
    /// Replicas of the control plane (1 when absent).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Variants left out, by name ([`Variant::name`]): those the system cannot take (an
    /// observed system's runners have no contract wire to replay reports on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub without: Vec<String>,
}

impl ScheduleOptions {
    /// Every variant of the options' kinds, in kind order, without those left out.
    fn variants(&self) -> Vec<Variant> {
        let kept = |variant: &&Variant| !self.without.iter().any(|name| name == variant.name());
        self.kinds.iter().flat_map(|kind| kind.variants().iter().filter(kept).cloned()).collect()
    }
}

fn one() -> u32 {
    1
}

/// Most faults in one schedule.
pub const FAULTS_MAX: usize = 10_000;

impl FaultKind {
    /// The ways this fault is realised, each a variant a run must exercise. Parameters
    /// (latencies, offsets) are placeholders that [`realise`] draws from the seed.
    pub fn variants(self) -> &'static [Variant] {
        match self {
            FaultKind::DelayedHeartbeats => {
                &[Variant::Latency { latency_ms: 0 }, Variant::Pause, Variant::SlowAnswers { latency_ms: 0 }]
            }
            FaultKind::DuplicateResults => &[Variant::LostResponse, Variant::Replay],
            FaultKind::ConflictingResults => {
                &[Variant::Conflict, Variant::CrossJob, Variant::Impersonate, Variant::BorrowedClaim]
            }
            FaultKind::Reconnects => &[Variant::CutLinks],
            FaultKind::ClockSkew => &[
                Variant::StaticSkew { offset_ms: 0 },
                Variant::Jump { offset_ms: 0 },
                Variant::BackwardJump { offset_ms: 0 },
            ],
            FaultKind::DisconnectDuringMutation => &[
                Variant::ControlLink,
                Variant::TargetLinkMidStep,
                Variant::DelayedStep { latency_ms: 0 },
                Variant::LateStep { latency_ms: 0 },
            ],
            FaultKind::Kill => &[Variant::KillRunner],
            FaultKind::RestartControlPlane => &[Variant::RestartControl],
            FaultKind::KillReplica => &[Variant::KillReplica { replica: 0 }],
            FaultKind::ReplicaClockSkew => &[Variant::ReplicaSkew { replica: None, offset_ms: 0 }],
            FaultKind::TargetClockSkew => &[Variant::TargetSkew { offset_ms: 0 }],
            FaultKind::DbLink => &[
                Variant::DbLatency { replica: None, latency_ms: 0 },
                Variant::DbCut { replica: 0 },
                Variant::CommitCut { replica: None },
            ],
            FaultKind::HalfOpen => &[Variant::ResetControlSide, Variant::ResetRunnerSide],
            FaultKind::Partition => &[Variant::DropPackets],
        }
    }
}

impl Variant {
    /// Whether the variant makes the runner's reports reach the control plane late (a
    /// `backward-jump` does too, but moves the clock itself: it never follows a skew).
    pub fn delays_reports(&self) -> bool {
        matches!(
            self,
            Variant::Latency { .. }
                | Variant::Pause
                | Variant::CutLinks
                | Variant::ControlLink
                | Variant::ResetControlSide
                | Variant::DropPackets
        )
    }

    /// Whether the variant moves a clock for a window that the lane's next fault falls
    /// inside (a skew, a runner's or the target's: a skewed clock matters when something
    /// comes late). A `backward-jump` cuts the runner's link itself and overlaps nothing.
    pub fn skews(&self) -> bool {
        matches!(self, Variant::StaticSkew { .. } | Variant::Jump { .. } | Variant::TargetSkew { .. })
    }

    /// Whether the variant hits every runner when its fault names none (slow answers).
    pub fn hits_every_runner(&self) -> bool {
        matches!(self, Variant::SlowAnswers { .. })
    }

    /// Whether the variant tests the runner's own rules — its renewal deadline against a
    /// renewal answered late, or a wall clock moved back while its renewals are lost — and
    /// is dealt early in each round, after the target's skew, so that every run has it.
    pub fn tests_runner(&self) -> bool {
        matches!(self, Variant::SlowAnswers { .. } | Variant::BackwardJump { .. })
    }

    /// Whether the variant is dealt early in each round, after the target's skew, so that
    /// every run has it: the faults on the runner's own rules, and the late step, the one
    /// fault whose step reaches the target just after its lease ended (a capability that
    /// outlives its lease, or whose expiry the target judges coarsely, shows nowhere else).
    pub fn dealt_early(&self) -> bool {
        self.tests_runner() || matches!(self, Variant::LateStep { .. })
    }

    /// The variant's name, as `schedule.json` writes it (`how`).
    pub fn name(&self) -> &'static str {
        match self {
            Variant::Latency { .. } => "latency",
            Variant::Pause => "pause",
            Variant::SlowAnswers { .. } => "slow-answers",
            Variant::LostResponse => "lost-response",
            Variant::Replay => "replay",
            Variant::Conflict => "conflict",
            Variant::CrossJob => "cross-job",
            Variant::Impersonate => "impersonate",
            Variant::BorrowedClaim => "borrowed-claim",
            Variant::CutLinks => "cut-links",
            Variant::StaticSkew { .. } => "static-skew",
            Variant::Jump { .. } => "jump",
            Variant::BackwardJump { .. } => "backward-jump",
            Variant::ControlLink => "control-link",
            Variant::TargetLinkMidStep => "target-link-mid-step",
            Variant::DelayedStep { .. } => "delayed-step",
            Variant::LateStep { .. } => "late-step",
            Variant::KillRunner => "kill-runner",
            Variant::RestartControl => "restart-control",
            Variant::KillReplica { .. } => "kill-replica",
            Variant::ReplicaSkew { .. } => "replica-skew",
            Variant::TargetSkew { .. } => "target-skew",
            Variant::DbLatency { .. } => "db-latency",
            Variant::DbCut { .. } => "db-cut",
            Variant::CommitCut { .. } => "commit-cut",
            Variant::ResetControlSide => "reset-control-side",
            Variant::ResetRunnerSide => "reset-runner-side",
            Variant::DropPackets => "drop-packets",
        }
    }
}

/// How many faults run at once: one lane of sequential faults for every two runners
/// (rounded up), each lane over its own runners, so a run with more runners has more of
/// them faulted at any moment.
pub fn lanes(runners: u32) -> u32 {
    runners.div_ceil(2).max(1)
}

/// Lanes of sequential fault windows, each separated by a gap of one to one and a half
/// leases. The variants of the chosen kinds are dealt in seeded rounds across the lanes,
/// earliest lane first, so that every variant appears once before any appears twice.
pub fn schedule(seed: u64, options: &ScheduleOptions) -> Vec<Fault> {
    let (replica_kinds, runner_kinds): (Vec<FaultKind>, Vec<FaultKind>) =
        options.kinds.iter().partition(|kind| kind.on_replicas());
    let mut faults = runner_lanes(seed, &ScheduleOptions { kinds: runner_kinds, ..options.clone() });
    faults.extend(replica_lane(seed, &ScheduleOptions { kinds: replica_kinds, ..options.clone() }));
    faults.sort_by_key(|fault| fault.at_ms);
    faults
}

impl FaultKind {
    /// Whether the fault hits one replica of the control plane (or its database link)
    /// rather than a runner: such faults run in a lane of their own.
    pub fn on_replicas(self) -> bool {
        FaultKind::REPLICAS.contains(&self) || FaultKind::DATABASE.contains(&self)
    }

    /// Whether the fault hits one runner: not the control plane's restart, a fault on
    /// replicas, or the target's clock (which a schedule still deals into a runner's lane).
    pub fn on_runner(self) -> bool {
        !(self == FaultKind::RestartControlPlane || self.on_replicas() || self == FaultKind::TargetClockSkew)
    }
}

/// The faults on replicas: one lane of its own beside the runners' lanes, its variants
/// dealt in seeded rounds like theirs, one to one and a half leases apart.
fn replica_lane(seed: u64, options: &ScheduleOptions) -> Vec<Fault> {
    let mut rng = crate::rng(seed, "replica-faults");
    let lease_ms = options.lease_ms.max(1);
    let mut at_ms = 2 * lease_ms + lease_ms / 10;
    let mut faults = Vec::new();
    let mut round: Vec<Variant> = Vec::new();
    while !options.kinds.is_empty() && faults.len() < FAULTS_MAX {
        if round.is_empty() {
            round = options.variants();
            round.shuffle(&mut rng);
        }
        let variant = round.pop().expect("a round is refilled when empty");
        let fault = realise(&mut rng, &variant, at_ms, 0, 1, options);
        if fault.at_ms + fault.duration_ms >= options.time_limit_ms {
            break;
        }
        at_ms = fault.at_ms + fault.duration_ms + rng.gen_range(lease_ms..=lease_ms * 3 / 2);
        faults.push(fault);
    }
    faults
}

/// The faults on runners (and the control plane's restart): see [`schedule`].
fn runner_lanes(seed: u64, options: &ScheduleOptions) -> Vec<Fault> {
    let mut rng = crate::rng(seed, "faults");
    let lease_ms = options.lease_ms.max(1);
    let lanes = lanes(options.runners);
    // Lane i starts a fifth of a lease after lane i - 1, so the lanes do not move in step.
    let mut next_ms: Vec<u64> = (0..u64::from(lanes)).map(|lane| 2 * lease_ms + lane * lease_ms / 5).collect();
    let mut last: Vec<Option<Fault>> = vec![None; lanes as usize];
    let mut open: Vec<bool> = vec![true; lanes as usize];
    let mut faults = Vec::new();
    let mut round: Vec<Variant> = Vec::new();
    while !options.kinds.is_empty() && faults.len() < FAULTS_MAX {
        let Some(lane) = (0..lanes as usize).filter(|&lane| open[lane]).min_by_key(|&lane| (next_ms[lane], lane))
        else {
            break;
        };
        if round.is_empty() {
            round = options.variants();
            round.shuffle(&mut rng);
            // The target's skew, the longest window, opens the round: dealt late it would
            // not fit in what is left of the run. The variants dealt early come next, a
            // backward jump first, before slow answers (which hit every runner and would slow
            // the steps it waits for): dealt late, a short run would miss them.
            round.sort_by_key(|variant| {
                let backward = matches!(variant, Variant::BackwardJump { .. });
                (matches!(variant, Variant::TargetSkew { .. }), variant.dealt_early(), backward)
            });
        }
        // A skewed clock matters when something comes late: inside a runner's skew window,
        // the lane's next fault is one that delays the runner's reports; inside the target's,
        // one that delays a step; when the round has one.
        let skewed = last[lane].as_ref().filter(|last| overlaps_next(last, next_ms[lane])).map(|last| last.kind);
        let delaying = round.iter().rposition(|variant| match skewed {
            Some(FaultKind::TargetClockSkew) => matches!(variant, Variant::DelayedStep { .. }),
            Some(_) => variant.delays_reports(),
            None => false,
        });
        let variant = match (delaying, skewed) {
            (Some(position), _) => round.remove(position),
            // The target's skew exists for its delayed step: one is dealt beyond the round.
            (None, Some(FaultKind::TargetClockSkew)) => Variant::DelayedStep { latency_ms: 0 },
            (None, _) => round.pop().expect("a round is refilled when empty"),
        };
        let mut fault = realise(&mut rng, &variant, next_ms[lane], lane as u32, lanes, options);
        let fits = |fault: &Fault| fault.at_ms + fault.duration_ms < options.time_limit_ms;
        if fits(&fault) && fault.kind == FaultKind::TargetClockSkew && clashes(&fault, &faults) {
            // The target's skew waits for the window in its way (it comes next on this lane).
            let blocking = faults.iter().filter(|other| clashes(other, std::slice::from_ref(&fault)));
            next_ms[lane] = blocking.map(|other| other.at_ms + other.duration_ms).max().unwrap_or(next_ms[lane]);
            round.push(variant);
            continue;
        }
        if !fits(&fault) || clashes(&fault, &faults) {
            // Too long for what is left of the run (or blind where it falls): another variant
            // of the round may fit (the lane closes when none fits at all).
            round.push(variant);
            let try_at = next_ms[lane];
            let realised = |variant: &Variant| realise(&mut rng.clone(), variant, try_at, lane as u32, lanes, options);
            let good = |round: &[Variant]| {
                round.iter().rposition(|variant| {
                    let fault = realised(variant);
                    fits(&fault) && !clashes(&fault, &faults)
                })
            };
            let mut position = good(&round);
            if position.is_none() {
                // Nothing left of the round fits here (too long for what is left of the run, or
                // blind where it falls): the next round is dealt beside it, so that a round of
                // long windows does not close a lane that a short variant could still use.
                let mut next: Vec<Variant> = options.variants();
                next.shuffle(&mut rng.clone());
                round.splice(0..0, next);
                position = good(&round);
            }
            let Some(position) = position else {
                open[lane] = false;
                continue;
            };
            let other = round.remove(position);
            fault = realise(&mut rng, &other, next_ms[lane], lane as u32, lanes, options);
        }
        if let Some(skewed) = last[lane].as_ref().filter(|last| overlaps_next(last, next_ms[lane])) {
            fault.runner = skewed.runner.or(fault.runner);
        }
        next_ms[lane] = match fault.kind {
            // A skewed clock matters when reports come late: the next fault starts inside
            // the skew window, on the same runner.
            _ if fault.variant.skews() => fault.at_ms + lease_ms,
            // A fault on every runner (slow answers) takes no lane: the lane's next fault
            // starts a lease into it.
            _ if fault.on_every_runner() => fault.at_ms + lease_ms,
            // A one-off report leaves nothing to recover from: the next comes soon after.
            _ if fault.duration_ms == 0 => fault.at_ms + rng.gen_range(lease_ms / 4..=lease_ms / 2),
            _ => fault.at_ms + fault.duration_ms + rng.gen_range(lease_ms..=lease_ms * 3 / 2),
        };
        last[lane] = Some(fault.clone());
        faults.push(fault);
    }
    faults.sort_by_key(|fault| fault.at_ms);
    faults
}

/// Whether `fault` would be blind beside the faults already placed: a late step is judged
/// by the target against its capability's expiry, on the target's clock, so it must not
/// overlap a window in which the target's clock is moved (nor a target skew a late step, or
/// another target skew).
fn clashes(fault: &Fault, placed: &[Fault]) -> bool {
    let late_step = |fault: &Fault| matches!(fault.variant, Variant::LateStep { .. });
    let target_skew = |fault: &Fault| fault.kind == FaultKind::TargetClockSkew;
    let overlap = |a: &Fault, b: &Fault| a.at_ms < b.at_ms + b.duration_ms && b.at_ms < a.at_ms + a.duration_ms;
    placed.iter().any(|other| {
        let blind = (late_step(fault) && target_skew(other)) || (target_skew(fault) && late_step(other));
        // The target has one clock: two moves of it at once would undo each other.
        (blind || (target_skew(fault) && target_skew(other))) && overlap(fault, other)
    })
}

/// Whether `last` is a clock skew (a runner's or the target's) still in effect when the
/// next fault starts at `at_ms`.
fn overlaps_next(last: &Fault, at_ms: u64) -> bool {
    last.variant.skews() && at_ms < last.at_ms + last.duration_ms
}

/// The fault for `variant` at `at_ms` in `lane`: its duration, its runner (one of the
/// lane's: runners `lane`, `lane + lanes`, ...) and its drawn parameters.
fn realise(
    rng: &mut impl Rng,
    variant: &Variant,
    at_ms: u64,
    lane: u32,
    lanes: u32,
    options: &ScheduleOptions,
) -> Fault {
    let lease_ms = options.lease_ms.max(1);
    let owned = options.runners.max(1).saturating_sub(lane).div_ceil(lanes).max(1);
    let runner = Some(lane + lanes * rng.gen_range(0..owned));
    let skew_ms = rng.gen_range(30_000..=180_000i64) * if rng.gen_bool(0.5) { 1 } else { -1 };
    let replicas = options.replicas.max(1);
    let replica_of = |rng: &mut _| Rng::gen_range(rng, 0..replicas);
    let (duration_ms, runner, variant) = match variant {
        Variant::Latency { .. } => (3 * lease_ms, runner, Variant::Latency { latency_ms: lease_ms * 3 / 2 }),
        Variant::Pause => (2 * lease_ms, runner, Variant::Pause),
        // On every runner, so that claims answered late come whoever wins the queue's jobs.
        // Over half a lease, so that a claim's answer and its first capability's together
        // outlast the lease; under the lease less a heartbeat interval, so that renewals
        // still reach the control plane in time and no lease lapses there. Four leases: a
        // runner busy when it starts loses its authority about a lease in, reports (0.6 lease)
        // and claims again about two leases in, and that claim's capability is still answered
        // late; in three leases that second claim was often answered at the heal.
        Variant::SlowAnswers { .. } => (4 * lease_ms, None, Variant::SlowAnswers { latency_ms: lease_ms * 3 / 5 }),
        Variant::LostResponse => (lease_ms / 2, runner, Variant::LostResponse),
        Variant::Replay => (0, runner, Variant::Replay),
        Variant::Conflict => (0, runner, Variant::Conflict),
        Variant::CrossJob => (0, runner, Variant::CrossJob),
        Variant::Impersonate => (0, runner, Variant::Impersonate),
        Variant::BorrowedClaim => (0, runner, Variant::BorrowedClaim),
        Variant::CutLinks => (3 * lease_ms, runner, Variant::CutLinks),
        Variant::StaticSkew { .. } => (4 * lease_ms, runner, Variant::StaticSkew { offset_ms: skew_ms }),
        Variant::Jump { .. } => (4 * lease_ms, runner, Variant::Jump { offset_ms: skew_ms }),
        Variant::BackwardJump { .. } => (2 * lease_ms, runner, Variant::BackwardJump { offset_ms: -skew_ms.abs() }),
        Variant::ControlLink => (2 * lease_ms, runner, Variant::ControlLink),
        Variant::TargetLinkMidStep => (lease_ms, runner, Variant::TargetLinkMidStep),
        // The step is held until a newer attempt wrote its key (at most 5 leases): its lease
        // ends about 1.5 leases in, the job is reconciled a lease or more later, and retried.
        Variant::DelayedStep { .. } => (6 * lease_ms, runner, Variant::DelayedStep { latency_ms: 5 * lease_ms }),
        // The step is held until its lease ended (about 1.5 leases in; at most 2 leases), and
        // lands before the job is reconciled a lease or more later.
        Variant::LateStep { .. } => (4 * lease_ms, runner, Variant::LateStep { latency_ms: 2 * lease_ms }),
        Variant::KillRunner => (2 * lease_ms, runner, Variant::KillRunner),
        Variant::RestartControl => (lease_ms / 2, None, Variant::RestartControl),
        // Behind, so that an expired capability looks live to the target.
        // Its delayed step starts a lease in and is released at most 6 leases in.
        Variant::TargetSkew { .. } => (8 * lease_ms, None, Variant::TargetSkew { offset_ms: -skew_ms.abs() }),
        Variant::KillReplica { .. } => (2 * lease_ms, None, Variant::KillReplica { replica: replica_of(rng) }),
        Variant::ReplicaSkew { .. } => (4 * lease_ms, None, Variant::ReplicaSkew { replica: None, offset_ms: skew_ms }),
        // A statement slowed by a twelfth of a lease: a rule transaction of a few round
        // trips then lasts about half a lease, and a heartbeat's spans its lease's end. On
        // every replica's link, so that whichever replica a busy runner uses is slowed.
        Variant::DbLatency { .. } => {
            (3 * lease_ms, None, Variant::DbLatency { replica: None, latency_ms: lease_ms / 12 })
        }
        Variant::DbCut { .. } => (lease_ms, None, Variant::DbCut { replica: replica_of(rng) }),
        // On every replica's link, since runners move between replicas as they fail over:
        // held until it has cut eight COMMITs of writes (claims, reports, submits, sweeps), at most 3 leases.
        Variant::CommitCut { .. } => (3 * lease_ms, None, Variant::CommitCut { replica: None }),
        Variant::ResetControlSide => (3 * lease_ms, runner, Variant::ResetControlSide),
        Variant::ResetRunnerSide => (3 * lease_ms, runner, Variant::ResetRunnerSide),
        Variant::DropPackets => (3 * lease_ms, runner, Variant::DropPackets),
    };
    Fault { at_ms, duration_ms, kind: variant.kind(), runner, variant }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(kinds: Vec<FaultKind>) -> ScheduleOptions {
        ScheduleOptions { kinds, time_limit_ms: 60_000, runners: 3, lease_ms: 1_000, replicas: 1, without: vec![] }
    }

    #[test]
    fn variants_left_out_are_never_dealt_and_the_rest_still_are() {
        let left_out = ["replay", "conflict", "delayed-step", "target-skew"];
        let options = ScheduleOptions { without: left_out.map(str::to_string).to_vec(), ..default_run() };
        let names: std::collections::BTreeSet<&str> =
            schedule(5, &options).iter().map(|fault| fault.variant.name()).collect();
        assert!(left_out.iter().all(|name| !names.contains(name)), "{names:?}");
        assert!(names.contains("cut-links") && names.contains("lost-response"), "{names:?}");
        let all: std::collections::BTreeSet<&str> =
            schedule(5, &default_run()).iter().map(|fault| fault.variant.name()).collect();
        assert!(left_out.iter().all(|name| all.contains(name)), "{all:?}");
    }

    /// The default run's schedule options: every fault, 30 s, 3 runners, 1 s leases.
    fn default_run() -> ScheduleOptions {
        ScheduleOptions {
            kinds: FaultKind::ALL.to_vec(),
            time_limit_ms: 30_000,
            runners: 3,
            lease_ms: 1_000,
            replicas: 1,
            without: vec![],
        }
    }

    #[test]
    fn same_seed_same_schedule_and_another_seed_another() {
        let all = options(FaultKind::ALL.to_vec());
        assert_eq!(schedule(11, &all), schedule(11, &all));
        assert_ne!(schedule(11, &all), schedule(12, &all));
    }

    /// The faults of each lane, in time order (a lane's faults hit only its runners; the
    /// control plane's restart is placed in the lane whose turn it was).
    fn by_lane(faults: &[Fault], lanes: u32) -> Vec<Vec<Fault>> {
        let mut by_lane = vec![Vec::new(); lanes as usize];
        let mut last_lane = 0;
        for fault in faults {
            let lane = fault.runner.map_or(last_lane, |runner| runner % lanes);
            by_lane[lane as usize].push(fault.clone());
            last_lane = lane;
        }
        by_lane
    }

    #[test]
    fn every_chosen_kind_appears_and_in_a_lane_only_clock_skew_overlaps_the_next_fault() {
        let faults = schedule(5, &options(FaultKind::ALL.to_vec()));
        for kind in FaultKind::ALL {
            assert!(faults.iter().any(|fault| fault.kind == kind), "{kind:?} missing from {faults:?}");
        }
        assert!(faults.windows(2).all(|pair| pair[0].at_ms <= pair[1].at_ms), "in time order");
        for lane in by_lane(&faults, lanes(3)) {
            let lane: Vec<&Fault> = lane.iter().filter(|fault| fault.runner.is_some()).collect();
            for pair in lane.windows(2) {
                if pair[0].variant.skews() {
                    assert!(
                        pair[1].at_ms < pair[0].at_ms + pair[0].duration_ms,
                        "the next fault falls inside the skew"
                    );
                    assert_eq!(pair[0].runner, pair[1].runner, "on the skewed runner");
                } else {
                    assert!(pair[0].at_ms + pair[0].duration_ms < pair[1].at_ms, "{pair:?}");
                }
            }
        }
        assert!(faults.iter().all(|fault| fault.at_ms + fault.duration_ms < 60_000));
        assert!(faults.iter().all(|fault| fault.runner.is_none_or(|runner| runner < 3)));
    }

    #[test]
    fn inside_a_skew_window_the_next_fault_delays_the_skewed_runners_reports() {
        let mut delayed = 0;
        let mut skews = 0;
        for seed in 0..20 {
            let faults = schedule(seed, &options(FaultKind::ALL.to_vec()));
            for skew in faults.iter().filter(|fault| fault.kind == FaultKind::ClockSkew && fault.variant.skews()) {
                skews += 1;
                let inside = faults.iter().filter(|f| f.runner == skew.runner && f.at_ms > skew.at_ms);
                let next = inside.min_by_key(|f| f.at_ms).filter(|f| f.at_ms < skew.at_ms + skew.duration_ms);
                delayed += usize::from(next.is_some_and(|next| next.variant.delays_reports()));
            }
        }
        assert!(delayed * 10 >= skews * 8, "{delayed} of {skews} skews are followed by a delay on their runner");
    }

    #[test]
    fn a_late_step_never_overlaps_the_targets_skew_and_a_delayed_step_falls_inside_it() {
        let default = default_run();
        let (mut skews, mut paired) = (0, 0);
        for seed in 0..50 {
            let faults = schedule(seed, &default);
            let late = faults.iter().filter(|fault| matches!(fault.variant, Variant::LateStep { .. }));
            for skew in faults.iter().filter(|fault| fault.kind == FaultKind::TargetClockSkew) {
                skews += 1;
                let end_ms = skew.at_ms + skew.duration_ms;
                for late in late.clone() {
                    let apart = late.at_ms + late.duration_ms <= skew.at_ms || end_ms <= late.at_ms;
                    assert!(apart, "seed {seed}: {late:?} overlaps {skew:?}");
                }
                let delayed = faults.iter().filter(|fault| matches!(fault.variant, Variant::DelayedStep { .. }));
                let ok = delayed.clone().any(|d| d.at_ms > skew.at_ms && d.at_ms + d.duration_ms <= end_ms);
                paired += usize::from(ok);
            }
        }
        assert!(paired * 10 >= skews * 9, "{paired} of {skews} target skews hold a whole delayed step");
    }

    /// Since `half-open` and `partition` (three 3-lease windows) and then `slow-answers` and
    /// `backward-jump` joined `all`, a 30-second run deals 21.6 of the 23 variants on average (a
    /// long skew is missing most often: it gives way to a shorter variant near the end); 36
    /// seconds hold them all (100 seeds measured), so the run that must deal every variant
    /// is 36 seconds long.
    #[test]
    fn a_36_second_run_exercises_every_variant() {
        let longer = ScheduleOptions { time_limit_ms: 36_000, ..default_run() };
        let names: Vec<&str> = FaultKind::ALL.iter().flat_map(|kind| kind.variants()).map(Variant::name).collect();
        assert_eq!(names.len(), 23);
        for seed in 0..20 {
            let faults = schedule(seed, &longer);
            for name in &names {
                assert!(faults.iter().any(|fault| fault.variant.name() == *name), "seed {seed}: no {name}: {faults:?}");
            }
        }
    }

    /// The faults on a runner's own rules are dealt right after the target's skew, a backward
    /// jump before slow answers: every default run has them, a 12-second one too; a
    /// `backward-jump` always moves the clock back,
    /// and slow answers hit every runner, taking no lane's time beyond their first lease.
    #[test]
    fn every_default_run_tests_the_runners_own_rules() {
        for seed in 0..50 {
            for time_limit_ms in [12_000, 30_000] {
                let faults = schedule(seed, &ScheduleOptions { time_limit_ms, ..default_run() });
                let first = |name: &str| faults.iter().position(|fault| fault.variant.name() == name);
                let (jump, slow) = (first("backward-jump"), first("slow-answers"));
                assert!(jump.is_some() && slow.is_some(), "seed {seed}, {time_limit_ms} ms: {faults:?}");
                assert!(jump < slow, "seed {seed}: the backward jump comes before the slow answers");
                for fault in &faults {
                    match fault.variant {
                        Variant::BackwardJump { offset_ms } => assert!(offset_ms <= -30_000, "{fault:?}"),
                        Variant::SlowAnswers { .. } => {
                            assert!(fault.on_every_runner(), "{fault:?}");
                            let next = faults.iter().find(|next| next.at_ms > fault.at_ms && next.runner.is_some());
                            let next = next.expect("a fault follows");
                            assert!(next.at_ms < fault.at_ms + fault.duration_ms, "overlapped: {next:?}");
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// The late step is dealt early too: every default 30-second run has one, never beside
    /// a move of the target's clock (a 30-second run dealt none in 1 of 10 seeds when it
    /// came in the round's shuffled order).
    #[test]
    fn every_default_run_has_a_late_step() {
        for seed in 0..100 {
            let faults = schedule(seed, &default_run());
            let late = faults.iter().find(|fault| matches!(fault.variant, Variant::LateStep { .. }));
            let late = late.unwrap_or_else(|| panic!("seed {seed}: no late step: {faults:?}"));
            assert!(late.at_ms + late.duration_ms < default_run().time_limit_ms, "{late:?}");
        }
    }

    /// A scenario's `slow-answers` step that names no runner hits every runner; one that
    /// names a runner, that runner; another runner's fault still needs one.
    #[test]
    fn a_slow_answers_step_without_a_runner_hits_every_runner() {
        let step = |how: &str, runner: Option<&str>, latency_ms: Option<u64>| crate::scenario::Action::Fault {
            fault: None,
            how: how.into(),
            runner: runner.map(str::to_string),
            replica: None,
            duration_ms: 1_000,
            latency_ms,
            offset_ms: None,
        };
        let every = crate::scenario::fault_of(&step("slow-answers", None, Some(600)), 5, 3).unwrap();
        assert!(every.on_every_runner() && every.kind == FaultKind::DelayedHeartbeats, "{every:?}");
        let one = crate::scenario::fault_of(&step("slow-answers", Some("r2"), Some(600)), 5, 3).unwrap();
        assert_eq!((one.runner, one.on_every_runner()), (Some(1), false));
        let cut = crate::scenario::fault_of(&step("cut-links", None, None), 5, 3).unwrap_err().to_string();
        assert!(cut.contains("needs a runner"), "{cut}");
    }

    #[test]
    fn replica_faults_run_in_a_lane_of_their_own_and_a_default_run_has_every_variant() {
        let kinds: Vec<FaultKind> =
            FaultKind::ALL.into_iter().chain(FaultKind::REPLICAS).chain(FaultKind::DATABASE).collect();
        let options =
            ScheduleOptions { kinds, time_limit_ms: 36_000, runners: 3, lease_ms: 1_000, replicas: 3, without: vec![] };
        let runner_only = ScheduleOptions { kinds: FaultKind::ALL.to_vec(), ..options.clone() };
        let names: Vec<&str> = options.kinds.iter().flat_map(|kind| kind.variants()).map(Variant::name).collect();
        assert_eq!(names.len(), 28);
        for seed in 0..20 {
            let faults = schedule(seed, &options);
            for name in &names {
                assert!(faults.iter().any(|fault| fault.variant.name() == *name), "seed {seed}: no {name}");
            }
            let on_replicas: Vec<&Fault> = faults.iter().filter(|fault| fault.kind.on_replicas()).collect();
            assert!(on_replicas.iter().all(|fault| fault.runner.is_none() && fault.variant.replica() < Some(3)));
            for pair in on_replicas.windows(2) {
                assert!(pair[0].at_ms + pair[0].duration_ms < pair[1].at_ms, "one at a time: {pair:?}");
            }
            let on_runners: Vec<Fault> = faults.into_iter().filter(|fault| !fault.kind.on_replicas()).collect();
            assert_eq!(on_runners, schedule(seed, &runner_only), "the runners' lanes are as without replicas");
        }
    }

    #[test]
    fn more_runners_have_more_faults_at_once() {
        let at_once = |runners: u32| {
            let options = ScheduleOptions {
                kinds: FaultKind::ALL.to_vec(),
                time_limit_ms: 30_000,
                runners,
                lease_ms: 1_000,
                replicas: 1,
                without: vec![],
            };
            let faults = schedule(3, &options);
            let busiest = (0..30_000u64)
                .step_by(100)
                .map(|ms| faults.iter().filter(|f| f.at_ms <= ms && ms < f.at_ms + f.duration_ms).count())
                .max()
                .unwrap_or(0);
            let runners_hit = faults.iter().filter_map(|fault| fault.runner).collect::<std::collections::BTreeSet<_>>();
            // The count over six seeds: one seed's lanes may wait long on the target's one clock.
            let count: usize = (0..6).map(|seed| schedule(seed, &options).len()).sum();
            (count, busiest, runners_hit.len())
        };
        let (few, few_at_once, _) = at_once(3);
        let (many, many_at_once, hit) = at_once(48);
        // 24 lanes against 2: well over eight times the faults (one-off faults of no
        // duration let a short lane hold a few more; a lane that waits for the target's
        // clock, which two skews never move at once, holds fewer).
        assert!(many >= 8 * few, "48 runners: {many} faults, 3 runners: {few}");
        assert!(many_at_once >= 12 && many_at_once > 4 * few_at_once, "{many_at_once} vs {few_at_once} at once");
        assert!(hit >= 40, "48 runners: only {hit} were ever faulted");
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
    fn a_stored_schedule_with_the_link_faults_reads_back_as_written() {
        let stored = [
            r#"{"at_ms":1500,"duration_ms":3000,"kind":"half-open","runner":0,"variant":{"how":"reset-control-side"}}"#,
            r#"{"at_ms":2000,"duration_ms":3000,"kind":"half-open","runner":1,"variant":{"how":"reset-runner-side"}}"#,
            r#"{"at_ms":6000,"duration_ms":3000,"kind":"partition","runner":0,"variant":{"how":"drop-packets"}}"#,
        ];
        let text = format!("[{}]", stored.join(","));
        let faults: Vec<Fault> = serde_json::from_str(&text).unwrap();
        let variants: Vec<&Variant> = faults.iter().map(|fault| &fault.variant).collect();
        assert_eq!(variants, [&Variant::ResetControlSide, &Variant::ResetRunnerSide, &Variant::DropPackets]);
        assert!(faults.iter().all(|fault| fault.variant.kind() == fault.kind));
        assert_eq!(serde_json::to_string(&faults).unwrap(), text, "written back the same");
    }

    #[test]
    fn fault_lists_parse_and_unknown_names_are_named() {
        assert_eq!(FaultKind::parse_list("all").unwrap().len(), 11);
        assert_eq!(
            FaultKind::parse_list("kill, reconnects,kill").unwrap(),
            vec![FaultKind::Kill, FaultKind::Reconnects]
        );
        let error = FaultKind::parse_list("kill,earthquake").unwrap_err();
        assert!(
            matches!(&error, FaultListError::Unknown { name, known } if name == "earthquake" && known.contains("clock-skew"))
        );
        assert!(error.to_string().starts_with("unknown fault `earthquake`; known: all, "), "{error}");
        for list in ["kill,,reconnects", "kill,", ",kill"] {
            let error = FaultKind::parse_list(list).unwrap_err();
            assert!(matches!(&error, FaultListError::Empty { list: named, .. } if named == list), "{error}");
            assert!(error.to_string().contains("empty fault"), "{error}");
        }
    }
}
