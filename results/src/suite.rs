//! A suite's outputs, pure: its entries and result (what `suite.json` holds, read back
//! through the same types), the index page and the aggregated JUnit file. The harness runs
//! the suite and writes these files.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One run's place in the suite and what came of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Position in the whole (unsharded) suite.
    pub index: usize,
    pub name: String,
    pub seed: u64,
    pub expect: crate::Overall,
    /// The checked verdict, `error: ...`, or `skipped: ...`.
    pub verdict: crate::RunVerdict,
    pub passed: bool,
    pub command: String,
    /// The run's report, relative to the suite's output folder, when it ran.
    pub report: Option<PathBuf>,
    /// The planted bugs (empty: the correct lab); absent in older suite.json files.
    #[serde(default)]
    pub bugs: Vec<String>,
    /// The checkers that found anomalies; absent in older suite.json files.
    #[serde(default)]
    pub checkers: Vec<String>,
    /// How long the run took, start to checked; absent when it did not run, and in older
    /// suite.json files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuiteResult {
    pub suite: String,
    pub entries: Vec<Entry>,
}

impl SuiteResult {
    /// The pass/fail table: (index, name, seed, passed), in suite order.
    pub fn table(&self) -> Vec<(usize, String, u64, bool)> {
        self.entries.iter().map(|entry| (entry.index, entry.name.clone(), entry.seed, entry.passed)).collect()
    }
}

/// The index page: one table row per entry, linking its report.
pub fn index_html(result: &SuiteResult) -> String {
    index_html_with_trends(result, "")
}

/// The index page with a trends section (`results::trends::trends_html`) after the table.
pub fn index_html_with_trends(result: &SuiteResult, trends: &str) -> String {
    use crate::escape::html;
    let passed = result.entries.iter().filter(|entry| entry.passed).count();
    let mut rows = String::new();
    for entry in &result.entries {
        let report = entry.report.as_ref().map_or("—".to_string(), |report| {
            format!("<a href=\"{}\">report</a>", html(&report.display().to_string()))
        });
        let class = if entry.passed { "pass" } else { "fail" };
        rows.push_str(&format!(
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>\n",
            entry.index, html(&entry.name), entry.seed, html(entry.expect.as_str()), html(&entry.verdict.to_string()), report, html(&entry.command)
        ));
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>fencelab suite {name}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .6em;text-align:left}}\
         tr.pass td:nth-child(5){{color:#070}}tr.fail td:nth-child(5){{color:#b00;font-weight:bold}}{css}</style></head>\
         <body><h1>fencelab suite {name}</h1><p>{passed} of {total} passed</p><table>\
         <tr><th>#</th><th>run</th><th>seed</th><th>expected</th><th>verdict</th><th>report</th><th>repeat with</th></tr>\n{rows}</table>\n{trends}</body></html>\n",
        name = html(&result.suite),
        total = result.entries.len(),
        css = crate::trends::TRENDS_CSS,
    )
}

/// One aggregated JUnit file: a test case per run.
pub fn junit_xml(result: &SuiteResult) -> String {
    use crate::junit::{case, render, suite, Outcome};
    let name = format!("fencelab.suite.{}", result.suite);
    let mut cases = suite(&name, None, "", &[]);
    for entry in &result.entries {
        // One class per suite entry, so that a CI system groups an entry's seeds together.
        let classname = format!("{name}.{}", entry.name);
        let outcome = if entry.verdict.is_skipped() {
            Outcome::Skipped { message: entry.verdict.to_string() }
        } else if !entry.passed {
            let message = format!("expected {}, got {}; repeat with: {}", entry.expect, entry.verdict, entry.command);
            Outcome::Failed { kind: entry.verdict.to_string(), message, body: String::new() }
        } else {
            Outcome::Passed
        };
        let mut case = case(&format!("{}-s{}", entry.name, entry.seed), &classname, entry.duration_ms, outcome);
        let mut properties = vec![("seed", entry.seed.to_string()), ("command", entry.command.clone())];
        if let Some(report) = &entry.report {
            properties.push(("report", report.display().to_string()));
            case.set_system_out(format!("report: {}", report.display()));
        }
        properties.extend((!entry.bugs.is_empty()).then(|| ("bugs", entry.bugs.join(","))));
        properties.extend((!entry.checkers.is_empty()).then(|| ("checkers", entry.checkers.join(","))));
        for (property, value) in properties {
            case.add_property(quick_junit::Property::new(property, value));
        }
        cases.add_test_case(case);
    }
    render(&name, vec![cases])
}
