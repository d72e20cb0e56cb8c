//! `fencelab audit`: the rules a ledger alone can prove, judged on a live control plane that
//! keeps the contract. The audit pages through `GET /v1/ledger` from its cursor (bounded
//! pages, bounded time), appends every entry to `ledger.jsonl` and saves the cursor in
//! `cursor.json` after each page, so an audit stopped anywhere resumes where it stopped. Its
//! history declares the ledger (and, with `--lease-ms`, the lease policy) as its only
//! sources: every rule that stands on another answers unknown, never an anomaly.
//!
//! Once: the whole ledger is checked, as `fencelab check` checks a run. With `--follow`, the
//! audit keeps reading new entries at an interval and checks in rounds, holding only a
//! **window**: the whole ledger of every job that is still open, and of every job an anomaly
//! was found in. A job whose last ruling made it terminal is let go after the round that saw
//! it close; a later entry naming it (a late result, say) has it read back whole through
//! `GET /v1/jobs/{id}` before the entry is judged, and so does the job that claimed an
//! attempt named by that entry or by an entry read back: a cross-job report is its named
//! job's entry and names another job's attempt, and the rules judge it on that attempt's
//! claim (judged without it, a correct `not_current` reads as "the rules give `unknown`").
//! Where the window cannot know the attempt's job (forgotten beyond a bound), the entry is
//! not judged and the checkers answer unknown, never an anomaly. Memory is bounded by the
//! open jobs, not by the ledger's length. What a window cannot see is a rule between a job let go and a later
//! one (a fence reused from a finished job's claim on another key); `docs/history.md`
//! ("Auditing a live control plane") says so.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use history::{Decision, Event, Op, RecordedAs};
use protocol::client::{Client, ClientError};
use protocol::LedgerEntry;
use serde::{Deserialize, Serialize};

use crate::check::{FolderError, RunMeta};
use crate::evidence::{history_of, Given};
use runfolder::folder::write_whole;
use runfolder::folder::{AuditConfig, FolderConfig, RunFolder};

/// Most entries one page may ask for: the contract clamps `limit` to 1 ..= 10 000.
pub const PAGE_ENTRIES_MAX: u64 = 10_000;
/// With `--follow`: most jobs kept whole for the anomalies found in them; anomalies in further
/// jobs are counted, not told.
const FLAGGED_JOBS_MAX: usize = 1_000;
/// Reads of a page (or of a job let go) tried in a row before the audit stops, incomplete.
const READ_TRIES_MAX: u32 = 10;
/// The wait before a failed read is tried again, once the ledger is being read whole.
const READ_RETRY_WAIT: Duration = Duration::from_millis(500);
/// With `--follow`: the attempts of jobs let go whose job is remembered, so that a later
/// report naming one (for another job) has its job read back.
const LET_GO_ATTEMPTS_MAX: usize = 100_000;
/// Anomalies kept per checker from the rounds, for a checker the last window finds none of.
const SEEN_ANOMALIES_MAX: usize = 100;
/// Distinct anomalies counted beyond the kept jobs.
const UNKEPT_MAX: usize = 100_000;

/// What to audit and how far.
#[derive(Clone, Debug)]
pub struct Options {
    /// The control plane (`http://host:port`).
    pub url: String,
    pub token: String,
    /// The audit's folder: created, or resumed when it holds this URL's `cursor.json`.
    pub out: PathBuf,
    /// The control plane's lease policy, for the rules that judge a lease against it.
    pub lease_ms: Option<u64>,
    /// Entries asked for per page (1 ..= [`PAGE_ENTRIES_MAX`]).
    pub page_entries: u64,
    /// Most pages read by this audit.
    pub pages_max: u64,
    /// The whole audit, `--follow` included.
    pub time_limit: Duration,
    /// `--follow`: the wait between rounds once the ledger's end is reached.
    pub follow: Option<Duration>,
    /// With `--follow`: a round is checked at least every this many new entries, also while
    /// the audit is still catching up with a long ledger.
    pub round_entries: usize,
    pub request_timeout: Duration,
    /// The command line, for `run.json` and the reports.
    pub command: String,
}

