//! Renderers of a run's results (results.json, report.html, junit.xml); pure.
//!
//! Everything here is a function from values handed in (a [`Run`] and the run's history) to a
//! `String`: no I/O, no async, no clock. The harness writes the files. Output is
//! deterministic: maps are iterated in key order and nothing depends on the time of rendering.

pub mod coverage;
pub mod diff;
mod digest;
pub mod escape;
mod html;
mod json;
pub mod junit;
mod model;
pub mod plots;
pub mod story;
pub mod suite;
mod timeline;
pub mod trends;
mod vocab;

use checkers::{CheckerResult, Verdict};
use serde::{Deserialize, Serialize};

pub use digest::{Digest, Sample, Sampler, Span, KEPT_EVENTS_MAX};
pub use html::{report_html, report_html_of};
pub use json::{
    read_results, results_json, results_json_of, AttemptTimes, CheckerDoc, Counts, DrawnFrom, ReadError, ResultsDoc,
    Steps, Timings, SCHEMA,
};
pub use junit::{junit_xml, junit_xml_of, junit_xml_with_stories};

/// What the renderers read of a run's history: the events they draw from, and the whole
/// history's [`Digest`] (its counts, span and sources, exact however long it is).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// The whole history, or the [`Sample`] of a history too long to draw whole.
    pub events: &'a [history::Event],
    pub digest: &'a Digest,
    /// For a sample, the share of jobs it holds whole: one in this many (besides every job
    /// an anomaly names). `None` when `events` is the whole history.
    pub one_in: Option<u64>,
}

impl View<'_> {
    /// A caption saying what a drawing of a sample stands on; `None` for a whole history.
    pub fn sampled_caption(&self) -> Option<String> {
        let one_in = self.one_in?;
        Some(format!(
            "Drawn from {} of the history's {} events: every event of one job in {one_in} (chosen by the job's \
             name), of every job an anomaly names, and of the nemesis, the operator and the harness. The counts \
             in results.json are over every event.",
            self.events.len(),
            self.digest.events()
        ))
    }
}

/// What a run leaves behind besides its history: how to repeat it and what the checkers said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub test_name: String,
    pub seed: u64,
    /// The exact command that repeats the run.
    pub command: String,
    /// RFC 3339, given by the harness.
    pub started_at: String,
    pub duration_ms: u64,
    /// The whole validated config (timings, runners, keys, nemesis, bugs, target mode, versions).
    pub config: serde_json::Value,
    /// The realised fault schedule: an array of `{at_ms, duration_ms, kind, runner, variant...}`.
    pub schedule: serde_json::Value,
    pub checkers: Vec<CheckerResult>,
    /// Whether the run reached its end: not interrupted, every job settled. A run that did
    /// not is unknown unless an anomaly stands on its own.
    pub complete: bool,
}

impl Run {
    /// The run's overall verdict, from its checker results and its completeness: valid
    /// checkers of an incomplete run make it unknown (nothing proves the rest was valid).
    pub fn overall(&self) -> Overall {
        match Overall::from_checkers(&self.checkers) {
            Overall::Valid if !self.complete => Overall::Unknown,
            overall => overall,
        }
    }
}

/// The verdict of a whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overall {
    Valid,
    Invalid,
    Unknown,
}

impl Overall {
    /// Any `Invalid` makes the run invalid; otherwise any `Unknown` — or no checker result at
    /// all, since nothing was decided — makes it unknown; otherwise it is valid.
    pub fn from_checkers(results: &[CheckerResult]) -> Overall {
        let invalid = results.iter().any(|r| matches!(r.verdict, Verdict::Invalid { .. }));
        let unknown = results.iter().any(|r| matches!(r.verdict, Verdict::Unknown { .. }));
        if invalid {
            Overall::Invalid
        } else if unknown || results.is_empty() {
            Overall::Unknown
        } else {
            Overall::Valid
        }
    }

    /// The exit this verdict answers with (`history::Exit`, the one table).
    pub fn exit(self) -> history::Exit {
        match self {
            Overall::Valid => history::Exit::Valid,
            Overall::Invalid => history::Exit::Invalid,
            Overall::Unknown => history::Exit::Unknown,
        }
    }

