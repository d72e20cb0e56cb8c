//! `junit.xml`: the checkers as JUnit test cases, so CI shows a run's verdict natively.
//!
//! One `<testsuite>`; one `<testcase>` per checker. Invalid → `<failure type="invalid">` with
//! one line per anomaly; Unknown → `<error type="unknown">` (not `<skipped>`: an unknown
//! verdict fails the run with exit code 2, and CI must not show it as a pass).

use crate::escape::{xml, xml_body};
use crate::story::{self, Story};
use crate::{anomalies_of, Run};
use checkers::{Anomaly, CheckerResult, Verdict};
use history::Event;
use std::fmt::Write;

/// Renders `junit.xml` without anomaly stories.
pub fn junit_xml(run: &Run) -> String {
    render(run, &[])
}

/// Renders `junit.xml` with each anomaly's story (from the run's history): the first
/// anomaly's story in the failure message, every story under its anomaly's line in the body.
pub fn junit_xml_with_stories(run: &Run, events: &[Event]) -> String {
    render(run, &story::stories(run, events))
}

fn render(run: &Run, stories: &[Story]) -> String {
    let failures = run.checkers.iter().filter(|c| matches!(c.verdict, Verdict::Invalid { .. })).count();
    let errors = run.checkers.iter().filter(|c| matches!(c.verdict, Verdict::Unknown { .. })).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuite name=\"fencelab.{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" \
         skipped=\"0\" time=\"{}\" timestamp=\"{}\">",
        xml(&run.test_name),
        run.checkers.len(),
        seconds(run.duration_ms),
        xml(&run.started_at),
    );
    out.push_str("  <properties>\n");
    let overall = run.overall();
    for (name, value) in [
        ("seed", run.seed.to_string()),
        ("command", run.command.clone()),
        ("started_at", run.started_at.clone()),
        ("overall", overall.to_string()),
        ("exit_code", overall.exit_code().to_string()),
    ] {
        let _ = writeln!(out, "    <property name=\"{name}\" value=\"{}\"/>", xml(&value));
    }
    out.push_str("  </properties>\n");
    let mut first = 0;
    for checker in &run.checkers {
        let count = anomalies_of(checker).len();
        let told = stories.iter().filter(|s| s.anomaly >= first && s.anomaly < first + count).collect::<Vec<_>>();
        testcase(&mut out, checker, &told);
        first += count;
    }
    out.push_str("</testsuite>\n");
    out
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

fn testcase(out: &mut String, checker: &CheckerResult, stories: &[&Story]) {
    let _ = write!(out, "  <testcase name=\"{}\" classname=\"fencelab.checkers\" time=\"0\"", xml(&checker.checker));
    match &checker.verdict {
        Verdict::Valid => out.push_str("/>\n"),
        Verdict::Invalid { .. } => {
            let anomalies = anomalies_of(checker);
            let first = anomalies.first().map(|a| a.message.as_str()).unwrap_or("invalid");
            let mut message =
                format!("{} anomal{}: {first}", anomalies.len(), if anomalies.len() == 1 { "y" } else { "ies" });
            if let Some(story) = stories.first() {
                message.push_str("\nthe story:");
                for line in story.lines() {
                    let _ = write!(message, "\n{line}");
                }
            }
            let mut body: Vec<String> = Vec::new();
            for (k, a) in anomalies.iter().enumerate() {
                body.push(anomaly_line(a));
                if let Some(story) = stories.get(k) {
                    body.extend(story.lines().into_iter().map(|line| format!("    {line}")));
                }
            }
            let _ = write!(
                out,
                ">\n    <failure message=\"{}\" type=\"invalid\">{}</failure>\n  </testcase>\n",
                xml(&message),
                xml_body(&body.join("\n")),
            );
        }
        Verdict::Unknown { reason } => {
            let _ = write!(
                out,
                ">\n    <error message=\"{}\" type=\"unknown\">{}</error>\n  </testcase>\n",
                xml(reason),
                xml_body(reason),
            );
        }
    }
}

/// One anomaly as one line: `[kind] message (events: 3, 7)`.
fn anomaly_line(a: &Anomaly) -> String {
    let events: Vec<String> = a.events.iter().map(u64::to_string).collect();
    let message = a.message.replace(['\n', '\r'], " ");
    format!("[{}] {message} (events: {})", a.kind, events.join(", "))
}