/// What `cursor.json` holds: where the audit stands.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cursor {
    pub url: String,
    /// The `seq` of the last entry audited: the next page is read `after` it.
    pub after: u64,
    /// Entries audited, in `ledger.jsonl`.
    pub entries: u64,
    /// With `--follow`: the entries held now and at most, and the rounds checked.
    #[serde(default)]
    pub window_entries: usize,
    #[serde(default)]
    pub window_entries_peak: usize,
    #[serde(default)]
    pub rounds: u64,
    /// With `--follow`: how many times a job let go was read back whole.
    #[serde(default)]
    pub jobs_read_back: u64,
    /// With `--follow`: entries not judged, for they name an attempt of a job let go whose
    /// attempts the window no longer remembers (the checkers answer unknown, not valid).
    #[serde(default)]
    pub entries_unjudged: u64,
    /// Why the audit did not reach the ledger's end, if it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// What an audit did.
pub struct Audited {
    pub cursor: Cursor,
    /// Entries read by this audit (the rest were resumed from `ledger.jsonl`).
    pub new_entries: u64,
    pub pages: u64,
    pub run: results::Run,
}

/// The entries held for checking: every entry (once), or with `--follow` the window.
struct Window {
    follow: bool,
    jobs: BTreeMap<String, Vec<LedgerEntry>>,
    flagged: BTreeSet<String>,
    unkept: HashSet<(String, String, String)>,
    /// The job that claimed each attempt of the jobs held.
    claimed: HashMap<String, String>,
    /// The job that claimed each attempt of the jobs let go, the newest `let_go_max`
    /// ([`LET_GO_ATTEMPTS_MAX`]); `forgotten` once an older one was dropped.
    let_go: HashMap<String, String>,
    let_go_order: VecDeque<String>,
    let_go_max: usize,
    forgotten: bool,
    /// Entries not judged, for they name an attempt whose job the window could not know,
    /// and the first of them: the checkers it would find valid answer unknown instead.
    unjudged: u64,
    unjudged_first: Option<u64>,
    /// Per checker, what the rounds found.
    seen: BTreeMap<String, Seen>,
    held: usize,
    peak: usize,
    since_round: usize,
    rounds: u64,
    read_back: u64,
}

impl Window {
    fn new(follow: bool) -> Window {
        Window {
            follow,
            jobs: BTreeMap::new(),
            flagged: BTreeSet::new(),
            unkept: HashSet::new(),
            claimed: HashMap::new(),
            let_go: HashMap::new(),
            let_go_order: VecDeque::new(),
            let_go_max: LET_GO_ATTEMPTS_MAX,
            forgotten: false,
            unjudged: 0,
            unjudged_first: None,
            seen: BTreeMap::new(),
            held: 0,
            peak: 0,
            since_round: 0,
            rounds: 0,
            read_back: 0,
        }
    }

    /// Takes one entry. A `--follow` window first makes sure it holds every job the rules
    /// need to judge it: its job, read back whole if it was let go, and the job that claimed
    /// each attempt named by it or by an entry read back (a cross-job report: a job's ledger
    /// may name another job's attempt), read back in turn. An entry naming an attempt whose
    /// job the window no longer remembers is not judged (see [`Window::unjudged`]).
    async fn add(&mut self, entry: LedgerEntry, client: &Client) -> Result<(), String> {
        self.since_round += 1;
        if self.follow {
            let mut jobs = Vec::new();
            if entry.kind != Op::Submit && !self.jobs.contains_key(&entry.job) {
                jobs.push(entry.job.clone());
            }
            let mut named: Vec<(u64, String, String)> = Vec::new();
            if let Some(attempt) = &entry.attempt {
                named.push((entry.seq, entry.job.clone(), attempt.clone()));
            }
            let mut pending: Vec<String> = named.iter().map(|(_, _, attempt)| attempt.clone()).collect();
            // Each job is read back at most once: once read, it is held.
            loop {
                if let Some(job) = jobs.pop() {
                    if !self.jobs.contains_key(&job) {
                        for (seq, attempt) in self.read_back(&job, entry.seq, client).await? {
                            named.push((seq, job.clone(), attempt.clone()));
                            pending.push(attempt);
                        }
                    }
                    continue;
                }
                let Some(attempt) = pending.pop() else { break };
                if let Some(owner) = self.let_go.get(&attempt).filter(|owner| !self.jobs.contains_key(*owner)) {
                    jobs.push(owner.clone());
                }
            }
            let report = entry.kind != Op::Claim;
            if report && entry.attempt.as_deref().is_some_and(|attempt| self.unknowable(attempt)) {
                self.unjudge(entry.seq);
                return Ok(());
            }
            for (seq, job, attempt) in named.into_iter().filter(|(seq, _, _)| *seq != entry.seq) {
                if self.unknowable(&attempt) {
                    self.remove(&job, seq);
                    self.unjudge(seq);
                }
            }
        }
        self.insert(entry);
        Ok(())
    }

