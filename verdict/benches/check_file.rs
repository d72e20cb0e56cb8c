//! `fencelab check` of a history file end to end — read, checked, all three reports
//! written — against a typed parse of the same file, at 10^5, 10^6 and 10^7 events.
//!
//! Histories are generated (seeded, deterministic, the checkers bench's generator) into a
//! run folder; a correct one, and one with a late result accepted now and then (each an
//! anomaly whose story the report must tell). Each measurement runs in a child process of
//! its own, so that its peak resident memory (VmHWM) is its own. Printed per size and
//! history: seconds of the typed parse (`history::Reader`, nothing kept), of the streamed
//! check alone (`verdict::check::check_history`, no report) and of the whole check
//! (`verdict::check::check_folder`), the whole check's ratio to the parse and events/s, the check's peak memory in
//! bytes per event, and the size of `report.html`. Each figure is the median of three
//! interleaved rounds (parse, stream, check, then again).
//!
//! Run: `cargo bench -p verdict --bench check_file` (add a size, e.g. `-- 1000000`, to run
//! one; `FENCELAB_BENCH_DIR=DIR` keeps the generated run folders there). With
//! `FENCELAB_BENCH_SMOKE=1` (CI: `cargo test --benches`) it runs 10^4 events.

#[path = "../../checkers/benches/support/gen.rs"]
mod gen;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use history::{Decision, EventType, Op};
use runfolder::folder::RunFolder;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Generated events per chunk.
const CHUNK: usize = 100_000;
/// One late result in this many is accepted in the invalid history.
const PLANT_EVERY: u64 = 200;
/// Rounds of measurements per history (one in smoke mode).
const ROUNDS: usize = 3;

/// Peak resident memory of this process so far (VmHWM), in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap_or("VmHWM: 0 kB");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse().ok()).unwrap_or(0)
}

/// Writes a run folder holding a generated history of at least `size` events; with
/// `plant`, one late result in [`PLANT_EVERY`] is accepted, the first among them (ledger and answer). Returns
/// the events written and the anomalies planted.
fn generate(folder: &Path, size: usize, plant: bool) -> (u64, u64) {
    std::fs::create_dir_all(folder).expect("bench folder");
    let file = std::fs::File::create(RunFolder::at(folder).history_path()).expect("history file");
    let mut out =
        Written { out: std::io::BufWriter::with_capacity(1 << 20, file), plant, events: 0, late: 0, planted: 0 };
    let mut generator = gen::Gen::new(0x5eed ^ size as u64);
    while (out.events as usize) < size {
        out.write(generator.chunk(CHUNK.min(size - out.events as usize)));
    }
    out.write(generator.finals());
    out.out.flush().expect("flush");
    // Written through to the disk before anything is measured: the kernel's writeback of a
    // file just generated (gigabytes at 10^7) would otherwise run beside the measurements.
    out.out.get_ref().sync_all().expect("sync");
    (out.events, out.planted)
}

/// A history file being written, the planted anomalies counted.
struct Written {
    out: std::io::BufWriter<std::fs::File>,
    plant: bool,
    events: u64,
    late: u64,
    planted: u64,
}

impl Written {
    fn write(&mut self, events: Vec<history::Event>) {
        for mut event in events {
            let is_late = event.f == Op::Result && event.decision == Some(Decision::Rejected);
            if is_late && event.kind == EventType::Ledger {
                self.late += 1;
            }
            if self.plant && is_late && self.late % PLANT_EVERY == 1 {
                event.decision = Some(Decision::Accepted);
                event.reason = None;
                if event.kind == EventType::Ledger {
                    if let Some(object) = event.value.as_mut().and_then(|value| value.as_object_mut()) {
                        object.remove("recorded_as");
                    }
                    self.planted += 1;
                }
            }
            serde_json::to_writer(&mut self.out, &event).expect("write");
            self.out.write_all(b"\n").expect("write");
            self.events += 1;
        }
    }
}

