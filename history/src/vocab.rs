//! The typed vocabulary of a history: who recorded an event, which operation it is, and
//! the protocol codes its decision, reason, outcome and `recorded_as` may carry.
//!
//! Every word a history may hold is a variant here, and a word that is not one is an
//! error that names the line, never an "other" that a checker then skips: a history that
//! speaks a dialect fencelab does not know must make a verdict unknown, not valid. Serde
//! names keep the JSONL text exactly what it was when these fields were strings.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A word the history's vocabulary does not hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WordError {
    #[error("unknown {field} `{word}` (known: {known})")]
    Unknown { field: String, word: String, known: String },
    #[error("a runner's process needs an id after `runner:`")]
    NoRunnerId,
}

impl WordError {
    /// `word` is not one of `known` words for `field`.
    pub fn unknown<'a>(field: &str, word: &str, known: impl IntoIterator<Item = &'a str>) -> WordError {
        let known: Vec<&str> = known.into_iter().collect();
        WordError::Unknown { field: field.to_string(), word: word.to_string(), known: known.join(", ") }
    }
}

/// Reads a string through `parse` where it lies, without a copy (serde's `Cow<str>` always
/// copies): every event holds two (its op and its process), and their copies were about
/// 1.5% of the time of `fencelab check` at 10^7 events.
pub(crate) fn word<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    parse: impl FnOnce(&str) -> Result<T, WordError>,
) -> Result<T, D::Error> {
    struct Word<F>(F);
    impl<'de, T, F: FnOnce(&str) -> Result<T, WordError>> serde::de::Visitor<'de> for Word<F> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<T, E> {
            (self.0)(word).map_err(E::custom)
        }
    }
    deserializer.deserialize_str(Word(parse))
}

/// Declares a closed word list: an enum, its wire names, `as_str`, `parse`, `ALL` and
/// serde through those names (so an unknown word fails with the list of known ones).
macro_rules! words {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $word:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The word as it is written in a history.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }

            /// The variant a word names; `None` for a word this vocabulary does not hold.
            pub fn parse(word: &str) -> Option<$name> {
                match word {
                    $($word => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                $crate::vocab::word(deserializer, |word| {
                    $name::parse(word).ok_or_else(|| {
                        $crate::vocab::WordError::unknown(
                            &stringify!($name).to_lowercase(),
                            word,
                            $name::ALL.iter().map(|v| v.as_str()),
                        )
                    })
                })
            }
        }
    };
}

words! {
    /// How the deployment target treats a step's fence: `fenced` refuses a fence lower than
    /// the highest it applied on the key, `idempotent` also refuses one step applied twice,
    /// `unfenced` applies everything (the residual risk, named).
    TargetMode {
        Fenced = "fenced",
        Idempotent = "idempotent",
        Unfenced = "unfenced",
    }
}

impl std::str::FromStr for TargetMode {
    type Err = WordError;

    /// A mode by its word, as `--target-mode`, a scenario's `target_mode` and `config.json`
    /// write it.
    fn from_str(word: &str) -> Result<TargetMode, WordError> {
        TargetMode::parse(word)
            .ok_or_else(|| WordError::unknown("target mode", word, TargetMode::ALL.iter().map(|mode| mode.as_str())))
    }
}

words! {
    /// The operation of an event (its `f`).
    Op {
        /// A job submitted (client) or recorded (ledger).
        Submit = "submit",
        /// A runner's claim, or the ledger's grant of one.
        Claim = "claim",
        Heartbeat = "heartbeat",
        Capability = "capability",
        Result = "result",
        /// A target step: the runner's call, or the target's step log.
        Step = "step",
        /// The control plane ended a lease on its own clock.
        Expire = "expire",
        /// The operator's finding about an uncertain attempt.
        Reconcile = "reconcile",
        /// The run's whole configuration, first in every run's history.
        Config = "config",
        /// One job's final state after recovery.
        Final = "final",
        /// One round of the operator's loop (recorded only when it fails).
        Round = "round",
        /// The operator stops an old execution (SIGSTOP) before reconciling it.
        Freeze = "freeze",
        /// The operator lets a stopped execution go after its reconcile.
        Thaw = "thaw",
        /// The nemesis heals every fault at the end of a run.
        HealAll = "heal-all",
        /// A runner process the harness found exited on its own (no fault killed it) when
        /// the run ended; `reason` is its exit status.
        RunnerExited = "runner-exited",
        /// Evidence the harness could not read (a source's line outside the vocabulary);
        /// `reason` says which source and line. Any such event makes a verdict unknown.
        Unreadable = "unreadable",
        /// The sources of evidence the history holds (`value.sources`, [`Source`] words),
        /// declared by whoever assembled it; without one they are read off its events.
        Sources = "sources",
        /// The end of a run's recovery: `ok` when every job settled within the recovery
        /// limit, `info` when some did not (`reason` names them): the run is incomplete,
        /// and a job left unsettled is not judged lost.
        Recovery = "recovery",
        /// The chaos phase ended before its time limit at the first anomaly the live records
        /// showed (`--stop-at-first`); `reason` names it. Recovery and the whole check follow.
        StopAtFirst = "stop-at-first",
        DelayedHeartbeats = "delayed-heartbeats",
        DuplicateResults = "duplicate-results",
        ConflictingResults = "conflicting-results",
        Reconnects = "reconnects",
        ClockSkew = "clock-skew",
        DisconnectDuringMutation = "disconnect-during-mutation",
        Kill = "kill",
        RestartControlPlane = "restart-control-plane",
        KillReplica = "kill-replica",
        ReplicaClockSkew = "replica-clock-skew",
        DbLink = "db-link",
        TargetClockSkew = "target-clock-skew",
        HalfOpen = "half-open",
        Partition = "partition",
    }
}

