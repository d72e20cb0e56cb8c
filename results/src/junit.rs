//! The one JUnit model: every `junit.xml` fencelab writes — a run's, a suite's, conform's —
//! is a [`quick_junit::Report`] (the crate nextest writes its own with) built through
//! [`suite`] and [`case`] and rendered by [`render`], so the three cannot drift apart.
//!
//! A run's file has one `<testsuite>` with one `<testcase>` per checker. Invalid →
//! `<failure type="invalid">` with one line per anomaly; Unknown → `<error type="unknown">`
//! (not `<skipped>`: an unknown verdict fails the run with exit code 2, and CI must not
//! show it as a pass).

use std::time::Duration;

use crate::story::{self, Story};
use crate::{anomalies_of, Run};
use checkers::{Anomaly, CheckerResult, Verdict};
use history::Event;
use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};

/// How one test case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// A check that failed: `kind` is the `type` attribute (`invalid`, `fail`, a verdict).
    Failed {
        kind: String,
        message: String,
        body: String,
    },
    /// A check that could not decide (an unknown verdict): an error, never a pass.
    Errored {
        kind: String,
        message: String,
        body: String,
    },
    Skipped {
        message: String,
    },
}

/// A test suite named `name`, `started_at` its RFC 3339 start (empty: none).
pub fn suite(name: &str, duration_ms: Option<u64>, started_at: &str, properties: &[(&str, String)]) -> TestSuite {
    let mut suite = TestSuite::new(name);
    if let Some(ms) = duration_ms {
        suite.set_time(Duration::from_millis(ms));
    }
    if !started_at.is_empty() {
        suite.extra.insert("timestamp".into(), started_at.into());
    }
    for (name, value) in properties {
        suite.add_property(Property::new(*name, value.as_str()));
    }
    suite
}

/// A test case of `classname` that ended with `outcome` after `duration_ms`.
pub fn case(name: &str, classname: &str, duration_ms: Option<u64>, outcome: Outcome) -> TestCase {
    let status = match outcome {
        Outcome::Passed => TestCaseStatus::success(),
        Outcome::Failed { kind, message, body } => non_success(NonSuccessKind::Failure, kind, message, body),
        Outcome::Errored { kind, message, body } => non_success(NonSuccessKind::Error, kind, message, body),
        Outcome::Skipped { message } => {
            let mut status = TestCaseStatus::skipped();
            status.set_message(message);
            status
        }
    };
    let mut case = TestCase::new(name, status);
    case.set_classname(classname);
    if let Some(ms) = duration_ms {
        case.set_time(Duration::from_millis(ms));
    }
    case
}

fn non_success(kind: NonSuccessKind, ty: String, message: String, body: String) -> TestCaseStatus {
    let mut status = TestCaseStatus::non_success(kind);
    status.set_type(ty).set_message(message);
    if !body.is_empty() {
        status.set_description(body);
    }
    status
}

/// The XML of a report holding `suites`, named `name`.
pub fn render(name: &str, suites: Vec<TestSuite>) -> String {
    let mut report = Report::new(name);
    for mut suite in suites {
        // quick-junit counts skipped cases as `disabled`; CI readers look for `skipped`.
        let skipped =
            suite.test_cases.iter().filter(|case| matches!(case.status, TestCaseStatus::Skipped { .. })).count();
        suite.extra.insert("skipped".into(), skipped.to_string().into());
        report.add_test_suite(suite);
    }
    // Serialising strings built here into memory cannot fail but for a bug in the writer.
    report.to_string().expect("a JUnit report renders")
}

/// Renders `junit.xml` without anomaly stories.
pub fn junit_xml(run: &Run) -> String {
    render_run(run, history::sources_of(&[]), &[])
}

/// Renders `junit.xml` with each anomaly's story (from the run's history): the first
/// anomaly's story in the failure message, every story under its anomaly's line in the body.
pub fn junit_xml_with_stories(run: &Run, events: &[Event]) -> String {
    let digest = crate::Digest::of(events);
    junit_xml_of(run, &crate::View { events, digest: &digest, one_in: None })
}

/// Renders `junit.xml` with the stories told from a [`crate::View`]'s events.
pub fn junit_xml_of(run: &Run, view: &crate::View) -> String {
    render_run(run, view.digest.sources(), &story::stories(run, view.events))
}

fn render_run(run: &Run, sources: std::collections::BTreeSet<history::Source>, stories: &[Story]) -> String {
    let overall = run.overall();
    let sources: Vec<&str> = sources.iter().map(|source| source.as_str()).collect();
    let properties = [
        ("seed", run.seed.to_string()),
        ("command", run.command.clone()),
        ("started_at", run.started_at.clone()),
        ("overall", overall.to_string()),
        ("exit_code", overall.exit().code().to_string()),
        ("sources", sources.join(",")),
    ];
    let name = format!("fencelab.{}", run.test_name);
    let mut suite = suite(&name, Some(run.duration_ms), &run.started_at, &properties);
    let mut first = 0;
    for checker in &run.checkers {
        let count = anomalies_of(checker).len();
        let told = stories.iter().filter(|s| s.anomaly >= first && s.anomaly < first + count).collect::<Vec<_>>();
        suite.add_test_case(testcase(checker, &told));
        first += count;
    }
    render(&name, vec![suite])
}

fn testcase(checker: &CheckerResult, stories: &[&Story]) -> TestCase {
    let outcome = match &checker.verdict {
        Verdict::Valid => Outcome::Passed,
        Verdict::Invalid { .. } => {
            let anomalies = anomalies_of(checker);
            let first = anomalies.first().map(|a| a.message.as_str()).unwrap_or("invalid");
            let mut message =
                format!("{} anomal{}: {first}", anomalies.len(), if anomalies.len() == 1 { "y" } else { "ies" });
            if let Some(story) = stories.first() {
                message.push_str("\nthe story:");
                for line in story.lines() {
                    message.push('\n');
                    message.push_str(&line);
                }
            }
            let mut body: Vec<String> = Vec::new();
            for (k, a) in anomalies.iter().enumerate() {
                body.push(anomaly_line(a));
                if let Some(story) = stories.get(k) {
                    body.extend(story.lines().into_iter().map(|line| format!("    {line}")));
                }
            }
            Outcome::Failed { kind: "invalid".into(), message, body: body.join("\n") }
        }
        Verdict::Unknown { reason } => {
            Outcome::Errored { kind: "unknown".into(), message: reason.clone(), body: reason.clone() }
        }
    };
    case(&checker.checker, "fencelab.checkers", Some(0), outcome)
}

/// One anomaly as one line: `[kind] message (events: 3, 7)`.
fn anomaly_line(a: &Anomaly) -> String {
    let events: Vec<String> = a.events.iter().map(u64::to_string).collect();
    let message = a.message.replace(['\n', '\r'], " ");
    format!("[{}] {message} (events: {})", a.kind, events.join(", "))
}
