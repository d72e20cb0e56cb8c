//! Checking a run folder: read its history, run every checker, and write `results.json`,
//! `report.html` and `junit.xml` next to it. Used at the end of `fencelab run` and by
//! `fencelab check FOLDER`. A history that cannot be read is checked as unknown, with the
//! line that could not be read, never as valid.
//!
//! Only `history.jsonl` is required, so that records gathered by hand after an incident can
//! be checked (`docs/history.md`, "The minimal evidence folder"). The other files are
//! optional, each with its default: `config.json` `{}` (no configuration: the rules that
//! stand on it answer unknown), `schedule.json` `[]` (no faults), `run.json` the command
//! `fencelab check FOLDER`, no start time, a duration of 0 and `complete: true` (a folder of
//! records says nothing of a recovery; a `recovery` event in the history does). A file that
//! is there but not what it should be is bad input, named with its line.

use std::path::Path;

use results::{Overall, Run};

use runfolder::folder::RunFolder;
pub use runfolder::folder::{read_history, FolderError, RunMeta};

/// Checks the history in `folder` and writes the three reports; returns the verdict.
pub fn check_folder(folder: &Path) -> Result<(Overall, Run), FolderError> {
    check_folder_drawing(folder, results::KEPT_EVENTS_MAX)
}

/// [`check_folder`], the reports of a history longer than `kept_max` events drawn from a
/// sample of it.
pub fn check_folder_drawing(folder: &Path, kept_max: usize) -> Result<(Overall, Run), FolderError> {
    let run_folder = RunFolder::at(folder);
    let history = run_folder.required_history()?;
    let config = run_folder.config()?.map_or_else(|| serde_json::json!({}), |config| config.shown());
    let meta = run_folder.meta()?.unwrap_or_else(|| RunMeta {
        command: format!("fencelab check {}", folder.display()),
        started_at: String::new(),
        duration_ms: 0,
        complete: true,
    });
    let mut checked = check_history(&history, kept_max).unwrap_or_else(|error| Checked::unreadable(error.to_string()));
    let checkers = std::mem::take(&mut checked.checkers);
    let run = run_with(folder, &checked.view(), checkers, config, meta)?;
    Ok((run.overall(), run))
}

/// Turns transparent huge pages off for this process and the processes it starts (Linux;
/// elsewhere it does nothing). The allocator advises huge pages for its memory, and where
/// the kernel then compacts memory on demand to make them (`defrag` = `madvise`, the
/// kernel's default) a page fault can wait for that compaction: with the page cache full of
/// the history just read, `fencelab check` of 10^7 events spent 7 s of 16 in the kernel
/// (`cargo bench -p verdict --bench check_file`). The setting is inherited, so only commands
/// that start no process call this (`fencelab check`, `audit`, `evidence`).
pub fn without_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            return Err(std::io::Error::new(error.kind(), format!("prctl(PR_SET_THP_DISABLE): {error}")));
        }
    }
    Ok(())
}

/// Lines per chunk parsed at once, by either thread.
const CHUNK_LINES: usize = 256;
/// Chunks parsed ahead of the checking.
const BATCHES_AHEAD: usize = 32;

/// The history's lines, handed out in numbered chunks to whichever thread parses next.
struct Lines {
    input: std::io::BufReader<std::fs::File>,
    /// Chunks handed out so far (the next one's number).
    taken: u64,
    /// Lines read so far.
    line: usize,
    /// Bytes read so far.
    offset: u64,
    /// Why reading stopped early (an I/O error), if it did.
    failed: Option<String>,
    done: bool,
}

impl Lines {
    fn new(file: std::fs::File) -> Lines {
        Lines {
            input: std::io::BufReader::with_capacity(1 << 20, file),
            taken: 0,
            line: 0,
            offset: 0,
            failed: None,
            done: false,
        }
    }
}