impl Op {
    /// A report a runner makes under a claim: judged by the control plane and ledgered.
    pub fn is_report(self) -> bool {
        matches!(self, Op::Heartbeat | Op::Capability | Op::Result)
    }
}

words! {
    /// A protocol code saying why a report or step was not accepted (the `reason` of a
    /// decided event). Other events may carry free text in `reason` (an error's message).
    Reason {
        /// No such job, attempt or runner.
        Unknown = "unknown",
        /// The claim is not the job's current one in an active state.
        NotCurrent = "not_current",
        /// A newer attempt holds the job.
        Superseded = "superseded",
        /// The lease (or a capability) ended on the server's clock.
        Expired = "expired",
        /// A different terminal result for an attempt that already committed.
        Conflict = "conflict",
        /// The target saw a higher fence for the deployment key.
        StaleFence = "stale_fence",
        /// A capability whose signature does not verify.
        BadSignature = "bad_signature",
        /// The target already applied this step of this attempt.
        Duplicate = "duplicate",
    }
}

words! {
    /// How the ledger recorded an entry (`value.recorded_as`).
    RecordedAs {
        /// A result refused as current and kept.
        LateObservation = "late_observation",
        /// A different terminal result, refused and kept.
        Conflict = "conflict",
        /// An expiry that named the job uncertain.
        Uncertain = "uncertain",
        /// An expiry that returned the job to the queue (only the planted `requeue-on-expiry`).
        Requeued = "requeued",
        /// A `completed` reconcile's outcome.
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

words! {
    /// The `outcome` of an event: a terminal outcome, a job's final state, or a reconcile
    /// finding.
    OutcomeWord {
        Succeeded = "succeeded",
        Failed = "failed",
        Uncertain = "uncertain",
        Running = "running",
        Queued = "queued",
        /// Reconcile: the old execution was observed stopped.
        Stopped = "stopped",
        /// Reconcile: the old execution finished.
        Completed = "completed",
        /// Reconcile: still running; the attempt stays uncertain.
        StillRunning = "still-running",
    }
}

words! {
    /// How an attempt closed (`closed_by` of an attempt in a final event or a job view).
    ClosedBy {
        /// Its own accepted result.
        Result = "result",
        /// A reconcile finding it stopped.
        ObservedStopped = "observed-stopped",
        /// A reconcile finding it completed.
        ReconciledCompleted = "reconciled-completed",
        /// Its lease expired and the job went back to the queue (only the planted
        /// `requeue-on-expiry`).
        ExpiredRequeued = "expired-requeued",
    }
}

words! {
    /// A source of evidence a history may hold. A rule that stands on a source the history
    /// lacks answers unknown, never an anomaly.
    Source {
        /// The control plane's ledger (`type = ledger`).
        Ledger = "ledger",
        /// The runners' own logs (`runner:<id>` events).
        RunnerLogs = "runner-logs",
        /// The target's step log (`type = step`).
        TargetLog = "target-log",
        /// The operator's decisions (`operator` events).
        Operator = "operator",
        /// The faults injected, and the reports the nemesis sent itself (`nemesis` events).
        Nemesis = "nemesis",
        /// The client's submits (`client` events).
        Client = "client",
        /// The run's configuration, its lease policy among it (`harness` `config`).
        Config = "config",
        /// Every job's final state (`harness` `final`).
        Finals = "finals",
        /// The leases the control plane granted, in its ledger (`lease_expires_ms` of its
        /// claims): held with the ledger unless the run's config says the system lacks
        /// `lease` (`system.absent`) — a system whose ownership lasts as long as a connection
        /// grants none. Derived, never declared or cut on its own.
        Leases = "leases",
    }
}

impl Source {
    /// The source an event belongs to, if it is evidence of one (the harness's own
    /// bookkeeping — `unreadable`, `sources`, `runner-exited` — and scenario steps are not).
    pub fn of(event: &crate::Event) -> Option<Source> {
        match &event.process {
            Process::Runner(_) => Some(Source::RunnerLogs),
            Process::Role(Role::ControlPlane) => Some(Source::Ledger),
            Process::Role(Role::Target) => Some(Source::TargetLog),
            Process::Role(Role::Operator) => Some(Source::Operator),
            Process::Role(Role::Nemesis) => Some(Source::Nemesis),
            Process::Role(Role::Client) => Some(Source::Client),
            Process::Role(Role::Harness) => match event.f {
                Op::Config => Some(Source::Config),
                Op::Final => Some(Source::Finals),
                _ => None,
            },
            Process::Role(Role::Scenario) => None,
        }
    }

    /// How a sentence names it: "the target's step log".
    pub fn described(self) -> &'static str {
        match self {
            Source::Ledger => "the control plane's ledger",
            Source::RunnerLogs => "the runners' logs",
            Source::TargetLog => "the target's step log",
            Source::Operator => "the operator's decisions",
            Source::Nemesis => "the nemesis's events",
            Source::Client => "the client's submits",
            Source::Config => "the run's configuration",
            Source::Finals => "the jobs' final states",
            Source::Leases => "the control plane's leases",
        }
    }
}

words! {
    /// The parties that record events, apart from runners.
    Role {
        Client = "client",
        Operator = "operator",
        Nemesis = "nemesis",
        Harness = "harness",
        ControlPlane = "control-plane",
        Target = "target",
        /// A scenario's own steps.
        Scenario = "scenario",
    }
}

/// Who recorded an event: one of the fixed roles, or a runner by its id
/// (written `runner:<id>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    Role(Role),
    Runner(String),
}

