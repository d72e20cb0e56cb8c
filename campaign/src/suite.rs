//! Nightly suites: a TOML list of runs (workloads × faults × seeds) executed within a total
//! time budget, optionally one shard of N, leaving an index page linking every run's report,
//! one aggregated `junit.xml` and `suite.json`. `merge` joins shard outputs into one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use lab::bugs::Bug;
use runfolder::config::{command_line, RunConfig};
use serde::Deserialize;

use crate::runs::{run_child, RunSpec};
use crate::CampaignError;

/// A suite file (see `docs/suites.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteFile {
    pub name: String,
    /// Total seconds the suite may take; runs that would not fit are skipped (default 3600).
    #[serde(default = "default_budget")]
    pub time_budget_s: u64,
    /// Runs at once (default 2).
    #[serde(default = "default_parallel")]
    pub parallel: usize,
    #[serde(rename = "run")]
    pub runs: Vec<SuiteRun>,
}

fn default_budget() -> u64 {
    3_600
}

fn default_parallel() -> usize {
    2
}

/// One `[[run]]` as the file says it: a workload under faults, for each seed.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteRun {
    pub name: String,
    /// The faults, as `--nemesis` takes them (default: the flag's).
    #[serde(default)]
    pub nemesis: Option<String>,
    pub seeds: Vec<u64>,
    /// Seconds of each run (default: the flag's).
    #[serde(default)]
    pub time_limit: Option<u64>,
    #[serde(default)]
    pub bugs: Vec<Bug>,
    /// The system under test: a system file, relative to the suite file (default: the lab).
    #[serde(default)]
    pub system: Option<PathBuf>,
    /// Variants of the system switched on (e.g. a canary build with a known bug, run with
    /// `expect = "invalid"`).
    #[serde(default)]
    pub variants: Vec<String>,
    /// The verdict that counts as a pass: `valid` (default) or `invalid` (a planted bug caught).
    #[serde(default = "default_expect")]
    pub expect: results::Overall,
    /// Further `fencelab run` flags, verbatim: read by the command line's own parser.
    #[serde(default)]
    pub args: Vec<String>,
}

fn default_expect() -> results::Overall {
    results::Overall::Valid
}

/// A suite read and made typed: each `[[run]]`'s configuration built and validated once.
#[derive(Clone, Debug)]
pub struct Suite {
    pub name: String,
    pub time_budget_s: u64,
    pub parallel: usize,
    pub runs: Vec<Workload>,
}

/// One `[[run]]`, typed.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub seeds: Vec<u64>,
    pub expect: results::Overall,
    /// The configuration of its runs; each takes one of `seeds`.
    pub config: RunConfig,
}

impl Workload {
    /// The planted bugs and variants it switches on, by name.
    fn bugs(&self) -> Vec<String> {
        let bugs = self.config.bugs.iter().map(|bug| bug.name().to_string());
        bugs.chain(self.config.variants.iter().cloned()).collect()
    }
}

pub use results::suite::{index_html, index_html_with_trends, junit_xml, Entry, SuiteResult};

/// Valid when every entry passed, invalid when one failed, unknown when none failed but
/// some did not run.
pub fn exit(result: &SuiteResult) -> history::Exit {
    if result.entries.iter().any(|entry| !entry.passed && !entry.verdict.is_skipped()) {
        history::Exit::Invalid
    } else if result.entries.iter().any(|entry| !entry.passed) {
        history::Exit::Unknown
    } else {
        history::Exit::Valid
    }
}