/// Fills `chunk` with the next lines, reusing its buffers; false at the end (or after a
/// read error, kept in `failed`).
fn take(lines: &std::sync::Mutex<Lines>, chunk: &mut Chunk) -> bool {
    use std::io::BufRead;
    chunk.bytes.clear();
    chunk.ends.clear();
    let mut lines = lines.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if lines.done {
        return false;
    }
    chunk.seq = lines.taken;
    chunk.first_line = lines.line + 1;
    chunk.offset = lines.offset;
    while chunk.ends.len() < CHUNK_LINES {
        let Lines { input, .. } = &mut *lines;
        match input.read_until(b'\n', &mut chunk.bytes) {
            Ok(0) => {
                lines.done = true;
                break;
            }
            Ok(_) => chunk.ends.push(chunk.bytes.len()),
            Err(error) => {
                lines.failed = Some(error.to_string());
                lines.done = true;
                break;
            }
        }
    }
    lines.line += chunk.ends.len();
    lines.offset += chunk.bytes.len() as u64;
    if chunk.ends.is_empty() {
        return false;
    }
    lines.taken += 1;
    true
}

/// Consecutive lines of the history, the `seq`-th chunk, from line `first_line` at byte
/// `offset`. Each parsing thread keeps one and refills it: memory the allocator has just
/// been handed is paid for again in page faults, a large share of the time at 10^7 events.
#[derive(Default)]
struct Chunk {
    seq: u64,
    first_line: usize,
    offset: u64,
    bytes: Vec<u8>,
    /// Where each line ends in `bytes`.
    ends: Vec<usize>,
}

/// A chunk's parsed events, with their line numbers and byte offsets.
type Events = Vec<(usize, u64, history::Event)>;

/// A chunk's events with their line numbers and byte offsets, up to the first line that is
/// not an event (`error`, with its number).
struct Parsed {
    seq: u64,
    offset: u64,
    events: Events,
    error: Option<(usize, String)>,
    /// Parsed by the helper thread, which frees it too (see [`check_history`]).
    by_helper: bool,
}

impl Chunk {
    /// Parses the chunk into `events` (emptied first, its room reused).
    fn parse(&self, mut events: Events) -> Parsed {
        events.clear();
        events.reserve(self.ends.len());
        let mut start = 0;
        for (number, &end) in self.ends.iter().enumerate() {
            let (begin, line) = (start, &self.bytes[start..end]);
            start = end;
            if history::is_blank(line) {
                continue;
            }
            let at = self.offset + begin as u64;
            match history::parse_line(line) {
                Ok(event) => events.push((self.first_line + number, at, event)),
                Err(why) => {
                    let error = Some((self.first_line + number, why.to_string()));
                    return Parsed { seq: self.seq, offset: self.offset, events, error, by_helper: false };
                }
            }
        }
        Parsed { seq: self.seq, offset: self.offset, events, error: None, by_helper: false }
    }
}
/// At most this many anomalies' jobs are read again whole for their stories.
const JOBS_READ_AGAIN_MAX: usize = 1_000;

/// A history checked as a stream: the verdicts, the whole history's digest, and the events
/// the reports draw from.
pub struct Checked {
    pub checkers: Vec<checkers::CheckerResult>,
    pub digest: results::Digest,
    pub sample: results::Sample,
}

impl Checked {
    /// A history that could not be read: unknown everywhere, nothing to draw.
    fn unreadable(why: String) -> Checked {
        Checked {
            checkers: checkers::unreadable(&why),
            digest: results::Digest::new(),
            sample: results::Sample::default(),
        }
    }

    /// What the renderers read.
    pub fn view(&self) -> results::View<'_> {
        let one_in = (!self.sample.whole()).then(|| self.sample.one_in());
        results::View { events: &self.sample.events, digest: &self.digest, one_in }
    }
}

