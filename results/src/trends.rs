//! Nightly trends for a suite's index page: per run (name and seed) its outcome over the last
//! nights and since when it has been failing; per planted bug and per checker the detection
//! rate night by night; and the false alarms (a correct lab judged invalid) per night.
//!
//! Pure: the harness reads earlier suite outputs and hands them in as [`Night`]s, oldest
//! first, tonight last; this renders one HTML section.

use crate::escape::html as esc;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// What one suite run (a night) said about each of its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Night {
    /// How the night is named on the page (its folder, or its start time).
    pub label: String,
    pub runs: Vec<NightRun>,
}

/// One entry of a night.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NightRun {
    pub name: String,
    pub seed: u64,
    pub outcome: NightResult,
    /// The verdict as the suite wrote it.
    pub verdict: crate::RunVerdict,
    /// The planted bugs (empty: the correct lab).
    pub bugs: Vec<String>,
    /// The checkers that found anomalies.
    pub checkers: Vec<String>,
}

/// How an entry came out on a night.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NightResult {
    Pass,
    Fail,
    /// Skipped, or the verdict was unknown.
    Unknown,
}

impl NightResult {
    /// From a suite entry: passed, or its verdict (`unknown` and `skipped: …` are unknown).
    pub fn of(passed: bool, verdict: &crate::RunVerdict) -> NightResult {
        if passed {
            NightResult::Pass
        } else if verdict.is(crate::Overall::Unknown) || verdict.is_skipped() {
            NightResult::Unknown
        } else {
            NightResult::Fail
        }
    }

    fn class(self) -> &'static str {
        match self {
            NightResult::Pass => "pass",
            NightResult::Fail => "fail",
            NightResult::Unknown => "unknown",
        }
    }

    fn mark(self) -> &'static str {
        match self {
            NightResult::Pass => "✓",
            NightResult::Fail => "✗",
            NightResult::Unknown => "?",
        }
    }
}

impl NightRun {
    fn detected(&self) -> bool {
        self.verdict.is(crate::Overall::Invalid)
    }

    /// Skipped entries did not run: they count in no detection rate.
    fn ran(&self) -> bool {
        !self.verdict.is_skipped()
    }
}

/// Per run (name, seed): its outcome on each night (`None`: not in that night's suite).
pub fn outcomes(nights: &[Night]) -> BTreeMap<(String, u64), Vec<Option<NightResult>>> {
    let mut rows: BTreeMap<(String, u64), Vec<Option<NightResult>>> = BTreeMap::new();
    for (k, night) in nights.iter().enumerate() {
        for run in &night.runs {
            rows.entry((run.name.clone(), run.seed)).or_insert_with(|| vec![None; nights.len()])[k] = Some(run.outcome);
        }
    }
    rows
}

/// Since which night a run has been failing (the start of its last run of failures up to
/// tonight, nights without a pass not breaking it), when it fails tonight; `None` otherwise.
pub fn failing_since(row: &[Option<NightResult>]) -> Option<usize> {
    if row.last().copied().flatten() != Some(NightResult::Fail) {
        return None;
    }
    let mut since = row.len() - 1;
    for k in (0..row.len()).rev() {
        match row[k] {
            Some(NightResult::Pass) => break,
            Some(NightResult::Fail) => since = k,
            _ => {}
        }
    }
    Some(since)
}

/// Per planted bug, per night: (entries where it was caught, entries planting it that ran).
pub fn bug_detection(nights: &[Night]) -> BTreeMap<String, Vec<(usize, usize)>> {
    let mut rates: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
    for (k, night) in nights.iter().enumerate() {
        for run in night.runs.iter().filter(|r| r.ran()) {
            for bug in &run.bugs {
                let cell = &mut rates.entry(bug.clone()).or_insert_with(|| vec![(0, 0); nights.len()])[k];
                cell.1 += 1;
                cell.0 += run.detected() as usize;
            }
        }
    }
    rates
}

/// Per checker, per night: (entries with a planted bug where it found anomalies, entries with
/// a planted bug that ran).
pub fn checker_detection(nights: &[Night]) -> BTreeMap<String, Vec<(usize, usize)>> {
    let names: BTreeSet<&String> = nights.iter().flat_map(|n| &n.runs).flat_map(|r| &r.checkers).collect();
    let mut rates: BTreeMap<String, Vec<(usize, usize)>> =
        names.into_iter().map(|name| (name.clone(), vec![(0, 0); nights.len()])).collect();
    for (k, night) in nights.iter().enumerate() {
        let planted: Vec<&NightRun> = night.runs.iter().filter(|r| !r.bugs.is_empty() && r.ran()).collect();
        for (name, cells) in rates.iter_mut() {
            cells[k] = (planted.iter().filter(|r| r.checkers.contains(name)).count(), planted.len());
        }
    }
    rates
}

/// Per night: entries of the correct lab (no planted bug) judged invalid.
pub fn false_alarms(nights: &[Night]) -> Vec<usize> {
    nights.iter().map(|n| n.runs.iter().filter(|r| r.bugs.is_empty() && r.detected()).count()).collect()
}

