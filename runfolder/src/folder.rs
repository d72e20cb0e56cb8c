//! The run folder, and the one place that knows its files (Jepsen's `store`): what each file
//! is called and holds, written and read back through the types that hold it. A run, a
//! scenario, an audit and `fencelab evidence` write through it; `check`, `replay`, `shrink`,
//! `matrix` and `diff` read through it. A file that is there but not what it should be is
//! an error naming the file; one that is absent is `None`, and the caller says what its
//! absence means.
//!
//! `config.json` has had two shapes: the run's configuration under `run` (now), and its
//! fields beside the others (before), where the system file's path was lost under the
//! system's `system`; both are read, the older one with the path taken from the system's
//! info. The history's `config` event and the reports show the configuration as it always
//! was ([`ConfigFile::flat`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use workloads::faults::Fault;
use workloads::jobs::PlannedJob;

use crate::config::{ConfigFile, RunConfig, ScenarioInfo};

const CONFIG: &str = "config.json";
const RUN: &str = "run.json";
const SCHEDULE: &str = "schedule.json";
const JOBS: &str = "jobs.json";
const ENDPOINTS: &str = "endpoints.json";
const HISTORY: &str = "history.jsonl";
const RESULTS: &str = "results.json";
const REPORT: &str = "report.html";
const JUNIT: &str = "junit.xml";
/// The system's own files: the control plane's store and every process's log.
const LAB: &str = "lab";

/// Why a folder could not be read or written.
#[derive(Debug)]
pub enum FolderError {
    /// A file of the folder is missing where it is required, or is not what it should be
    /// (named with its line): bad input, nothing was written.
    Bad(String),
    /// A file could not be written.
    Write(String),
}

impl std::fmt::Display for FolderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FolderError::Bad(message) | FolderError::Write(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for FolderError {}

impl From<FolderError> for String {
    fn from(error: FolderError) -> String {
        error.to_string()
    }
}

/// What `run.json` holds: how the run was made, written when it ends.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunMeta {
    pub command: String,
    pub started_at: String,
    pub duration_ms: u64,
    pub complete: bool,
}

/// What `endpoints.json` holds while a run lasts: its system's servers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoints {
    pub control_urls: Vec<String>,
    /// The target's, when the system has one.
    pub target_url: Option<String>,
}

/// What an audit's `config.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    pub test_name: String,
    pub url: String,
    pub lease_ms: Option<u64>,
    pub page_entries: u64,
    pub follow_interval_ms: Option<u64>,
    /// Whether the audit followed the ledger in rounds over a window of open jobs.
    pub window: bool,
}

/// A folder's `config.json`: a run's (or a scenario's), or an audit's.
#[derive(Clone, Debug, PartialEq)]
pub enum FolderConfig {
    Run(Box<ConfigFile>),
    Audit(AuditConfig),
}

impl FolderConfig {
    /// The configuration as the reports show it.
    pub fn shown(&self) -> serde_json::Value {
        match self {
            FolderConfig::Run(file) => file.flat(),
            FolderConfig::Audit(audit) => serde_json::to_value(audit).expect("an audit's config serialises"),
        }
    }
}

/// `config.json` as written before the run's configuration was nested under `run`: its
/// fields beside the others, the system file's path overwritten by the system's info.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FlatConfigFile {
    #[serde(flatten)]
    run: RunConfig,
    clock_control: system::ClockControl,
    #[serde(default)]
    system: system::SystemInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    healthy_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scenario: Option<ScenarioInfo>,
}

/// A `config.json`'s keys, which tell its shapes apart.
type ConfigShape = std::collections::BTreeMap<String, serde::de::IgnoredAny>;

impl ConfigFile {
    /// The configuration as the history's `config` event and the reports show it: the
    /// run's fields beside the others, `system` the system's info.
    pub fn flat(&self) -> serde_json::Value {
        let flat = FlatConfigFile {
            run: RunConfig { system: None, ..self.run.clone() },
            clock_control: self.clock_control.clone(),
            system: self.system.clone(),
            healthy_ms: self.healthy_ms,
            scenario: self.scenario.clone(),
        };
        serde_json::to_value(flat).expect("a run's config serialises")
    }

    /// The configuration as the history's `config` event says it: [`ConfigFile::flat`] in
    /// the event's one typed shape.
    pub fn said(&self) -> history::Config {
        serde_json::from_value(self.flat()).expect("a run's config is the config event's shape")
    }

