//! The matrix: proof that the checkers can fail. For every planted bug, short runs with the
//! faults that expose it; for the correct lab, runs under every fault. Each run is a real
//! `fencelab run` in a process of its own; the table says which bug was detected, by which
//! checker, and how many seconds into the run its first anomaly's evidence sits.

use std::path::{Path, PathBuf};

use lab::bugs::Bug;
use runfolder::config::{Db, RunConfig};
use serde::Serialize;
use workloads::faults::{Fault, FaultKind, EVERY_FAULT};

pub use crate::runs::{run_child, Cell, RunSpec};

/// What a matrix is asked to run (the command line's flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub seeds: u64,
    pub correct_seeds: u64,
    pub time_limit: u64,
    pub first_seed: u64,
    pub parallel: usize,
    pub nemesis: Option<String>,
    pub bugs: Vec<Bug>,
    pub system: Option<PathBuf>,
    pub variants: Vec<String>,
    pub db: system::Db,
    pub control_planes: u32,
    pub store: PathBuf,
    /// Each run ends its workload at the first anomaly the live records show.
    pub stop_at_first: bool,
}

/// The faults that expose each planted bug: its variant's `nemesis` in `systems/lab.toml`.
pub fn exposing_faults(bug: Bug) -> String {
    let lab = system::SystemFile::lab();
    lab.variants.get(bug.name()).and_then(|variant| variant.nemesis.clone()).unwrap_or_else(|| EVERY_FAULT.to_string())
}

/// The store a planted bug needs (its variant's `db`), if it needs one: such a bug runs
/// there with [`DB_BUG_CONTROL_PLANES`] replicas.
pub fn store_of(bug: Bug) -> Option<Db> {
    system::SystemFile::lab().variants.get(bug.name()).and_then(|variant| variant.db)
}

/// What every run of a matrix shares besides its row and seed.
#[derive(Clone, Debug)]
struct Settings {
    time_limit_s: u64,
    system: Option<PathBuf>,
    /// The store; none: the one the system file declares.
    db: Option<Db>,
    control_planes: u32,
    stop_at_first: bool,
}

impl Settings {
    fn of(time_limit_s: u64, system: Option<&Path>) -> Settings {
        let system = system.map(Path::to_path_buf);
        Settings { time_limit_s, system, db: None, control_planes: 1, stop_at_first: false }
    }
}

/// Runs one matrix cell: `fencelab run` of the bug (or the correct lab) under `nemesis`,
/// on the store the bug needs ([`store_of`]).
pub async fn run_cell(
    program: &Path,
    store: &Path,
    bug: Option<Bug>,
    nemesis: &str,
    seed: u64,
    time_limit: u64,
) -> Cell {
    let exposing = bug.map(exposing_faults).unwrap_or_else(|| EVERY_FAULT.to_string());
    let row = Line { name: bug.map(|bug| bug.name().to_string()), bug, nemesis: nemesis.to_string(), exposing };
    let mut settings = Settings::of(time_limit, None);
    if let Some(db) = bug.and_then(store_of) {
        (settings.db, settings.control_planes) = (Some(db), DB_BUG_CONTROL_PLANES);
    }
    run_line(program, store, &row, seed, &settings).await
}

/// Runs one matrix cell of a system file's variant under the faults it declares (its
/// `nemesis`; every fault when it declares none), as `fencelab matrix --system` does.
pub async fn run_variant_cell(
    program: &Path,
    store: &Path,
    system: &Path,
    variant: &str,
    seed: u64,
    time_limit: u64,
) -> Result<Cell, crate::CampaignError> {
    let file = system::SystemFile::read(system)?;
    file.check_variants(&[variant.to_string()])?;
    let exposing = file.variants[variant].nemesis.clone().unwrap_or_else(|| EVERY_FAULT.to_string());
    let line = Line { name: Some(variant.to_string()), bug: None, nemesis: exposing.clone(), exposing };
    Ok(run_line(program, store, &line, seed, &Settings::of(time_limit, Some(system))).await)
}

/// One row of the matrix: a planted bug of the lab, a variant of a system file, or the
/// correct system (`name` none).
#[derive(Clone, Debug)]
struct Line {
    name: Option<String>,
    bug: Option<Bug>,
    nemesis: String,
    /// The faults that expose it (its variant's `nemesis`), whatever the run's are.
    exposing: String,
}