/// Reads a suite file; `configure` makes each `[[run]]` (its system file made absolute
/// first) a validated configuration: the command line's flags are its to read.
pub fn read(path: &Path, configure: impl Fn(&SuiteRun) -> Result<RunConfig, String>) -> Result<Suite, CampaignError> {
    let text = std::fs::read_to_string(path).map_err(|error| CampaignError::io(path, error))?;
    let mut suite: SuiteFile =
        toml::from_str(&text).map_err(|source| CampaignError::Toml { path: path.to_path_buf(), source })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    for run in &mut suite.runs {
        if let Some(system) = &run.system {
            run.system = Some(std::path::absolute(dir.join(system)).unwrap_or_else(|_| dir.join(system)));
        }
    }
    typed(suite, configure).map_err(|error| CampaignError::In { path: path.to_path_buf(), source: Box::new(error) })
}

/// A suite file's model made typed: every run needs seeds and an expectation, and
/// `configure` builds its configuration; an error names the run.
pub fn typed(
    file: SuiteFile,
    configure: impl Fn(&SuiteRun) -> Result<RunConfig, String>,
) -> Result<Suite, CampaignError> {
    let mut runs = Vec::new();
    for run in &file.runs {
        if run.seeds.is_empty() || run.expect == results::Overall::Unknown {
            return Err(CampaignError::RunNeedsSeeds(run.name.clone()));
        }
        let config = configure(run).map_err(|message| CampaignError::RunConfig { run: run.name.clone(), message })?;
        runs.push(Workload { name: run.name.clone(), seeds: run.seeds.clone(), expect: run.expect, config });
    }
    Ok(Suite { name: file.name, time_budget_s: file.time_budget_s, parallel: file.parallel, runs })
}

/// Parses `I/N` (1-based).
pub fn parse_shard(text: &str) -> Result<(usize, usize), CampaignError> {
    let parsed = text.split_once('/').and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some((i, n)) if i >= 1 && i <= n => Ok((i, n)),
        _ => Err(CampaignError::Shard(text.to_string())),
    }
}

/// Every (index, run, seed) of the suite, and the ones shard `(i, n)` takes.
pub fn plan(suite: &Suite, shard: Option<(usize, usize)>) -> Vec<(usize, Workload, u64)> {
    let all = suite.runs.iter().flat_map(|run| run.seeds.iter().map(move |seed| (run.clone(), *seed)));
    all.enumerate()
        .filter(|(index, _)| shard.is_none_or(|(i, n)| index % n == i - 1))
        .map(|(index, (run, seed))| (index, run, seed))
        .collect()
}

/// Runs the planned entries, `parallel` at a time, skipping what would exceed the budget.
pub async fn execute(suite: &Suite, shard: Option<(usize, usize)>, program: &Path, store: &Path) -> SuiteResult {
    let started = Instant::now();
    let mut entries = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    for (index, run, seed) in plan(suite, shard) {
        if running.len() >= suite.parallel.max(1) {
            entries.push(running.join_next().await.expect("a running entry").expect("an entry task"));
        }
        let config = RunConfig { seed, ..run.config.clone() };
        let time_limit_s = config.time_limit_ms / 1_000;
        let spec = RunSpec { nemesis: config.nemesis_words(), config };
        // A run takes its time limit and about as long again to start, recover and check.
        if started.elapsed().as_secs() + 2 * time_limit_s > suite.time_budget_s {
            let runs = store.join("runs").join(format!("{}-s{seed}", run.name));
            let command = command_line(&spec.config.command_words(Some(&runs), None));
            let verdict =
                results::RunVerdict::Skipped(format!("the {} s budget would be exceeded", suite.time_budget_s));
            entries.push(Entry {
                index,
                name: run.name.clone(),
                seed,
                expect: run.expect,
                verdict,
                passed: false,
                command,
                report: None,
                bugs: run.bugs(),
                checkers: vec![],
                duration_ms: None,
            });
            continue;
        }
        let (program, out) = (program.to_path_buf(), store.to_path_buf());
        running.spawn(async move {
            let began = Instant::now();
            let cell = run_child(&program, &out.join("runs"), &spec).await;
            let duration_ms = Some(began.elapsed().as_millis() as u64);
            let passed = cell.verdict.is(run.expect);
            let report = cell
                .folder
                .as_ref()
                .map(|folder| relative(&out, &runfolder::folder::RunFolder::at(folder).report_path()));
            let bugs = run.bugs();
            Entry {
                index,
                name: run.name,
                seed,
                expect: run.expect,
                verdict: cell.verdict,
                passed,
                command: cell.command,
                report,
                bugs,
                checkers: cell.checkers,
                duration_ms,
            }
        });
    }
    while let Some(entry) = running.join_next().await {
        entries.push(entry.expect("an entry task"));
    }
    entries.sort_by_key(|entry| entry.index);
    SuiteResult { suite: suite.name.clone(), entries }
}