/// Reads the history at `path` once and checks it, keeping at most about `kept_max` events
/// (plus the anomalies' own) for the reports; the error, a line that cannot be read, names
/// the file and the line.
pub fn check_history(path: &Path, kept_max: usize) -> Result<Checked, FolderError> {
    let named = |why: String| FolderError::Bad(format!("{}: {why}", path.display()));
    let file = std::fs::File::open(path).map_err(|error| named(error.to_string()))?;
    let lines = std::sync::Mutex::new(Lines::new(file));
    let mut stream = checkers::Stream::new();
    let mut digest = results::Digest::new();
    let mut sampler = results::Sampler::new(kept_max);
    let (send, receive) = std::sync::mpsc::sync_channel::<Parsed>(BATCHES_AHEAD);
    // The helper's event vectors, checked, go back to it to be emptied and filled again: an
    // allocator frees a block fastest on the thread that allocated it, and each event holds
    // several.
    let (give_back, given_back) = std::sync::mpsc::sync_channel::<Events>(2 * BATCHES_AHEAD);
    // The first event index and byte offset of each chunk, for reading parts again.
    let mut chunks: Vec<(u64, u64)> = Vec::new();
    std::thread::scope(|scope| {
        let lines = &lines;
        // The helper parses chunks as long as there are any; the checking thread parses one
        // itself whenever the next in order is not ready, so that neither waits for the other.
        scope.spawn(move || {
            let mut chunk = Chunk::default();
            while take(lines, &mut chunk) {
                let events = given_back.try_recv().unwrap_or_default();
                let parsed = Parsed { by_helper: true, ..chunk.parse(events) };
                if send.send(parsed).is_err() {
                    return;
                }
            }
        });
        let mut order = history::Order::new();
        let mut ready: std::collections::BTreeMap<u64, Parsed> = std::collections::BTreeMap::new();
        let mut next = 0u64;
        let mut chunk = Chunk::default();
        // This thread's own event vectors, checked, for its next chunks.
        let mut spare: Vec<Events> = Vec::new();
        loop {
            if let Some(parsed) = ready.remove(&next) {
                next += 1;
                if let Some((_, _, first)) = parsed.events.first() {
                    chunks.push((first.index, parsed.offset));
                }
                for (line, at, event) in &parsed.events {
                    order.next(event).map_err(|why| named(format!("history line {line}: {why}")))?;
                    digest.push_at(event, *at);
                    sampler.offer(event);
                    stream.push(event);
                }
                if let Some((line, why)) = parsed.error {
                    return Err(named(format!("history line {line}: {why}")));
                }
                if parsed.by_helper {
                    // A helper that has stopped, or is behind on taking them, leaves it here.
                    let _ = give_back.try_send(parsed.events);
                } else if spare.len() < BATCHES_AHEAD {
                    spare.push(parsed.events);
                }
                continue;
            }
            if let Ok(parsed) = receive.try_recv() {
                ready.insert(parsed.seq, parsed);
                continue;
            }
            // Parsed ahead enough: wait for the helper's chunk rather than read further.
            let taken = ready.len() < BATCHES_AHEAD && take(lines, &mut chunk);
            if taken {
                let parsed = chunk.parse(spare.pop().unwrap_or_default());
                ready.insert(parsed.seq, parsed);
            } else if ready.is_empty() && lines.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).taken == next {
                break;
            } else {
                match receive.recv() {
                    Ok(parsed) => {
                        ready.insert(parsed.seq, parsed);
                    }
                    Err(_) => return Err(named("the parsing thread stopped".to_string())),
                }
            }
        }
        lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .failed
            .take()
            .map_or(Ok(()), |why| Err(named(why)))
    })?;
    let checkers = match stream.finish() {
        Some(checkers) => checkers,
        None => checkers::check_all(&read_history(path)?),
    };
    let mut sample = sampler.finish();
    if !sample.whole() {
        let more = read_again(path, &checkers, &sample, &digest, &chunks).map_err(named)?;
        sample.add(more);
    }
    Ok(Checked { checkers, digest, sample })
}