    /// An attempt whose claim the window does not hold and whose job it no longer remembers:
    /// it was let go, and its attempts forgotten beyond [`LET_GO_ATTEMPTS_MAX`]. (Before
    /// anything was forgotten, an attempt the window neither holds nor remembers was never
    /// claimed in the ledger, and the rules judge a report naming it as such.)
    fn unknowable(&self, attempt: &str) -> bool {
        self.forgotten && !self.claimed.contains_key(attempt) && !self.let_go.contains_key(attempt)
    }

    /// An entry not judged: the rules would judge it without its attempt's claim.
    fn unjudge(&mut self, seq: u64) {
        self.unjudged += 1;
        self.unjudged_first.get_or_insert(seq);
    }

    /// Drops a held entry of `job`.
    fn remove(&mut self, job: &str, seq: u64) {
        let Some(entries) = self.jobs.get_mut(job) else { return };
        if let Ok(at) = entries.binary_search_by_key(&seq, |held| held.seq) {
            entries.remove(at);
            self.held -= 1;
        }
    }

    /// Reads `job` back whole through `GET /v1/jobs/{id}`: its entries before `seq`. Answers
    /// the attempts they name, with the entry naming each.
    async fn read_back(&mut self, job: &str, seq: u64, client: &Client) -> Result<Vec<(u64, String)>, String> {
        let mut tries = 0;
        let view = loop {
            tries += 1;
            match client.job(job).await {
                Ok(view) => break view,
                Err(error) if tries >= READ_TRIES_MAX || !error.outcome_unknown() => {
                    return Err(format!("job `{job}` (named by ledger entry {seq}) could not be read back: {error}"));
                }
                Err(_) => tokio::time::sleep(READ_RETRY_WAIT).await,
            }
        };
        let mut named = Vec::new();
        for earlier in view.ledger.into_iter().filter(|earlier| earlier.seq < seq && earlier.job == job) {
            if let Some(attempt) = &earlier.attempt {
                named.push((earlier.seq, attempt.clone()));
            }
            self.insert(earlier);
        }
        self.read_back += 1;
        Ok(named)
    }

    /// Lets go of a closed job, remembering (bounded) which job claimed each of its attempts.
    /// Only its claims say so: a report in its ledger may name another job's attempt.
    fn let_go_of(&mut self, job: &str) {
        let Some(entries) = self.jobs.remove(job) else { return };
        self.held -= entries.len();
        let attempts: BTreeSet<String> =
            entries.into_iter().filter(|entry| entry.kind == Op::Claim).filter_map(|entry| entry.attempt).collect();
        for attempt in attempts {
            self.claimed.remove(&attempt);
            if self.let_go.insert(attempt.clone(), job.to_string()).is_none() {
                self.let_go_order.push_back(attempt);
            }
        }
        while self.let_go_order.len() > self.let_go_max {
            if let Some(oldest) = self.let_go_order.pop_front() {
                self.let_go.remove(&oldest);
                self.forgotten = true;
            }
        }
    }

    fn insert(&mut self, entry: LedgerEntry) {
        if let (Op::Claim, Some(attempt)) = (entry.kind, &entry.attempt) {
            self.claimed.insert(attempt.clone(), entry.job.clone());
        }
        let entries = self.jobs.entry(entry.job.clone()).or_default();
        match entries.binary_search_by_key(&entry.seq, |held| held.seq) {
            Ok(_) => return,
            Err(at) => entries.insert(at, entry),
        }
        self.held += 1;
        self.peak = self.peak.max(self.held);
    }

    /// Every entry held, in `seq` order.
    fn entries(&self) -> Vec<LedgerEntry> {
        let mut all: Vec<LedgerEntry> = self.jobs.values().flatten().cloned().collect();
        all.sort_unstable_by_key(|entry| entry.seq);
        all
    }