impl Process {
    pub const CLIENT: Process = Process::Role(Role::Client);
    pub const OPERATOR: Process = Process::Role(Role::Operator);
    pub const NEMESIS: Process = Process::Role(Role::Nemesis);
    pub const HARNESS: Process = Process::Role(Role::Harness);
    pub const CONTROL_PLANE: Process = Process::Role(Role::ControlPlane);
    pub const TARGET: Process = Process::Role(Role::Target);
    pub const SCENARIO: Process = Process::Role(Role::Scenario);

    pub fn runner(id: &str) -> Process {
        Process::Runner(id.to_string())
    }

    /// The runner's id, for a runner's process.
    pub fn runner_id(&self) -> Option<&str> {
        match self {
            Process::Runner(id) => Some(id),
            Process::Role(_) => None,
        }
    }

    pub fn is_runner(&self) -> bool {
        matches!(self, Process::Runner(_))
    }

    /// Parses `runner:<id>` or a role's name.
    pub fn parse(word: &str) -> Result<Process, WordError> {
        if let Some(id) = word.strip_prefix("runner:") {
            if id.is_empty() {
                return Err(WordError::NoRunnerId);
            }
            return Ok(Process::Runner(id.to_string()));
        }
        Role::parse(word).map(Process::Role).ok_or_else(|| {
            let known = std::iter::once("runner:<id>").chain(Role::ALL.iter().map(|role| role.as_str()));
            WordError::unknown("process", word, known)
        })
    }
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Process::Role(role) => f.write_str(role.as_str()),
            Process::Runner(id) => write!(f, "runner:{id}"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Process, D::Error> {
        word(deserializer, Process::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_round_trips_through_its_name() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.as_str()), Some(*op));
            let json = serde_json::to_string(op).unwrap();
            assert_eq!(serde_json::from_str::<Op>(&json).unwrap(), *op);
        }
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
        }
        for role in Role::ALL {
            assert_eq!(Process::parse(role.as_str()), Ok(Process::Role(*role)));
        }
        assert_eq!(Process::parse("runner:r1"), Ok(Process::runner("r1")));
        assert_eq!(Process::runner("r1").to_string(), "runner:r1");
    }

    #[test]
    fn an_unknown_word_is_an_error_naming_it() {
        let error = serde_json::from_str::<Op>("\"heartbeat-v2\"").unwrap_err().to_string();
        assert!(error.contains("unknown op `heartbeat-v2`"), "{error}");
        assert_eq!(Process::parse("runner:"), Err(WordError::NoRunnerId));
        let error = Process::parse("runners").unwrap_err();
        assert!(matches!(&error, WordError::Unknown { field, word, .. } if field == "process" && word == "runners"));
        assert!(error.to_string().starts_with("unknown process `runners` (known: runner:<id>, "), "{error}");
        assert_eq!(Reason::parse("stale-fence"), None);
    }
}