    /// The verdict's name as written in results.json: `valid`, `invalid`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Overall::Valid => "valid",
            Overall::Invalid => "invalid",
            Overall::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Overall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What became of one run of a suite or a matrix: its checked verdict, or why it has none.
/// Written as `valid`, `invalid`, `unknown`, `error: <why>` or `skipped: <why>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunVerdict {
    Checked(Overall),
    /// The run could not be made or its results not read.
    Error(String),
    /// The run was not made (the suite's time budget).
    Skipped(String),
}

impl RunVerdict {
    pub fn is(&self, overall: Overall) -> bool {
        *self == RunVerdict::Checked(overall)
    }

    pub fn is_error(&self) -> bool {
        matches!(self, RunVerdict::Error(_))
    }

    pub fn is_skipped(&self) -> bool {
        matches!(self, RunVerdict::Skipped(_))
    }

    /// Parses the written form; anything else is an error naming it.
    pub fn parse(text: &str) -> Result<RunVerdict, UnknownVerdict> {
        match text {
            "valid" => Ok(RunVerdict::Checked(Overall::Valid)),
            "invalid" => Ok(RunVerdict::Checked(Overall::Invalid)),
            "unknown" => Ok(RunVerdict::Checked(Overall::Unknown)),
            _ => match (text.strip_prefix("error: "), text.strip_prefix("skipped: ")) {
                (Some(why), _) => Ok(RunVerdict::Error(why.to_string())),
                (_, Some(why)) => Ok(RunVerdict::Skipped(why.to_string())),
                _ => Err(UnknownVerdict(text.to_string())),
            },
        }
    }
}

/// A run verdict's written form that is none of the known ones.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown run verdict `{0}` (known: valid, invalid, unknown, error: …, skipped: …)")]
pub struct UnknownVerdict(pub String);

impl std::fmt::Display for RunVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunVerdict::Checked(overall) => f.write_str(overall.as_str()),
            RunVerdict::Error(why) => write!(f, "error: {why}"),
            RunVerdict::Skipped(why) => write!(f, "skipped: {why}"),
        }
    }
}

impl Serialize for RunVerdict {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RunVerdict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<RunVerdict, D::Error> {
        let text = String::deserialize(deserializer)?;
        RunVerdict::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A checker verdict's name: `valid`, `invalid`, `unknown`.
pub(crate) fn verdict_name(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Valid => "valid",
        Verdict::Invalid { .. } => "invalid",
        Verdict::Unknown { .. } => "unknown",
    }
}

/// Anomalies that tell of one broken rule instance: those of one job (else of one
/// attempt, else of one deployment key, else of one checker's kind), in the order of their
/// first member.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AnomalyGroup {
    /// What the members share: `job j12`, `attempt j3-a2`, `key key-1` or `checker/kind`.
    pub group: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// How many anomalies it holds.
    pub count: usize,
    /// Its members' `checker/kind`, each once, in order of first appearance.
    pub kinds: Vec<String>,
    /// Its members, as indices into the anomalies numbered over all checkers (`a<n>`).
    pub anomalies: Vec<usize>,
}

/// The anomalies over all checkers, grouped (see [`AnomalyGroup`]).
pub fn anomaly_groups(run: &Run) -> Vec<AnomalyGroup> {
    let mut groups: Vec<AnomalyGroup> = Vec::new();
    let mut by_name: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (n, anomaly) in run.checkers.iter().flat_map(anomalies_of).enumerate() {
        let kind = format!("{}/{}", anomaly.checker, anomaly.kind);
        let name = match (&anomaly.job, anomaly.attempts.first(), &anomaly.key) {
            (Some(job), _, _) => format!("job {job}"),
            (None, Some(attempt), _) => format!("attempt {attempt}"),
            (None, None, Some(key)) => format!("key {key}"),
            (None, None, None) => kind.clone(),
        };
        let at = *by_name.entry(name.clone()).or_insert_with(|| {
            groups.push(AnomalyGroup {
                group: name,
                job: anomaly.job.clone(),
                count: 0,
                kinds: Vec::new(),
                anomalies: Vec::new(),
            });
            groups.len() - 1
        });
        let group = &mut groups[at];
        group.count += 1;
        group.anomalies.push(n);
        if !group.kinds.contains(&kind) {
            group.kinds.push(kind);
        }
    }
    groups
}

/// A checker result's anomalies (empty unless it is invalid).
pub(crate) fn anomalies_of(result: &CheckerResult) -> &[checkers::Anomaly] {
    match &result.verdict {
        Verdict::Invalid { anomalies } => anomalies,
        _ => &[],
    }
}