    /// With `--follow`: checks the window, keeps the jobs anomalies were found in, and lets
    /// go of every other job that is closed.
    fn round(&mut self, lease_ms: Option<u64>) {
        if !self.follow {
            return;
        }
        self.since_round = 0;
        self.rounds += 1;
        if self.held == 0 {
            return;
        }
        let entries = self.entries();
        let events = ledger_history(&entries, lease_ms);
        for result in checkers::check_all(&events) {
            let seen = self.seen.entry(result.checker.clone()).or_default();
            let anomalies = match result.verdict {
                checkers::Verdict::Valid => {
                    seen.judged = true;
                    continue;
                }
                checkers::Verdict::Unknown { reason } => {
                    seen.unknown.get_or_insert(reason);
                    continue;
                }
                checkers::Verdict::Invalid { anomalies } => anomalies,
            };
            for anomaly in &anomalies {
                if seen.anomalies.len() < SEEN_ANOMALIES_MAX && !seen.anomalies.iter().any(|held| same(held, anomaly)) {
                    seen.anomalies.push(checkers::Anomaly { events: Vec::new(), ..anomaly.clone() });
                }
            }
            for anomaly in anomalies {
                let named = anomaly.events.iter().filter_map(|index| events.get(*index as usize)?.job.clone());
                let jobs: BTreeSet<String> = anomaly.job.clone().into_iter().chain(named).collect();
                if self.flagged.len() + jobs.len() <= FLAGGED_JOBS_MAX || jobs.is_subset(&self.flagged) {
                    self.flagged.extend(jobs);
                } else if self.unkept.len() < UNKEPT_MAX {
                    self.unkept.insert((anomaly.checker, anomaly.kind, anomaly.message));
                }
            }
        }
        // A job an entry of another held job names (a report for its attempt) is held too.
        let owners: HashMap<&str, &str> = self
            .jobs
            .iter()
            .flat_map(|(job, entries)| {
                entries.iter().filter(|entry| entry.kind == Op::Claim).map(move |entry| (entry, job))
            })
            .filter_map(|(entry, job)| Some((entry.attempt.as_deref()?, job.as_str())))
            .collect();
        let named: HashSet<&str> = self
            .jobs
            .iter()
            .flat_map(|(job, entries)| entries.iter().map(move |entry| (entry, job)))
            .filter_map(|(entry, job)| owners.get(entry.attempt.as_deref()?).filter(|owner| **owner != job.as_str()))
            .copied()
            .collect();
        let closed: Vec<String> = self
            .jobs
            .iter()
            .filter(|(job, entries)| !self.flagged.contains(*job) && !named.contains(job.as_str()) && closed(entries))
            .map(|(job, _)| job.clone())
            .collect();
        for job in closed {
            self.let_go_of(&job);
        }
    }

    /// A follow's verdicts: the last window's check (`None`: it held nothing) together with
    /// every round's. Per checker: invalid when any found an anomaly (the last window's,
    /// which holds the jobs anomalies were found in, told with their events), else unknown
    /// when any was unknown, else valid when one judged it.
    fn verdicts(&self, last: Option<Vec<checkers::CheckerResult>>) -> Vec<checkers::CheckerResult> {
        let mut unkept: BTreeMap<&str, usize> = BTreeMap::new();
        for (checker, _, _) in &self.unkept {
            *unkept.entry(checker.as_str()).or_default() += 1;
        }
        let last = last.unwrap_or_default();
        let none = Seen::default();
        checkers::names()
            .iter()
            .map(|(name, description)| {
                let seen = self.seen.get(*name).unwrap_or(&none);
                let verdict = last.iter().find(|result| result.checker == *name).map(|result| result.verdict.clone());
                let mut anomalies = match &verdict {
                    Some(checkers::Verdict::Invalid { anomalies }) => anomalies.clone(),
                    _ => seen.anomalies.clone(),
                };
                if let Some(count) = unkept.get(name) {
                    anomalies.push(checkers::Anomaly {
                        checker: name.to_string(),
                        kind: "more".into(),
                        job: None,
                        attempts: Vec::new(),
                        runners: Vec::new(),
                        fences: Vec::new(),
                        key: None,
                        events: Vec::new(),
                        message: format!(
                            "{count} more anomalies of {name} were found in jobs beyond the {FLAGGED_JOBS_MAX} the audit kept whole; they are counted, not told"
                        ),
                    });
                }
                let unknown = match &verdict {
                    Some(checkers::Verdict::Unknown { reason }) => Some(reason.clone()),
                    _ => seen.unknown.clone(),
                };
                let unjudged = self.unjudged_first.map(|first| {
                    format!(
                        "{} ledger entries (the first: seq {first}) name an attempt of a job the follow let go and no longer remembers (beyond the newest {} attempts); they were not judged",
                        self.unjudged, self.let_go_max
                    )
                });
                let unknown = match (unknown, unjudged) {
                    (Some(reason), Some(unjudged)) => Some(format!("{reason}; {unjudged}")),
                    (reason, unjudged) => reason.or(unjudged),
                };
                let judged = seen.judged || matches!(verdict, Some(checkers::Verdict::Valid));
                let verdict = match (anomalies.is_empty(), unknown, judged) {
                    (false, _, _) => checkers::Verdict::Invalid { anomalies },
                    (true, Some(reason), _) => checkers::Verdict::Unknown { reason },
                    (true, None, true) => checkers::Verdict::Valid,
                    (true, None, false) => checkers::Verdict::Unknown { reason: "the ledger held no entries to judge".into() },
                };
                checkers::CheckerResult { checker: name.to_string(), description: description.to_string(), verdict }
            })
            .collect()
    }
}