/// The events the sample lacks that the anomalies need: every event of the first
/// [`JOBS_READ_AGAIN_MAX`] jobs they name, and every event they cite. Only the stretches of
/// the file where those lie are read again (each job's span, from the digest's byte
/// offsets; each cited event's chunk), and of those only the lines of the jobs (matched on
/// their `"job":"…"` text) and of the cited events' chunks are parsed.
fn read_again(
    path: &Path,
    checked: &[checkers::CheckerResult],
    sample: &results::Sample,
    digest: &results::Digest,
    chunks: &[(u64, u64)],
) -> Result<Vec<history::Event>, String> {
    use std::io::{BufRead, Seek};
    let anomalies = || {
        checked.iter().flat_map(|result| match &result.verdict {
            checkers::Verdict::Invalid { anomalies } => anomalies.as_slice(),
            _ => &[],
        })
    };
    let mut jobs: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for job in anomalies().filter_map(|anomaly| anomaly.job.as_deref()) {
        if jobs.len() >= JOBS_READ_AGAIN_MAX {
            break;
        }
        if !sample.holds_job(job) {
            jobs.insert(job);
        }
    }
    let held = |index: u64| sample.events.binary_search_by_key(&index, |event| event.index).is_ok();
    let cited: std::collections::HashSet<u64> =
        anomalies().flat_map(|anomaly| anomaly.events.iter().copied()).filter(|index| !held(*index)).collect();
    // Stretches of the file as (first line's offset, last line's offset, parse every line).
    let mut stretches: Vec<(u64, u64, bool)> = Vec::new();
    for span in jobs.iter().filter_map(|job| digest.span(job)) {
        stretches.push((span.first, span.last, false));
        if let Some(at) = span.final_at {
            stretches.push((at, at, false));
        }
    }
    for index in &cited {
        let chunk = chunks.partition_point(|(first, _)| first <= index).saturating_sub(1);
        if let Some((_, start)) = chunks.get(chunk) {
            let end = chunks.get(chunk + 1).map_or(u64::MAX, |(_, next)| next - 1);
            stretches.push((*start, end, true));
        }
    }
    stretches.sort_unstable();
    let mut merged: Vec<(u64, u64, bool)> = Vec::new();
    for (start, end, all) in stretches {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => {
                last.1 = last.1.max(end);
                last.2 |= all;
            }
            _ => merged.push((start, end, all)),
        }
    }
    let file = std::fs::File::open(path).map_err(|error| error.to_string())?;
    let mut input = std::io::BufReader::with_capacity(1 << 16, file);
    let (mut line, mut more) = (Vec::with_capacity(512), Vec::new());
    for (start, end, all) in merged {
        input.seek(std::io::SeekFrom::Start(start)).map_err(|error| error.to_string())?;
        let mut at = start;
        while at <= end {
            line.clear();
            let read = input.read_until(b'\n', &mut line).map_err(|error| error.to_string())?;
            if read == 0 {
                break;
            }
            at += read as u64;
            if history::is_blank(&line) {
                continue;
            }
            let wanted = all
                || match job_text(&line) {
                    JobText::Named(job) => jobs.contains(job),
                    JobText::None => false,
                    JobText::Unsure => true,
                };
            if !wanted {
                continue;
            }
            let event = history::parse_line(&line).map_err(|why| why.to_string())?;
            let job_wanted = event.job.as_deref().is_some_and(|job| jobs.contains(job));
            if (job_wanted || cited.contains(&event.index)) && !sample.holds(&event) {
                more.push(event);
            }
        }
    }
    Ok(more)
}

/// What a history line's text says of its job, read without parsing it.
enum JobText<'a> {
    Named(&'a str),
    None,
    /// Written otherwise than fencelab writes it (spaces, escapes): parse it to know.
    Unsure,
}

fn job_text(line: &[u8]) -> JobText<'_> {
    const FIELD: &[u8] = b"\"job\":\"";
    let Some(at) = line.windows(FIELD.len()).position(|window| window == FIELD) else {
        let mentions = line.windows(5).any(|window| window == b"\"job\"");
        return if mentions { JobText::Unsure } else { JobText::None };
    };
    let rest = &line[at + FIELD.len()..];
    match rest.iter().position(|&byte| byte == b'"' || byte == b'\\') {
        Some(end) if rest[end] == b'"' => std::str::from_utf8(&rest[..end]).map_or(JobText::Unsure, JobText::Named),
        _ => JobText::Unsure,
    }
}

/// The checked run of a folder's history, its three reports written into `folder`.
pub fn run_of(
    folder: &Path,
    events: &[history::Event],
    checkers: Vec<checkers::CheckerResult>,
    config: serde_json::Value,
    meta: RunMeta,
) -> Result<Run, FolderError> {
    let digest = results::Digest::of(events);
    run_with(folder, &results::View { events, digest: &digest, one_in: None }, checkers, config, meta)
}