/// Joins shard results into one, in suite order. Each result comes with the folder it was
/// read from; report links are rewritten to be relative to `out`.
pub fn merge(results: Vec<(PathBuf, SuiteResult)>, out: &Path) -> Result<SuiteResult, CampaignError> {
    let suite = results.first().map(|(_, result)| result.suite.clone()).ok_or(CampaignError::NothingToMerge)?;
    if let Some((folder, other)) = results.iter().find(|(_, result)| result.suite != suite) {
        let (other, folder) = (other.suite.clone(), folder.clone());
        return Err(CampaignError::DifferentSuites { suite, other, folder });
    }
    let mut entries: Vec<(PathBuf, Entry)> = Vec::new();
    for (folder, result) in results {
        for mut entry in result.entries {
            entry.report = entry.report.take().map(|report| relative(out, &folder.join(report)));
            entries.push((folder.clone(), entry));
        }
    }
    entries.sort_by_key(|(_, entry)| entry.index);
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].1.index == pair[1].1.index) {
        let ((first, entry), (second, _)) = (&pair[0], &pair[1]);
        return Err(CampaignError::EntryTwice {
            index: entry.index,
            name: entry.name.clone(),
            seed: entry.seed,
            first: first.clone(),
            second: second.clone(),
        });
    }
    Ok(SuiteResult { suite, entries: entries.into_iter().map(|(_, entry)| entry).collect() })
}

/// A path to `target` relative to the folder `from` (both made absolute first).
pub fn relative(from: &Path, target: &Path) -> PathBuf {
    let absolute = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let (from, target) = (absolute(from), absolute(target));
    let common = from.components().zip(target.components()).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in from.components().skip(common) {
        path.push("..");
    }
    path.extend(target.components().skip(common));
    path
}

/// Writes `suite.json`, `index.html` and `junit.xml` into `out`.
pub fn write(result: &SuiteResult, out: &Path) -> std::io::Result<()> {
    write_with_trends(result, out, "")
}

/// As [`write`], with a trends section on the index page.
pub fn write_with_trends(result: &SuiteResult, out: &Path, trends: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("suite.json"), serde_json::to_vec_pretty(result).map_err(std::io::Error::other)?)?;
    std::fs::write(out.join("index.html"), index_html_with_trends(result, trends))?;
    std::fs::write(out.join("junit.xml"), junit_xml(result))
}