/// The validated configuration of one cell; the error says why it cannot run.
fn config_of(line: &Line, seed: u64, settings: &Settings) -> Result<RunConfig, String> {
    let variants = match (&line.name, line.bug) {
        (Some(name), None) => vec![name.clone()],
        _ => vec![],
    };
    let db = match settings.db {
        Some(db) => db,
        None => system::SystemFile::store_of(settings.system.as_deref(), None).map_err(|error| error.to_string())?,
    };
    RunConfig {
        test_name: line.name.clone().unwrap_or_else(|| "correct".to_string()),
        seed,
        time_limit_ms: settings.time_limit_s.saturating_mul(1_000),
        bugs: line.bug.into_iter().collect(),
        system: settings.system.clone(),
        variants,
        db,
        control_planes: settings.control_planes,
        stop_at_first: settings.stop_at_first,
        ..RunConfig::default()
    }
    .with_nemesis(&line.nemesis)
    .and_then(RunConfig::validate)
    .map_err(|error| error.to_string())
}

async fn run_line(program: &Path, store: &Path, line: &Line, seed: u64, settings: &Settings) -> Cell {
    match config_of(line, seed, settings) {
        Ok(config) => run_child(program, store, &RunSpec { config, nemesis: line.nemesis.clone() }).await,
        Err(why) => {
            let name = line.name.clone().unwrap_or_else(|| "correct".to_string());
            let refused = RunConfig { test_name: name, seed, ..RunConfig::default() };
            let mut cell = Cell::not_run(&RunSpec { config: refused, nemesis: line.nemesis.clone() }, String::new());
            cell.bug = line.name.clone();
            cell.verdict = results::RunVerdict::Error(why);
            cell
        }
    }
}

/// Replicas of the control plane the planted bugs that need a database server are set to
/// be caught with (their races run across replicas): `store_of`'s, README's.
const DB_BUG_CONTROL_PLANES: u32 = 3;

/// What the table says of the lab's rows that run with fewer replicas than their bugs are
/// set for, if any (the setting is the user's; a row short of its target then says why).
fn replicas_note(args: &Options, lines: &[Line]) -> Option<String> {
    let lab = system::SystemFile::lab();
    let needs_db = |line: &&Line| line.bug.is_some_and(|bug| lab.variants.get(bug.name()).and_then(|v| v.db).is_some());
    let bugs: Vec<&str> = lines.iter().filter(needs_db).filter_map(|line| line.name.as_deref()).collect();
    if bugs.is_empty() || args.control_planes >= DB_BUG_CONTROL_PLANES {
        return None;
    }
    Some(format!(
        "{}: these bugs race across replicas, and their targets are set for --control-planes {DB_BUG_CONTROL_PLANES}; this matrix ran {}",
        bugs.join(", "),
        args.control_planes
    ))
}

/// The matrix's rows: every planted bug (or the system file's variants) and the correct
/// system; and the variants left out because they need another store than `--db`.
fn lines(args: &Options) -> Result<(Vec<Line>, Vec<String>), crate::CampaignError> {
    let needs_other_db = |file: &system::SystemFile, name: &str| {
        file.variants.get(name).and_then(|variant| variant.db).filter(|db| *db != args.db)
    };
    let mut skipped = vec![];
    let Some(path) = &args.system else {
        let lab = system::SystemFile::lab();
        let bugs: Vec<Bug> = if args.bugs.is_empty() { Bug::ALL.to_vec() } else { args.bugs.clone() };
        let faults_of = |bug: Bug| args.nemesis.clone().unwrap_or_else(|| exposing_faults(bug));
        let mut lines = vec![];
        for bug in bugs {
            match needs_other_db(&lab, bug.name()) {
                Some(db) => skipped.push(format!("{bug}: needs --db {db}")),
                None => lines.push(Line {
                    name: Some(bug.name().to_string()),
                    bug: Some(bug),
                    nemesis: faults_of(bug),
                    exposing: exposing_faults(bug),
                }),
            }
        }
        return Ok((lines, skipped));
    };
    let file = system::SystemFile::read(path)?;
    file.check_variants(&args.variants)?;
    let names: Vec<String> =
        if args.variants.is_empty() { file.variants.keys().cloned().collect() } else { args.variants.clone() };
    let mut lines = vec![];
    for name in names {
        if let Some(db) = needs_other_db(&file, &name) {
            skipped.push(format!("{name}: needs --db {db}"));
            continue;
        }
        let declared = file.variants[&name].nemesis.clone();
        let exposing = declared.clone().unwrap_or_else(|| EVERY_FAULT.to_string());
        let nemesis = args.nemesis.clone().or(declared).unwrap_or_else(|| EVERY_FAULT.to_string());
        lines.push(Line { name: Some(name), bug: None, nemesis, exposing });
    }
    Ok((lines, skipped))
}