fn header(out: &mut String, first: &str, nights: &[Night], last: &str) {
    let _ = write!(out, "<thead><tr><th>{first}</th>");
    for (k, night) in nights.iter().enumerate() {
        let tonight = if k + 1 == nights.len() { " class=\"tonight\"" } else { "" };
        let _ = write!(out, "<th{tonight} title=\"{}\">{}</th>", esc(&night.label), esc(&short(&night.label)));
    }
    if !last.is_empty() {
        let _ = write!(out, "<th>{last}</th>");
    }
    out.push_str("</tr></thead>\n");
}

/// A night's label shortened for a column head (its last path part, at most 16 characters).
fn short(label: &str) -> String {
    let last = label.rsplit('/').next().unwrap_or(label);
    last.chars().rev().take(16).collect::<Vec<_>>().into_iter().rev().collect()
}

fn rate_cell(out: &mut String, (hit, of): (usize, usize)) {
    if of == 0 {
        out.push_str("<td class=\"none\">—</td>");
    } else {
        let class = if hit == of {
            "pass"
        } else if hit == 0 {
            "fail"
        } else {
            "partial"
        };
        let _ = write!(out, "<td class=\"{class}\">{hit}/{of}</td>");
    }
}

/// The trends section of a suite's index page: nights oldest first, tonight last.
pub fn trends_html(nights: &[Night]) -> String {
    let mut out = String::from("<section id=\"trends\">\n");
    let _ = writeln!(
        out,
        "<h2>Trends over the last {} nights</h2>\n<p class=\"caption\">Oldest first; the last column is this suite. \
         ✓ pass, ✗ fail, ? unknown (skipped, or no verdict), — not run that night.</p>",
        nights.len()
    );
    let labels: Vec<&str> = nights.iter().map(|n| n.label.as_str()).collect();
    out.push_str("<table class=\"trend\" id=\"trend-runs\">\n");
    header(&mut out, "run", nights, "failing");
    out.push_str("<tbody>\n");
    for ((name, seed), row) in outcomes(nights) {
        let _ = write!(out, "<tr><td>{} s{seed}</td>", esc(&name));
        for cell in &row {
            match cell {
                Some(o) => {
                    let _ = write!(out, "<td class=\"{}\">{}</td>", o.class(), o.mark());
                }
                None => out.push_str("<td class=\"none\">—</td>"),
            }
        }
        let since = match failing_since(&row) {
            Some(k) => format!("failing since {}", labels[k]),
            None => match row.iter().rposition(|c| *c == Some(NightResult::Fail)) {
                Some(k) => format!("last failed {}", labels[k]),
                None => "no failure".to_string(),
            },
        };
        let _ = writeln!(out, "<td class=\"since\">{}</td></tr>", esc(&since));
    }
    out.push_str("</tbody>\n</table>\n");
    let bugs = bug_detection(nights);
    out.push_str("<h3>Detection per planted bug</h3>\n<table class=\"trend\" id=\"trend-bugs\">\n");
    header(&mut out, "bug", nights, "");
    out.push_str("<tbody>\n");
    for (bug, cells) in &bugs {
        let _ = write!(out, "<tr><td>{}</td>", esc(bug));
        for &cell in cells {
            rate_cell(&mut out, cell);
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out.push_str(
        "<h3>Detection per checker</h3>\n<p class=\"caption\">Runs with a planted bug in which the checker found \
         anomalies, of all runs with a planted bug that night.</p>\n<table class=\"trend\" id=\"trend-checkers\">\n",
    );
    header(&mut out, "checker", nights, "");
    out.push_str("<tbody>\n");
    for (checker, cells) in checker_detection(nights) {
        let _ = write!(out, "<tr><td>{}</td>", esc(&checker));
        for cell in cells {
            let _ = write!(out, "<td>{}/{}</td>", cell.0, cell.1);
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    let alarms = false_alarms(nights);
    let _ = write!(
        out,
        "<h3>False alarms</h3>\n<p id=\"false-alarms\">{} in all: runs of the correct lab judged invalid.</p>\n\
         <table class=\"trend\" id=\"trend-false-alarms\">\n",
        alarms.iter().sum::<usize>()
    );
    header(&mut out, "", nights, "");
    out.push_str("<tbody><tr><td>false alarms</td>");
    for n in alarms {
        let class = if n == 0 { "pass" } else { "fail" };
        let _ = write!(out, "<td class=\"{class}\">{n}</td>");
    }
    out.push_str("</tr></tbody>\n</table>\n</section>\n");
    out
}

/// The styles of the trends section.
pub const TRENDS_CSS: &str = "table.trend{border-collapse:collapse;margin:.4em 0}table.trend td,table.trend th{border:1px solid #ddd;\
padding:.1em .4em;text-align:center}table.trend td:first-child{text-align:left}td.pass{background:#e8f5e9;color:#1b5e20}\
td.fail{background:#ffebee;color:#b71c1c;font-weight:bold}td.unknown{background:#eceff1;color:#455a64}\
td.partial{background:#fff8e1}td.none{color:#aaa}th.tonight{background:#e3f2fd}table.trend td.since{text-align:left}";

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, seed: u64, outcome: NightResult, verdict: &str, bugs: &[&str], checkers: &[&str]) -> NightRun {
        NightRun {
            name: name.into(),
            seed,
            outcome,
            verdict: crate::RunVerdict::parse(verdict).unwrap(),
            bugs: bugs.iter().map(|b| b.to_string()).collect(),
            checkers: checkers.iter().map(|c| c.to_string()).collect(),
        }
    }

    /// Four nights: `correct` passes, fails (a false alarm), is skipped, fails again; the
    /// planted `stale` bug is caught on three nights of four, `overwrite` appears on the last two.
    fn nights() -> Vec<Night> {
        use NightResult::*;
        let caught = |seed| run("stale", seed, Pass, "invalid", &["accept-stale-result"], &["stale-completion"]);
        let missed = |seed| run("stale", seed, Fail, "valid", &["accept-stale-result"], &[]);
        let overwrite = run("overwrite", 1, Pass, "invalid", &["overwrite-terminal-result"], &["terminal-stability"]);
        vec![
            Night { label: "nights/d1".into(), runs: vec![run("correct", 1, Pass, "valid", &[], &[]), caught(1)] },
            Night {
                label: "nights/d2".into(),
                runs: vec![run("correct", 1, Fail, "invalid", &[], &["single-owner"]), missed(1)],
            },
            Night {
                label: "nights/d3".into(),
                runs: vec![run("correct", 1, Unknown, "skipped: budget", &[], &[]), caught(1), overwrite.clone()],
            },
            Night {
                label: "tonight".into(),
                runs: vec![run("correct", 1, Fail, "invalid", &[], &["single-owner"]), caught(1), overwrite],
            },
        ]
    }

    #[test]
    fn outcome_of_a_suite_entry() {
        assert_eq!(NightResult::of(true, &crate::RunVerdict::parse("invalid").unwrap()), NightResult::Pass);
        assert_eq!(NightResult::of(false, &crate::RunVerdict::parse("invalid").unwrap()), NightResult::Fail);
        assert_eq!(
            NightResult::of(false, &crate::RunVerdict::parse("error: no results.json").unwrap()),
            NightResult::Fail
        );
        assert_eq!(NightResult::of(false, &crate::RunVerdict::parse("unknown").unwrap()), NightResult::Unknown);
        assert_eq!(
            NightResult::of(false, &crate::RunVerdict::parse("skipped: the 60 s budget would be exceeded").unwrap()),
            NightResult::Unknown
        );
    }

    #[test]
    fn failing_since_is_the_start_of_the_last_failures_unknowns_not_breaking_them() {
        use NightResult::*;
        assert_eq!(failing_since(&[Some(Pass), Some(Fail), Some(Unknown), Some(Fail)]), Some(1));
        assert_eq!(failing_since(&[Some(Fail), Some(Pass), None, Some(Fail)]), Some(3));
        assert_eq!(failing_since(&[Some(Fail), Some(Pass)]), None);
        assert_eq!(failing_since(&[Some(Fail), Some(Fail)]), Some(0));
    }

    #[test]
    fn rates_and_false_alarms_per_night() {
        let nights = nights();
        let bugs = bug_detection(&nights);
        assert_eq!(bugs["accept-stale-result"], vec![(1, 1), (0, 1), (1, 1), (1, 1)]);
        assert_eq!(bugs["overwrite-terminal-result"], vec![(0, 0), (0, 0), (1, 1), (1, 1)]);
        let checkers = checker_detection(&nights);
        assert_eq!(checkers["stale-completion"], vec![(1, 1), (0, 1), (1, 2), (1, 2)]);
        assert_eq!(checkers["single-owner"], vec![(0, 1), (0, 1), (0, 2), (0, 2)], "only planted runs count");
        assert_eq!(false_alarms(&nights), vec![0, 1, 0, 1]);
    }

    #[test]
    fn the_section_shows_every_night_per_run_and_since_when_it_fails() {
        let html = trends_html(&nights());
        assert!(html.contains("Trends over the last 4 nights"));
        assert!(
            html.contains(
                "<tr><td>correct s1</td><td class=\"pass\">✓</td><td class=\"fail\">✗</td><td class=\"unknown\">?</td>\
             <td class=\"fail\">✗</td><td class=\"since\">failing since nights&#47;d2</td></tr>"
            ),
            "{html}"
        );
        assert!(html.contains(
            "<tr><td>overwrite s1</td><td class=\"none\">—</td><td class=\"none\">—</td><td class=\"pass\">✓</td>\
             <td class=\"pass\">✓</td><td class=\"since\">no failure</td></tr>"
        ));
        assert!(html.contains("<td class=\"since\">last failed nights&#47;d2</td>"), "stale passes tonight");
        assert!(html.contains("<tr><td>accept-stale-result</td><td class=\"pass\">1/1</td><td class=\"fail\">0/1</td>"));
        assert!(html.contains("<p id=\"false-alarms\">2 in all"));
        assert!(html.contains("<th class=\"tonight\" title=\"tonight\">tonight</th><th>failing</th>"));
    }
}