/// Reads a `suite.json` written by [`write`].
pub fn read_result(folder: &Path) -> Result<SuiteResult, CampaignError> {
    let path = folder.join("suite.json");
    let text = std::fs::read_to_string(&path).map_err(|error| CampaignError::io(&path, error))?;
    serde_json::from_str(&text).map_err(|source| CampaignError::Json { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUITE: &str = r#"
name = "small"
time_budget_s = 600
[[run]]
name = "a"
seeds = [1, 2, 3]
time_limit = 5
[[run]]
name = "b"
nemesis = "kill"
bugs = ["requeue-on-expiry"]
seeds = [7]
expect = "invalid"
"#;

    fn suite() -> Suite {
        let configure = |run: &SuiteRun| Ok(RunConfig { test_name: run.name.clone(), ..RunConfig::default() });
        typed(toml::from_str(SUITE).unwrap(), configure).unwrap()
    }

    #[test]
    fn shards_split_the_plan_without_overlap_or_loss() {
        let whole: Vec<usize> = plan(&suite(), None).into_iter().map(|(index, _, _)| index).collect();
        assert_eq!(whole, vec![0, 1, 2, 3]);
        let mut joined: Vec<usize> =
            (1..=3).flat_map(|i| plan(&suite(), Some((i, 3))).into_iter().map(|(index, _, _)| index)).collect();
        joined.sort();
        assert_eq!(joined, whole);
        assert_eq!(plan(&suite(), Some((2, 3)))[0].2, 2, "shard 2 of 3 takes the second entry, seed 2");
    }

    #[test]
    fn bad_shards_and_bad_suites_are_refused() {
        for bad in ["0/2", "3/2", "1", "a/b", "1/0"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_shard("2/4").unwrap(), (2, 4));
        assert!(toml::from_str::<SuiteFile>("name = \"x\"\n[[run]]\nname = \"a\"\nseeds = [1]\ncolour = 1\n").is_err());
    }

    fn entry(index: usize, passed: bool) -> Entry {
        let verdict =
            results::RunVerdict::Checked(if passed { results::Overall::Valid } else { results::Overall::Invalid });
        Entry {
            index,
            name: "a".into(),
            seed: index as u64,
            expect: results::Overall::Valid,
            verdict,
            passed,
            command: "fencelab run".into(),
            report: Some("runs/x/report.html".into()),
            bugs: vec![],
            checkers: vec![],
            duration_ms: Some(31_500),
        }
    }

    #[test]
    fn merge_restores_suite_order_and_refuses_overlaps() {
        let out = Path::new("/merged");
        let first = SuiteResult { suite: "s".into(), entries: vec![entry(0, true), entry(2, false)] };
        let second = SuiteResult { suite: "s".into(), entries: vec![entry(1, true)] };
        let merged = merge(vec![("/s1".into(), first.clone()), ("/s2".into(), second)], out).unwrap();
        assert_eq!(
            merged.table().iter().map(|row| (row.0, row.3)).collect::<Vec<_>>(),
            vec![(0, true), (1, true), (2, false)]
        );
        assert_eq!(merged.entries[1].report.as_deref(), Some(Path::new("../s2/runs/x/report.html")));
        assert_eq!(exit(&merged), history::Exit::Invalid);
        let error = merge(vec![("/s1".into(), first.clone()), ("/s3".into(), first)], out).unwrap_err().to_string();
        assert!(error.contains("entry 0 (`a`, seed 0)") && error.contains("/s1") && error.contains("/s3"), "{error}");
    }

    #[test]
    fn junit_counts_failures_and_skips() {
        let mut skipped = entry(1, false);
        skipped.verdict = results::RunVerdict::Skipped("budget".into());
        let result = SuiteResult { suite: "s<&>".into(), entries: vec![entry(0, false), skipped, entry(2, true)] };
        let xml = junit_xml(&result);
        for counted in ["tests=\"3\"", "failures=\"1\"", "skipped=\"1\""] {
            assert!(xml.contains(counted), "{counted} in {xml}");
        }
        assert!(xml.contains("fencelab.suite.s&lt;&amp;&gt;"), "{xml}");
        // Each case: its entry's class, its time, and properties a CI system shows.
        assert!(xml.contains("classname=\"fencelab.suite.s&lt;&amp;&gt;.a\""), "{xml}");
        assert!(xml.contains("time=\"31.500\""), "{xml}");
        for property in [
            "name=\"seed\" value=\"2\"",
            "name=\"command\" value=\"fencelab run\"",
            "name=\"report\" value=\"runs/x/report.html\"",
        ] {
            assert!(xml.contains(property), "{property} in {xml}");
        }
        assert!(xml.contains("report: runs/x/report.html"), "the report's link in system-out: {xml}");
        assert_eq!(exit(&result), history::Exit::Invalid);
    }
}