/// What a whole matrix found.
#[derive(Debug, Serialize)]
pub struct Matrix {
    pub time_limit_s: u64,
    /// The store and replicas of every run.
    pub db: runfolder::config::Db,
    pub control_planes: u32,
    /// Variants left out, each with why (`name: needs --db postgres`).
    pub skipped: Vec<String>,
    /// What the rows should be read with (bugs run with fewer replicas than they are set for).
    pub notes: Vec<String>,
    pub cells: Vec<Cell>,
    pub rows: Vec<Row>,
}

/// One line of the table: a bug (or the correct lab) over its seeds.
#[derive(Debug, Serialize)]
pub struct Row {
    pub bug: Option<String>,
    pub nemesis: String,
    pub runs: usize,
    /// Runs with a verdict of `invalid`.
    pub detected: usize,
    /// Runs that ended without a verdict (an error, or no results).
    pub errors: usize,
    /// Checkers that caught it, with how many runs each.
    pub checkers: Vec<(String, usize)>,
    /// Median seconds into the run of the first anomaly's evidence, over detecting runs.
    pub first_anomaly_s_median: Option<f64>,
    /// Median time from the start of the last exposing fault (one of the kinds that
    /// expose the bug) scheduled before the first anomaly's evidence to that evidence, in
    /// leases, over the detecting runs that had one.
    pub leases_after_fault_median: Option<f64>,
}

impl Row {
    /// A bug row holds when at least 90% of its runs detect it; the correct lab's when none does.
    pub fn holds(&self) -> bool {
        match self.bug {
            Some(_) => self.detected * 10 >= self.runs * 9,
            None => self.detected == 0 && self.errors == 0,
        }
    }
}