/// [`run_of`] from a [`results::View`]: the reports drawn from its events, counted by its
/// digest.
fn run_with(
    folder: &Path,
    view: &results::View,
    checkers: Vec<checkers::CheckerResult>,
    config: serde_json::Value,
    meta: RunMeta,
) -> Result<Run, FolderError> {
    let run_folder = RunFolder::at(folder);
    let schedule = serde_json::to_value(run_folder.schedule()?.unwrap_or_default()).expect("a schedule serialises");
    let run = Run {
        test_name: config["test_name"].as_str().unwrap_or("evidence").to_string(),
        seed: config["seed"].as_u64().unwrap_or(0),
        command: meta.command,
        started_at: meta.started_at,
        duration_ms: meta.duration_ms,
        config,
        schedule,
        checkers,
        complete: meta.complete,
    };
    // The page takes longest: it renders beside the other two.
    let (json, html, junit) = std::thread::scope(|scope| {
        let html = scope.spawn(|| results::report_html_of(&run, view));
        let json = results::results_json_of(&run, view);
        let junit = results::junit_xml_of(&run, view);
        (json, html.join().expect("rendering does not panic"), junit)
    });
    run_folder.write_reports(json, html, junit)?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use history::{Decision, Event, EventType, Op, Process};

    /// A history of `jobs` submitted-and-claimed jobs, several chunks long.
    fn lines(jobs: usize) -> Vec<String> {
        let mut writer = history::Writer::new(Vec::new());
        for n in 0..jobs {
            let job = format!("j{n}");
            writer.append(Event::new(n as u64, Process::CLIENT, EventType::Invoke, Op::Submit).with_job(&job)).unwrap();
            let mut claim = Event::new(n as u64, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim)
                .with_claim(&job, &format!("{job}-a1"), "r1", n as u64 + 1)
                .with_decision(Decision::Accepted, None);
            claim.value = Some(serde_json::json!({ "seq": n + 1 }));
            writer.append(claim).unwrap();
        }
        String::from_utf8(writer.into_inner()).unwrap().lines().map(str::to_string).collect()
    }

    fn write(lines: &[String]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), lines.join("\n") + "\n").unwrap();
        file
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn without_huge_pages_turns_them_off_for_the_process() {
        let thp = || {
            let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
            status.lines().find_map(|line| line.strip_prefix("THP_enabled:").map(|value| value.trim().to_string()))
        };
        super::without_huge_pages().expect("prctl");
        // SAFETY: PR_GET_THP_DISABLE takes plain integers and touches no memory of ours.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) }, 1);
        // Kernels that show it in /proc say the same.
        if let Some(enabled) = thp() {
            assert_eq!(enabled, "0");
        }
    }

    #[test]
    fn a_history_of_many_chunks_is_checked_as_a_whole_one_is() {
        let lines = lines(3 * CHUNK_LINES);
        let file = write(&lines);
        let checked = check_history(file.path(), 100).unwrap();
        let events = read_history(file.path()).unwrap();
        assert_eq!(checked.checkers, checkers::check_all(&events));
        assert_eq!(checked.digest.events(), events.len() as u64);
        assert!(!checked.sample.whole() && checked.sample.events.len() <= 100);
    }

    #[test]
    fn the_first_bad_line_of_a_long_history_is_named_whatever_chunk_it_is_in() {
        let good = lines(2_500);
        assert!(good.len() > 8 * CHUNK_LINES, "several chunks");
        let mut torn = good.clone();
        torn[2_500].truncate(20);
        let mut gap = good.clone();
        gap.remove(1_500);
        let mut blank_then_torn = good.clone();
        blank_then_torn.insert(10, String::new());
        blank_then_torn[4_000].truncate(20);
        for (lines, expected) in [
            (torn, "history line 2501: "),
            (gap, "history line 1501: index 1501 where 1500 was expected"),
            (blank_then_torn, "history line 4001: "),
        ] {
            let file = write(&lines);
            let error = check_history(file.path(), 100).err().expect("a bad line is an error").to_string();
            assert!(error.contains(expected), "{error}");
            let whole = read_history(file.path()).unwrap_err().to_string();
            assert!(whole.contains(expected), "the same line as a whole read: {whole}");
        }
    }
}