    /// Reads `config.json`'s text in either shape it has had.
    fn parse(text: &str) -> Result<ConfigFile, serde_json::Error> {
        let shape: ConfigShape = serde_json::from_str(text)?;
        if shape.contains_key("run") {
            return serde_json::from_str(text);
        }
        let flat: FlatConfigFile = serde_json::from_str(text)?;
        let run = RunConfig { system: flat.system.file.clone(), ..flat.run };
        let FlatConfigFile { clock_control, system, healthy_ms, scenario, .. } = flat;
        Ok(ConfigFile { run, clock_control, system, healthy_ms, scenario })
    }
}

/// A run folder: `store/<test-name>/<start-time>/`, or any folder a check is pointed at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunFolder {
    path: PathBuf,
}

impl RunFolder {
    /// The folder at `path` (nothing is read or created).
    pub fn at(path: impl Into<PathBuf>) -> RunFolder {
        RunFolder { path: path.into() }
    }

    /// Creates `store/<test>/<start-time>/`; an unwritable store is bad input.
    pub fn create(config: &RunConfig) -> Result<RunFolder, FolderError> {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string();
        let path = config.store.join(&config.test_name).join(stamp);
        std::fs::create_dir_all(&path)
            .map_err(|error| FolderError::Bad(format!("--store {}: {error}", config.store.display())))?;
        Ok(RunFolder { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn into_path(self) -> PathBuf {
        self.path
    }

    /// The command that repeats the run of `config` made in this folder: with its store when
    /// it is not the default, and this folder's schedule when it was given one.
    pub fn repeat_command(&self, config: &RunConfig) -> String {
        config.command_with(&self.schedule_path())
    }

    pub fn history_path(&self) -> PathBuf {
        self.path.join(HISTORY)
    }

    pub fn schedule_path(&self) -> PathBuf {
        self.path.join(SCHEDULE)
    }

    pub fn report_path(&self) -> PathBuf {
        self.path.join(REPORT)
    }

    pub fn lab_path(&self) -> PathBuf {
        self.path.join(LAB)
    }

    /// Points `store/latest` at this folder.
    pub fn link_latest(&self, store: &Path) {
        let latest = store.join("latest");
        let _ = std::fs::remove_file(&latest);
        let relative = self.path.strip_prefix(store).unwrap_or(&self.path);
        let _ = std::os::unix::fs::symlink(relative, &latest);
    }

    /// `config.json`, read in whichever shape it was written; an empty object, the
    /// documented default of a folder gathered by hand, is none.
    pub fn config(&self) -> Result<Option<FolderConfig>, FolderError> {
        let Some(text) = self.text(CONFIG)? else { return Ok(None) };
        let bad = |error: serde_json::Error| FolderError::Bad(format!("{}: {error}", self.path.join(CONFIG).display()));
        let shape: ConfigShape = serde_json::from_str(&text).map_err(bad)?;
        if shape.is_empty() {
            return Ok(None);
        }
        let config = if shape.contains_key("url") && !shape.contains_key("run") {
            FolderConfig::Audit(serde_json::from_str(&text).map_err(bad)?)
        } else {
            FolderConfig::Run(Box::new(ConfigFile::parse(&text).map_err(bad)?))
        };
        Ok(Some(config))
    }

    /// `config.json` of a run or a scenario, required.
    pub fn run_config(&self) -> Result<ConfigFile, FolderError> {
        match self.config()? {
            Some(FolderConfig::Run(file)) => Ok(*file),
            Some(FolderConfig::Audit(_)) => {
                Err(FolderError::Bad(format!("{}: an audit's, not a run's", self.path.join(CONFIG).display())))
            }
            None => Err(self.missing(CONFIG)),
        }
    }

    pub fn write_config(&self, file: &ConfigFile) -> Result<(), FolderError> {
        self.write_json(CONFIG, file)
    }

    pub fn write_audit_config(&self, config: &AuditConfig) -> Result<(), FolderError> {
        self.write_json(CONFIG, config)
    }

    /// `run.json`.
    pub fn meta(&self) -> Result<Option<RunMeta>, FolderError> {
        self.json(RUN)
    }

    pub fn write_meta(&self, meta: &RunMeta) -> Result<(), FolderError> {
        self.write_json(RUN, meta)
    }

    /// `schedule.json`: the realised fault schedule.
    pub fn schedule(&self) -> Result<Option<Vec<Fault>>, FolderError> {
        self.json(SCHEDULE)
    }

    /// `schedule.json`, which must be there.
    pub fn required_schedule(&self) -> Result<Vec<Fault>, FolderError> {
        self.schedule()?.ok_or_else(|| self.missing(SCHEDULE))
    }

    pub fn write_schedule(&self, schedule: &[Fault]) -> Result<(), FolderError> {
        self.write_json(SCHEDULE, &schedule)
    }

    /// `jobs.json`: the planned jobs.
    pub fn jobs(&self) -> Result<Option<Vec<PlannedJob>>, FolderError> {
        self.json(JOBS)
    }

    /// `jobs.json`, which must be there.
    pub fn required_jobs(&self) -> Result<Vec<PlannedJob>, FolderError> {
        self.jobs()?.ok_or_else(|| self.missing(JOBS))
    }

    pub fn write_jobs(&self, jobs: &[PlannedJob]) -> Result<(), FolderError> {
        self.write_json(JOBS, &jobs)
    }

    /// `endpoints.json`.
    pub fn endpoints(&self) -> Result<Option<Endpoints>, FolderError> {
        self.json(ENDPOINTS)
    }

    pub fn write_endpoints(&self, endpoints: &Endpoints) -> Result<(), FolderError> {
        self.write_json(ENDPOINTS, endpoints)
    }

    /// `history.jsonl`, whole, through the typed vocabulary; the error names the file and
    /// line.
    pub fn history(&self) -> Result<Vec<history::Event>, FolderError> {
        read_history(&self.history_path())
    }

    /// `results.json`, through the types that wrote it; `None` when absent.
    pub fn results(&self) -> Result<Option<results::ResultsDoc>, FolderError> {
        let Some(text) = self.text(RESULTS)? else { return Ok(None) };
        let path = self.path.join(RESULTS);
        results::read_results(&text).map(Some).map_err(|error| FolderError::Bad(format!("{}: {error}", path.display())))
    }

    /// Writes the three reports: `results.json`, `report.html`, `junit.xml`.
    pub fn write_reports(&self, json: String, html: String, junit: String) -> Result<(), FolderError> {
        for (name, text) in [(RESULTS, json), (REPORT, html), (JUNIT, junit)] {
            self.write_text(name, text)?;
        }
        Ok(())
    }

    /// `history.jsonl`'s path, which must be there: its absence is bad input.
    pub fn required_history(&self) -> Result<PathBuf, FolderError> {
        let path = self.history_path();
        if path.is_file() {
            Ok(path)
        } else {
            Err(self.missing(HISTORY))
        }
    }

    fn missing(&self, name: &str) -> FolderError {
        FolderError::Bad(format!("{} holds no {name}", self.path.display()))
    }

    fn text(&self, name: &str) -> Result<Option<String>, FolderError> {
        let path = self.path.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(FolderError::Bad(format!("{}: {error}", path.display()))),
        }
    }

    fn json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<Option<T>, FolderError> {
        let Some(text) = self.text(name)? else { return Ok(None) };
        let path = self.path.join(name);
        serde_json::from_str(&text).map(Some).map_err(|error| FolderError::Bad(format!("{}: {error}", path.display())))
    }

    fn write_json(&self, name: &str, value: &impl Serialize) -> Result<(), FolderError> {
        let text = serde_json::to_string_pretty(value).expect("a run folder's files serialise");
        self.write_text(name, text)
    }

    /// Writes a file whole or not at all: a reader never sees half of it.
    fn write_text(&self, name: &str, text: String) -> Result<(), FolderError> {
        let path = self.path.join(name);
        let partial = self.path.join(format!("{name}.partial"));
        std::fs::write(&partial, text)
            .and_then(|()| std::fs::rename(&partial, &path))
            .map_err(|error| FolderError::Write(format!("{}: {error}", path.display())))
    }
}

/// Reads a `schedule.json` wherever it is (`fencelab run --schedule FILE`); the error names
/// the file.
pub fn read_schedule(path: &Path) -> Result<Vec<Fault>, FolderError> {
    let bad = |error: &dyn std::fmt::Display| FolderError::Bad(format!("{}: {error}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|error| bad(&error))?;
    serde_json::from_str(&text).map_err(|error| bad(&error))
}

/// Reads a history file through the typed vocabulary; the error names the file and line.
pub fn read_history(path: &Path) -> Result<Vec<history::Event>, FolderError> {
    let bad = |error: &dyn std::fmt::Display| FolderError::Bad(format!("{}: {error}", path.display()));
    let file = std::fs::File::open(path).map_err(|error| bad(&error))?;
    history::read(file).map_err(|error| bad(&error))
}

/// Writes a whole history to `path` (through a `.partial` file, renamed: a reader never
/// sees half of it); answers how many events it holds.
pub fn write_whole(path: &Path, events: Vec<history::Event>) -> std::io::Result<usize> {
    let partial = path.with_extension("jsonl.partial");
    let mut writer = history::Writer::new(std::io::BufWriter::new(std::fs::File::create(&partial)?));
    for event in events {
        writer.append(event).map_err(std::io::Error::other)?;
    }
    let count = writer.len() as usize;
    drop(writer.into_inner());
    std::fs::rename(&partial, path)?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `config.json` written by a run of the Python example before the run's
    /// configuration was nested.
    const FLAT: &str = include_str!("../testdata/config-flat.json");

    fn file() -> ConfigFile {
        ConfigFile {
            run: RunConfig {
                system: Some(PathBuf::from("/work/examples/python/system.toml")),
                variants: vec!["slow-expiry".into()],
                ..RunConfig::default()
            },
            clock_control: system::ClockControl::RunnerOffset,
            system: system::SystemInfo {
                name: "python-lab".into(),
                file: Some(PathBuf::from("/work/examples/python/system.toml")),
                variants: vec!["slow-expiry".into()],
                ..Default::default()
            },
            healthy_ms: Some(12),
            scenario: None,
        }
    }

    #[test]
    fn config_json_is_read_back_through_its_type_with_the_system_file() {
        let dir = tempfile::tempdir().unwrap();
        let folder = RunFolder::at(dir.path());
        assert!(folder.config().unwrap().is_none(), "an absent config.json is none");
        folder.write_config(&file()).unwrap();
        assert_eq!(folder.run_config().unwrap(), file());
        let text = std::fs::read_to_string(dir.path().join(CONFIG)).unwrap();
        let unknown = text.replacen('{', "{\"seeed\":1,", 1);
        assert!(ConfigFile::parse(&unknown).is_err(), "an unknown field is refused");
        let missing = text.replacen("\"seed\"", "\"seeed\"", 1);
        assert!(ConfigFile::parse(&missing).is_err(), "a missing field is refused");
    }

    #[test]
    fn a_flat_config_json_of_an_older_run_reads_with_its_system_file() {
        let file = ConfigFile::parse(FLAT).expect("the older shape reads");
        assert_eq!(file.run.system, Some(PathBuf::from("/work/main/examples/python/system.toml")));
        assert_eq!((file.run.seed, file.run.time_limit_ms, file.system.name.as_str()), (3, 5_000, "python-lab"));
        let system = ["--system", "/work/main/examples/python/system.toml"];
        assert!(
            file.run.command_words(None, None).windows(2).any(|pair| pair == system),
            "a replay of it names the system file"
        );
        let shown: serde_json::Value = serde_json::from_str(FLAT).unwrap();
        assert_eq!(file.flat(), shown, "the reports show an older run's config as it was written");
    }

    #[test]
    fn the_flat_view_is_the_shape_the_history_and_the_reports_have_always_had() {
        let flat = file().flat();
        assert_eq!(flat["system"]["file"], "/work/examples/python/system.toml");
        assert_eq!((flat["lease_ms"].as_u64(), flat["variants"][0].as_str()), (Some(1_000), Some("slow-expiry")));
        assert!(flat.get("run").is_none());
        let back = ConfigFile::parse(&flat.to_string()).unwrap();
        assert_eq!(back, file(), "the flat view reads back whole");
    }

    #[test]
    fn an_audit_config_reads_as_an_audits_and_a_bad_one_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let folder = RunFolder::at(dir.path());
        let audit = AuditConfig {
            test_name: "audit".into(),
            url: "http://127.0.0.1:1".into(),
            lease_ms: None,
            page_entries: 500,
            follow_interval_ms: None,
            window: false,
        };
        folder.write_audit_config(&audit).unwrap();
        assert_eq!(folder.config().unwrap(), Some(FolderConfig::Audit(audit)));
        assert!(folder.run_config().unwrap_err().to_string().contains("an audit's"));
        std::fs::write(dir.path().join(CONFIG), "{ not json").unwrap();
        assert!(folder.config().unwrap_err().to_string().contains(CONFIG));
        std::fs::write(dir.path().join(CONFIG), r#"{"seed": 3}"#).unwrap();
        let error = folder.config().unwrap_err().to_string();
        assert!(error.contains(CONFIG) && error.contains("missing field"), "{error}");
        std::fs::write(dir.path().join(CONFIG), " {} ").unwrap();
        assert_eq!(folder.config().unwrap(), None, "the documented default, written out, is no config");
    }

    #[test]
    fn a_schedule_reads_back_as_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let folder = RunFolder::at(dir.path());
        let config = RunConfig { time_limit_ms: 60_000, ..RunConfig::default() };
        let schedule = config.fault_schedule();
        assert!(!schedule.is_empty());
        folder.write_schedule(&schedule).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(folder.schedule_path()).unwrap()).unwrap();
        let read = folder.schedule().unwrap().unwrap();
        assert_eq!((&read, serde_json::to_value(&read).unwrap()), (&schedule, written));
    }
}