/// The child's side: one measurement, printed as `seconds peak_kib events verdict`.
fn child(mode: &str, path: &Path) {
    // As `fencelab check` runs (see `without_huge_pages`), every mode alike.
    verdict::check::without_huge_pages().expect("prctl");
    let started = Instant::now();
    let (events, verdict) = match mode {
        "parse" => {
            let file = std::fs::File::open(path).expect("history");
            let reader = history::Reader::new(std::io::BufReader::with_capacity(1 << 20, file));
            let mut events = 0u64;
            for event in reader {
                event.expect("a generated history reads");
                events += 1;
            }
            (events, "-".to_string())
        }
        "stream" => {
            let checked = verdict::check::check_history(&RunFolder::at(path).history_path(), results::KEPT_EVENTS_MAX)
                .expect("a generated history reads");
            let overall = results::Overall::from_checkers(&checked.checkers);
            (checked.digest.events(), overall.to_string())
        }
        _ => {
            let (overall, _) = verdict::check::check_folder(path).expect("check");
            let doc = RunFolder::at(path).results().expect("results.json reads").expect("the check wrote its results");
            (doc.counts.events, overall.to_string())
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    println!("{seconds} {} {events} {verdict}", peak_kib());
}

struct Measured {
    seconds: f64,
    peak_kib: u64,
    events: u64,
    verdict: String,
}

/// The measurement of median time among `measured` (its memory that run's).
fn median(mut measured: Vec<Measured>) -> Measured {
    measured.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let middle = measured.len() / 2;
    measured.swap_remove(middle)
}

fn measure(mode: &str, path: &Path) -> Measured {
    let output = Command::new(std::env::current_exe().expect("bench binary"))
        .env("FENCELAB_BENCH_CHILD", mode)
        .env("FENCELAB_BENCH_PATH", path)
        .output()
        .expect("bench child");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{mode} {}: {text}{}", path.display(), String::from_utf8_lossy(&output.stderr));
    let fields: Vec<&str> = text.split_whitespace().collect();
    Measured {
        seconds: fields[0].parse().expect("seconds"),
        peak_kib: fields[1].parse().expect("peak"),
        events: fields[2].parse().expect("events"),
        verdict: fields[3].to_string(),
    }
}

fn main() {
    if let (Some(mode), Some(path)) =
        (std::env::var_os("FENCELAB_BENCH_CHILD"), std::env::var_os("FENCELAB_BENCH_PATH"))
    {
        child(&mode.to_string_lossy(), &PathBuf::from(path));
        return;
    }
    let smoke = std::env::var_os("FENCELAB_BENCH_SMOKE").is_some();
    let only: Option<usize> = std::env::args().skip(1).find_map(|arg| arg.parse().ok());
    let sizes: Vec<usize> = match only {
        Some(size) => vec![size],
        None if smoke => vec![10_000],
        None => vec![100_000, 1_000_000, 10_000_000],
    };
    let rounds_n = if smoke { 1 } else { ROUNDS };
    let temp = tempfile::tempdir().expect("temp dir");
    let kept = std::env::var_os("FENCELAB_BENCH_DIR").map(PathBuf::from);
    let dir = kept.as_deref().unwrap_or(temp.path());
    println!(
        "{:>10} {:>8} {:>8} {:>8} {:>9} {:>8} {:>11} {:>6} {:>8} {:>7} {:>9} {:>8}",
        "events",
        "history",
        "parse s",
        "stream s",
        "check s",
        "ratio",
        "check ev/s",
        "B/ev",
        "peak MiB",
        "parse",
        "html MB",
        "verdict"
    );
    for size in sizes {
        for plant in [false, true] {
            let folder = dir.join(format!("{size}-{plant}"));
            let (written, planted) = generate(&folder, size, plant);
            // Interleaved rounds, each figure the median of its rounds: a virtual machine's
            // speed drifts over seconds (its host backs fresh memory lazily), and a figure
            // taken once is that moment's.
            let mut rounds: [Vec<Measured>; 3] = Default::default();
            for _ in 0..rounds_n {
                rounds[0].push(measure("parse", &RunFolder::at(&folder).history_path()));
                rounds[1].push(measure("stream", &folder));
                rounds[2].push(measure("check", &folder));
            }
            let [parse, stream, check] = rounds.map(median);
            assert_eq!((parse.events, check.events), (written, written), "every event read and counted");
            let expected = if planted > 0 { "invalid" } else { "valid" };
            assert_eq!(stream.verdict, expected, "{written} events, {planted} planted anomalies (stream)");
            assert_eq!(check.verdict, expected, "{written} events, {planted} planted anomalies");
            let html = std::fs::metadata(RunFolder::at(&folder).report_path()).map(|meta| meta.len()).unwrap_or(0);
            println!(
                "{:>10} {:>8} {:>8.2} {:>8.2} {:>9.2} {:>8.2} {:>11.0} {:>6.0} {:>8.0} {:>7.0} {:>9.2} {:>8}",
                written,
                if plant { format!("{planted} bad") } else { "correct".to_string() },
                parse.seconds,
                stream.seconds,
                check.seconds,
                check.seconds / parse.seconds,
                written as f64 / check.seconds,
                check.peak_kib as f64 * 1024.0 / written as f64,
                check.peak_kib as f64 / 1024.0,
                parse.peak_kib as f64 / 1024.0,
                html as f64 / 1e6,
                check.verdict
            );
            if kept.is_none() {
                std::fs::remove_dir_all(&folder).ok();
            }
        }
    }
}
