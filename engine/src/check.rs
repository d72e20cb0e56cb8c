//! Checking a run folder: read its history, run every checker, and write `results.json`,
//! `report.html` and `junit.xml` next to it. Used at the end of `fencelab run` and by
//! `fencelab check RUN_FOLDER`. A history that cannot be read is checked as unknown, with
//! the line that could not be read, never as valid.

use std::path::Path;

use results::{Overall, Run};

/// What `run.json` holds: how the run was made, written when it ends.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunMeta {
    pub command: String,
    pub started_at: String,
    pub duration_ms: u64,
    pub complete: bool,
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))
}

/// Reads a history file through the typed vocabulary; the error names the file and line.
pub fn read_history(path: &Path) -> Result<Vec<history::Event>, String> {
    let file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    history::read(file).map_err(|error| format!("{}: {error}", path.display()))
}

/// Checks the history in `folder` and writes the three reports; returns the verdict.
pub fn check_folder(folder: &Path) -> anyhow::Result<(Overall, Run)> {
    let (events, checkers) = match read_history(&folder.join("history.jsonl")) {
        Ok(events) => {
            let checkers = checkers::check_all(&events);
            (events, checkers)
        }
        Err(why) => (Vec::new(), checkers::unreadable(&why)),
    };
    let config = read_json(&folder.join("config.json"))?;
    let schedule = read_json(&folder.join("schedule.json"))?;
    let meta: RunMeta = serde_json::from_value(read_json(&folder.join("run.json"))?)?;
    let run = Run {
        test_name: config["test_name"].as_str().unwrap_or("unknown").to_string(),
        seed: config["seed"].as_u64().unwrap_or(0),
        command: meta.command,
        started_at: meta.started_at,
        duration_ms: meta.duration_ms,
        config,
        schedule,
        checkers,
        complete: meta.complete,
    };
    std::fs::write(folder.join("results.json"), results::results_json(&run, &events))?;
    std::fs::write(folder.join("report.html"), results::report_html(&run, &events))?;
    std::fs::write(folder.join("junit.xml"), results::junit_xml_with_stories(&run, &events))?;
    Ok((run.overall(), run))
}