/// For a detecting run: the time from the start of the last fault of `exposing` scheduled
/// before its first anomaly's evidence to that evidence, in leases (`schedule.json` and
/// `config.json` of its folder).
fn leases_after_fault(cell: &Cell, exposing: &[FaultKind]) -> Option<f64> {
    let folder = cell.folder.as_ref()?;
    let first_ms = cell.first_anomaly_s? * 1_000.0;
    let run_folder = runfolder::folder::RunFolder::at(folder);
    let schedule: Vec<Fault> = run_folder.schedule().ok()??;
    let lease_ms = Some(run_folder.run_config().ok()?.run.lease_ms as f64).filter(|lease| *lease > 0.0)?;
    let exposing_start = schedule
        .iter()
        .filter(|fault| exposing.contains(&fault.kind) && fault.at_ms as f64 <= first_ms)
        .map(|fault| fault.at_ms)
        .max()?;
    Some((first_ms - exposing_start as f64) / lease_ms)
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

fn row(bug: Option<String>, nemesis: &str, exposing: &str, cells: &[&Cell]) -> Row {
    let mut checkers = std::collections::BTreeMap::<String, usize>::new();
    for checker in cells.iter().flat_map(|cell| &cell.checkers) {
        *checkers.entry(checker.clone()).or_default() += 1;
    }
    let firsts: Vec<f64> =
        cells.iter().filter(|cell| cell.detected()).filter_map(|cell| cell.first_anomaly_s).collect();
    let exposing = FaultKind::parse_list(exposing).unwrap_or_default();
    let after: Vec<f64> =
        cells.iter().filter(|cell| cell.detected()).filter_map(|cell| leases_after_fault(cell, &exposing)).collect();
    Row {
        bug,
        nemesis: nemesis.to_string(),
        runs: cells.len(),
        detected: cells.iter().filter(|cell| cell.detected()).count(),
        errors: cells.iter().filter(|cell| cell.verdict.is_error()).count(),
        checkers: checkers.into_iter().collect(),
        first_anomaly_s_median: median(firsts),
        leases_after_fault_median: median(after),
    }
}

/// Runs every cell, `parallel` at a time.
pub async fn run(args: &Options, program: &Path) -> Result<Matrix, crate::CampaignError> {
    std::fs::create_dir_all(&args.store).map_err(crate::CampaignError::Store)?;
    let (lines, skipped) = lines(args)?;
    let notes: Vec<String> = replicas_note(args, &lines).into_iter().collect();
    let settings = Settings {
        time_limit_s: args.time_limit,
        system: args.system.clone(),
        db: Some(args.db),
        control_planes: args.control_planes,
        stop_at_first: args.stop_at_first,
    };
    let mut plan: Vec<(Line, u64)> = Vec::new();
    for line in &lines {
        plan.extend((0..args.seeds).map(|i| (line.clone(), args.first_seed + i)));
    }
    let nemesis = args.nemesis.clone().unwrap_or_else(|| EVERY_FAULT.to_string());
    let correct = Line { name: None, bug: None, nemesis: nemesis.clone(), exposing: nemesis };
    plan.extend((0..args.correct_seeds).map(|i| (correct.clone(), args.first_seed + i)));
    let mut cells = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    for (line, seed) in plan {
        if running.len() >= args.parallel.max(1) {
            cells.push(running.join_next().await.expect("a running cell").map_err(crate::CampaignError::Cell)?);
        }
        let (program, store, settings) = (program.to_path_buf(), args.store.clone(), settings.clone());
        running.spawn(async move { run_line(&program, &store, &line, seed, &settings).await });
    }
    while let Some(cell) = running.join_next().await {
        cells.push(cell.map_err(crate::CampaignError::Cell)?);
    }
    cells.sort_by(|a, b| (a.bug.is_none(), &a.bug, a.seed).cmp(&(b.bug.is_none(), &b.bug, b.seed)));
    let mut rows = Vec::new();
    for line in &lines {
        let mine: Vec<&Cell> = cells.iter().filter(|cell| cell.bug == line.name).collect();
        rows.push(row(line.name.clone(), &line.nemesis, &line.exposing, &mine));
    }
    let correct_cells: Vec<&Cell> = cells.iter().filter(|cell| cell.bug.is_none()).collect();
    if !correct_cells.is_empty() {
        rows.push(row(None, &correct.nemesis, &correct.exposing, &correct_cells));
    }
    let matrix = Matrix {
        time_limit_s: args.time_limit,
        db: args.db,
        control_planes: args.control_planes,
        skipped,
        notes,
        cells,
        rows,
    };
    let json = serde_json::to_vec_pretty(&matrix).map_err(crate::CampaignError::Serialise)?;
    std::fs::write(args.store.join("matrix.json"), json).map_err(crate::CampaignError::Store)?;
    Ok(matrix)
}

/// The table, one line per bug and one for the correct lab.
pub fn table(matrix: &Matrix) -> String {
    let mut out = format!(
        "{:<27} {:<30} {:>9} {:>9} {:>15}  {}\n",
        "bug", "faults", "detected", "first (s)", "after (leases)", "checkers (runs)"
    );
    for row in &matrix.rows {
        let name = row.bug.clone().unwrap_or_else(|| "(correct lab)".to_string());
        let detected = match row.bug {
            Some(_) => format!("{}/{}", row.detected, row.runs),
            None => format!("{} of {} flagged", row.detected, row.runs),
        };
        let first = row.first_anomaly_s_median.map_or("-".to_string(), |seconds| format!("{seconds:.1}"));
        let after = row.leases_after_fault_median.map_or("-".to_string(), |leases| format!("{leases:.1}"));
        let checkers: Vec<String> = row.checkers.iter().map(|(name, runs)| format!("{name} ({runs})")).collect();
        let mark = if row.holds() { "" } else { "  <- FAILS ITS TARGET" };
        out.push_str(&format!(
            "{name:<27} {:<30} {detected:>9} {first:>9} {after:>15}  {}{mark}\n",
            row.nemesis,
            checkers.join(", ")
        ));
    }
    for skipped in &matrix.skipped {
        out.push_str(&format!("not run: {skipped}\n"));
    }
    for note in &matrix.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    for cell in matrix.cells.iter().filter(|cell| cell.verdict.is_error()) {
        out.push_str(&format!("error in `{}`: {}\n", cell.command, cell.verdict));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(db: system::Db, control_planes: u32, bugs: Vec<Bug>) -> Options {
        Options {
            seeds: 1,
            correct_seeds: 0,
            time_limit: 1,
            first_seed: 1,
            parallel: 1,
            nemesis: None,
            bugs,
            system: None,
            variants: vec![],
            db,
            control_planes,
            store: PathBuf::from("unused"),
            stop_at_first: false,
        }
    }

    #[test]
    fn database_bugs_run_with_fewer_replicas_than_they_are_set_for_say_so() {
        let bugs = vec![Bug::ClaimWithoutLock, Bug::AcceptStaleResult, Bug::SweeperWithoutLock];
        let one = options(system::Db::Postgres, 1, bugs.clone());
        let (rows, _) = lines(&one).unwrap();
        let note = replicas_note(&one, &rows).expect("a note");
        assert!(
            note.starts_with("claim-without-lock, sweeper-without-lock: these bugs race across replicas"),
            "{note}"
        );
        assert!(note.ends_with("--control-planes 3; this matrix ran 1"), "{note}");
        let three = options(system::Db::Postgres, 3, bugs.clone());
        assert_eq!(replicas_note(&three, &lines(&three).unwrap().0), None);
        // On SQLite they are not run at all (`not run: ... needs --db postgres`), so no note.
        let sqlite = options(system::Db::Sqlite, 1, bugs);
        let (rows, skipped) = lines(&sqlite).unwrap();
        assert_eq!(replicas_note(&sqlite, &rows), None);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        let matrix = Matrix {
            time_limit_s: 1,
            db: system::Db::Postgres,
            control_planes: 1,
            skipped: vec![],
            notes: vec![note.clone()],
            cells: vec![],
            rows: vec![],
        };
        assert!(table(&matrix).contains(&format!("note: {note}\n")), "{}", table(&matrix));
    }

    #[test]
    fn the_time_after_the_exposing_fault_is_counted_from_the_last_one_before_the_evidence() {
        let folder = tempfile::tempdir().unwrap();
        let fault = |at_ms: u64, kind: &str, how: &str| serde_json::json!({"at_ms": at_ms, "duration_ms": 0, "kind": kind, "runner": 0, "variant": {"how": how}});
        let schedule = [
            fault(1_000, "reconnects", "cut-links"),
            fault(3_000, "kill", "kill-runner"),
            fault(4_000, "reconnects", "cut-links"),
            fault(9_000, "reconnects", "cut-links"),
        ];
        let run_folder = runfolder::folder::RunFolder::at(folder.path());
        run_folder.write_schedule(&serde_json::from_value::<Vec<Fault>>(serde_json::json!(schedule)).unwrap()).unwrap();
        let config = runfolder::config::ConfigFile {
            run: runfolder::config::RunConfig { lease_ms: 500, ..Default::default() },
            clock_control: system::ClockControl::RunnerOffset,
            system: system::SystemInfo::default(),
            healthy_ms: None,
            scenario: None,
        };
        run_folder.write_config(&config).unwrap();
        let cell = Cell {
            test_name: "t".into(),
            bug: Some("accept-stale-result".into()),
            nemesis: "all".into(),
            seed: 1,
            verdict: results::RunVerdict::Error("unused".into()),
            checkers: vec![],
            first_anomaly_s: Some(5.5),
            folder: Some(folder.path().to_path_buf()),
            command: String::new(),
        };
        // The cut at 4 s is the last exposing fault before 5.5 s: 1.5 s, three leases.
        assert_eq!(leases_after_fault(&cell, &[FaultKind::Reconnects]), Some(3.0));
        assert_eq!(leases_after_fault(&cell, &[FaultKind::Kill]), Some(5.0));
        assert_eq!(leases_after_fault(&cell, &[FaultKind::ClockSkew]), None);
        assert_eq!(leases_after_fault(&Cell { first_anomaly_s: Some(0.5), ..cell }, &[FaultKind::Reconnects]), None);
    }
}