/// What a follow's rounds found for one checker.
#[derive(Default)]
struct Seen {
    /// A round judged it valid.
    judged: bool,
    /// The first reason a round could not judge it.
    unknown: Option<String>,
    /// The first anomalies rounds found, without their events (they were a round's).
    anomalies: Vec<checkers::Anomaly>,
}

/// The same anomaly, found again in a later round.
fn same(a: &checkers::Anomaly, b: &checkers::Anomaly) -> bool {
    (&a.kind, &a.job, &a.attempts, &a.fences, &a.message) == (&b.kind, &b.job, &b.attempts, &b.fences, &b.message)
}

/// Whether a job's last ruling made it terminal: an accepted result, or a reconcile that
/// found it completed. Only a window's choice of what to hold: a job wrongly taken as closed
/// is read back whole when an entry names it again.
fn closed(entries: &[LedgerEntry]) -> bool {
    let last = entries.iter().rev().find_map(|entry| match (entry.kind, entry.decision, entry.recorded_as) {
        (Op::Result, Some(Decision::Accepted), _) => Some(true),
        (Op::Reconcile, _, Some(RecordedAs::Succeeded | RecordedAs::Failed)) => Some(true),
        (Op::Submit | Op::Claim | Op::Expire | Op::Reconcile, _, _) => Some(false),
        _ => None,
    });
    last.unwrap_or(false)
}

/// The history of ledger entries alone (and the lease policy, when given).
fn ledger_history(entries: &[LedgerEntry], lease_ms: Option<u64>) -> Vec<Event> {
    history_of(&Given { ledger: Some(entries), jobs: None, steps: None, runner_logs: &[], lease_ms, lacks: &[] })
}

fn bad(message: String) -> FolderError {
    FolderError::Bad(message)
}

/// Refuses options no audit can run with, before anything is read or written.
fn validate(options: &Options) -> Result<(), FolderError> {
    if !(options.url.starts_with("http://") || options.url.starts_with("https://")) {
        return Err(bad(format!("--url {}: not an http:// or https:// address", options.url)));
    }
    if !(1..=PAGE_ENTRIES_MAX).contains(&options.page_entries) {
        return Err(bad(format!("--page-entries {}: must be 1..={PAGE_ENTRIES_MAX}", options.page_entries)));
    }
    if options.pages_max == 0 {
        return Err(bad("--pages-max 0: an audit reads at least one page".into()));
    }
    if options.time_limit.is_zero() {
        return Err(bad("--time-limit 0: an audit needs time to read".into()));
    }
    if options.follow.is_some_and(|interval| interval.is_zero()) {
        return Err(bad("--interval-ms 0: a follow waits between rounds".into()));
    }
    if options.round_entries == 0 {
        return Err(bad("--round-entries 0: a round checks at least one entry".into()));
    }
    if options.lease_ms == Some(0) {
        return Err(bad("--lease-ms 0: a lease lasts at least 1 ms".into()));
    }
    Ok(())
}

/// The saved cursor of the audit in `out`, if it holds one; an `out` holding other files
/// and no cursor, or the cursor of another control plane, is refused.
fn saved_cursor(options: &Options) -> Result<Option<Cursor>, FolderError> {
    let path = options.out.join("cursor.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let cursor: Cursor =
                serde_json::from_str(&text).map_err(|error| bad(format!("{}: {error}", path.display())))?;
            if cursor.url != options.url {
                let said = format!(
                    "--out {} holds the audit of {}, not of {}",
                    options.out.display(),
                    cursor.url,
                    options.url
                );
                return Err(bad(said));
            }
            Ok(Some(cursor))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let holds = std::fs::read_dir(&options.out).map(|mut entries| entries.next().is_some()).unwrap_or(false);
            if holds {
                return Err(bad(format!("--out {} holds files but no audit's cursor.json", options.out.display())));
            }
            Ok(None)
        }
        Err(error) => Err(bad(format!("{}: {error}", path.display()))),
    }
}

/// Reads the entries already audited in `ledger.jsonl` into the window; answers the last
/// `seq` and how many. A line that is not a ledger entry, or out of `seq` order, is refused
/// with its line. A torn last line (an audit killed while appending) is dropped.
async fn resume(
    path: &Path,
    window: &mut Window,
    client: &Client,
    options: &Options,
) -> Result<(u64, u64), FolderError> {
    let (lease_ms, round_entries) = (options.lease_ms, options.round_entries);
    let text = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(error) => return Err(bad(format!("{}: {error}", path.display()))),
    };
    let whole = text.iter().rposition(|byte| *byte == b'\n').map_or(0, |at| at + 1);
    let (mut after, mut entries) = (0u64, 0u64);
    for (number, line) in text[..whole].lines().enumerate() {
        let line = line.map_err(|error| bad(format!("{}: line {}: {error}", path.display(), number + 1)))?;
        let entry: LedgerEntry = serde_json::from_str(&line)
            .map_err(|error| bad(format!("{}: line {}: {error}", path.display(), number + 1)))?;
        if entry.seq <= after {
            return Err(bad(format!("{}: line {}: seq {} after {after}", path.display(), number + 1, entry.seq)));
        }
        after = entry.seq;
        entries += 1;
        window.add(entry, client).await.map_err(bad)?;
        if window.since_round >= round_entries {
            window.round(lease_ms);
        }
    }
    if whole < text.len() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|file| file.set_len(whole as u64))
            .map_err(|error| FolderError::Write(format!("{}: {error}", path.display())))?;
    }
    Ok((after, entries))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), FolderError> {
    let text = serde_json::to_string_pretty(value).expect("the audit's files serialise");
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|error| FolderError::Write(format!("{}: {error}", path.display())))
}

/// Audits the control plane `options.url` into `options.out`; `interrupt` ends it early
/// (Ctrl-C), after which what was read is still checked.
pub async fn audit(
    options: &Options,
    interrupt: impl std::future::Future<Output = ()>,
) -> Result<Audited, FolderError> {
    validate(options)?;
    let saved = saved_cursor(options)?;
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();
    let client = Client::new(&options.url, Some(&options.token), options.request_timeout);
    if saved.is_none() {
        // The first page before anything is written: a wrong address or token changes nothing.
        // A follow of a live system may start while its control plane restarts: no answer is
        // tried again (as a read during the audit is), a refusal is not.
        let tries_max = if options.follow.is_some() { READ_TRIES_MAX } else { 1 };
        let mut tries = 0;
        loop {
            tries += 1;
            match client.ledger_page(0, 1).await {
                Err(ClientError::Refused(body)) if (400..500).contains(&body.status) => {
                    let said = format!(
                        "--url {}: the control plane refused the ledger read: {} {}",
                        options.url, body.status, body.code
                    );
                    return Err(bad(said));
                }
                Err(error) if error.is_transport() && tries < tries_max => {
                    tokio::time::sleep(READ_RETRY_WAIT).await;
                }
                Err(error) => {
                    let tried = if tries > 1 { format!(" ({tries} tries)") } else { String::new() };
                    return Err(bad(format!("--url {}: {error}{tried}", options.url)));
                }
                Ok(_) => break,
            }
        }
    }
    std::fs::create_dir_all(&options.out).map_err(|error| bad(format!("--out {}: {error}", options.out.display())))?;
    let mut window = Window::new(options.follow.is_some());
    let ledger_path = options.out.join("ledger.jsonl");
    let (mut after, mut entries) = resume(&ledger_path, &mut window, &client, options).await?;
    let round_entries = options.round_entries;
    let mut ledger = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&ledger_path)
        .map_err(|error| FolderError::Write(format!("{}: {error}", ledger_path.display())))?;
    let (mut pages, mut new_entries, mut stopped) = (0u64, 0u64, None::<String>);
    let (mut failures, mut failing) = (0u32, None::<String>);
    let deadline = tokio::time::Instant::now() + options.time_limit;
    tokio::pin!(interrupt);
    let save = |after: u64, entries: u64, window: &Window, stopped: &Option<String>| {
        let cursor = Cursor {
            url: options.url.clone(),
            after,
            entries,
            window_entries: window.held,
            window_entries_peak: window.peak,
            rounds: window.rounds,
            jobs_read_back: window.read_back,
            entries_unjudged: window.unjudged,
            stopped: stopped.clone(),
        };
        write_json(&options.out.join("cursor.json"), &cursor).map(|()| cursor)
    };
    'rounds: loop {
        // Read until the ledger's end (a page shorter than asked), a bound, or an interrupt.
        loop {
            if pages >= options.pages_max {
                stopped = Some(format!("--pages-max {} pages were read", options.pages_max));
                break 'rounds;
            }
            let page = tokio::select! {
                page = client.ledger_page(after, options.page_entries) => page,
                () = tokio::time::sleep_until(deadline) => {
                    stopped = Some(format!("--time-limit {} s reached before the ledger's end", options.time_limit.as_secs()));
                    break 'rounds;
                }
                () = &mut interrupt => {
                    stopped = Some("interrupted before the ledger's end".into());
                    break 'rounds;
                }
            };
            pages += 1;
            let page = match page {
                Ok(page) => {
                    failures = 0;
                    failing = None;
                    page
                }
                Err(error) => {
                    // A control plane restarting does not end an audit: the read is tried
                    // again after the interval, a bounded number of times in a row.
                    failures += 1;
                    failing = Some(format!("the ledger could not be read after seq {after}: {error}"));
                    if failures >= READ_TRIES_MAX {
                        stopped = failing.take().map(|why| format!("{why} ({failures} tries in a row)"));
                        break 'rounds;
                    }
                    break;
                }
            };
            let short = (page.len() as u64) < options.page_entries;
            let mut lines = String::new();
            for entry in &page {
                if entry.seq <= after {
                    stopped = Some(format!(
                        "the control plane answered entry {} to a read after {after}: its ledger endpoint breaks the contract's order",
                        entry.seq
                    ));
                    break;
                }
                after = entry.seq;
                lines.push_str(&serde_json::to_string(entry).expect("a ledger entry serialises"));
                lines.push('\n');
            }
            ledger
                .write_all(lines.as_bytes())
                .and_then(|()| ledger.flush())
                .map_err(|error| FolderError::Write(format!("{}: {error}", ledger_path.display())))?;
            let taken = lines.lines().count();
            for entry in page.into_iter().take(taken) {
                entries += 1;
                new_entries += 1;
                if let Err(why) = window.add(entry, &client).await {
                    stopped = Some(why);
                    break;
                }
            }
            if window.since_round >= round_entries {
                window.round(options.lease_ms);
            }
            save(after, entries, &window, &stopped)?;
            if stopped.is_some() {
                break 'rounds;
            }
            if short {
                break;
            }
        }
        let interval = match (options.follow, &failing) {
            (Some(interval), _) => interval,
            (None, Some(_)) => READ_RETRY_WAIT,
            (None, None) => break,
        };
        if failing.is_none() {
            window.round(options.lease_ms);
            save(after, entries, &window, &stopped)?;
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = tokio::time::sleep_until(deadline) => break,
            () = &mut interrupt => break,
        }
    }
    if stopped.is_none() {
        stopped = failing;
    }
    let cursor = save(after, entries, &window, &stopped)?;
    let events = ledger_history(&window.entries(), options.lease_ms);
    let folder = &options.out;
    let run_folder = RunFolder::at(folder);
    write_whole(&run_folder.history_path(), events.clone())
        .map_err(|error| FolderError::Write(format!("{}: {error}", folder.display())))?;
    let config = AuditConfig {
        test_name: "audit".into(),
        url: options.url.clone(),
        lease_ms: options.lease_ms,
        page_entries: options.page_entries,
        follow_interval_ms: options.follow.map(|interval| interval.as_millis() as u64),
        window: options.follow.is_some(),
    };
    run_folder.write_audit_config(&config)?;
    let meta = RunMeta {
        command: options.command.clone(),
        started_at,
        duration_ms: started.elapsed().as_millis() as u64,
        complete: cursor.stopped.is_none(),
    };
    run_folder.write_meta(&meta)?;
    let checked = match (window.follow, window.held) {
        (false, _) => checkers::check_all(&events),
        (true, 0) => window.verdicts(None),
        (true, _) => window.verdicts(Some(checkers::check_all(&events))),
    };
    let run = crate::check::run_of(folder, &events, checked, FolderConfig::Audit(config).shown(), meta)?;
    Ok(Audited { cursor, new_entries, pages, run })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// j1, j2 and j3 claimed; j1 and j2 succeed; then a cross-job report in j3 (still
    /// open) names j1's attempt, rejected `not_current` as the contract says.
    const CROSSED: &str = r#"{"seq":1,"kind":"submit","project":"p","job":"j1","deployment_key":"k1","received_ms":1000,"mono_ns":10}
{"seq":2,"kind":"claim","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k1","decision":"accepted","received_ms":1010,"mono_ns":20,"lease_expires_ms":3010}
{"seq":3,"kind":"submit","project":"p","job":"j2","deployment_key":"k2","received_ms":1020,"mono_ns":30}
{"seq":4,"kind":"claim","project":"p","job":"j2","attempt":"j2-a1","runner":"r2","fence":2,"deployment_key":"k2","decision":"accepted","received_ms":1030,"mono_ns":40,"lease_expires_ms":3030}
{"seq":5,"kind":"submit","project":"p","job":"j3","deployment_key":"k3","received_ms":1040,"mono_ns":50}
{"seq":6,"kind":"claim","project":"p","job":"j3","attempt":"j3-a1","runner":"r3","fence":3,"deployment_key":"k3","decision":"accepted","received_ms":1050,"mono_ns":60,"lease_expires_ms":3050}
{"seq":7,"kind":"result","project":"p","job":"j1","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k1","decision":"accepted","outcome":"succeeded","received_ms":1100,"mono_ns":70}
{"seq":8,"kind":"result","project":"p","job":"j2","attempt":"j2-a1","runner":"r2","fence":2,"deployment_key":"k2","decision":"accepted","outcome":"succeeded","received_ms":1200,"mono_ns":80}
{"seq":9,"kind":"result","project":"p","job":"j3","attempt":"j1-a1","runner":"r1","fence":1,"deployment_key":"k3","decision":"rejected","reason":"not_current","recorded_as":"late_observation","outcome":"succeeded","received_ms":1300,"mono_ns":90}
"#;

    /// Where the window cannot know the job of the attempt an entry names (its job was let
    /// go and its attempts forgotten beyond the bound), the entry is not judged and the rules
    /// answer unknown: judged without the attempt's claim, the correct `not_current` would be
    /// a false alarm ("the rules give `unknown`"). No job needs reading back here: a read
    /// of this address fails.
    #[tokio::test]
    async fn a_report_naming_an_attempt_whose_job_the_window_forgot_is_unknown_not_an_anomaly() {
        let client = Client::new("http://127.0.0.1:9", None, Duration::from_millis(100));
        let mut window = Window::new(true);
        window.let_go_max = 1;
        for line in CROSSED.lines() {
            let entry: LedgerEntry = serde_json::from_str(line).unwrap();
            window.add(entry, &client).await.unwrap();
            window.round(None);
        }
        let last = checkers::check_all(&ledger_history(&window.entries(), None));
        let verdicts = window.verdicts(Some(last));
        let invalid = verdicts.iter().filter(|result| matches!(result.verdict, checkers::Verdict::Invalid { .. }));
        assert_eq!(invalid.collect::<Vec<_>>(), Vec::<&checkers::CheckerResult>::new(), "no false alarm");
        let rules = verdicts.iter().find(|result| result.checker == checkers::rules_model::NAME).unwrap();
        match &rules.verdict {
            checkers::Verdict::Unknown { reason } => assert!(reason.contains("seq 9"), "{reason}"),
            other => panic!("rules-model must answer unknown for the entry it cannot judge: {other:?}"),
        }
        assert!(window.forgotten, "j1-a1 was forgotten when j2 was let go");
        assert_eq!((window.unjudged, window.unjudged_first), (1, Some(9)));
    }
}
