//! `fencelab diff`: what differs between two runs — verdicts, anomalies by checker and kind,
//! the fault schedule, the flags of their repeat commands, timings and counts — for "it
//! passed yesterday, what changed?".
//!
//! Pure: two runs' results (read back through [`ResultsDoc`]) and fault schedules in, text
//! out. Reading the folders is the harness's.

use crate::json::ResultsDoc;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// One side of a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Side {
    /// How the run is named in the output (its folder).
    pub label: String,
    pub results: ResultsDoc,
    /// The realised fault schedule, one line per fault; `None` when it could not be read.
    pub faults: Option<Vec<FaultLine>>,
}

/// One fault of a schedule, as compared.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FaultLine {
    pub at_ms: u64,
    pub duration_ms: u64,
    pub kind: String,
    /// The runner it hits, by name (`r1`: the schedule numbers runners from 0), if any.
    pub runner: Option<String>,
    /// The fault's variant, as text.
    pub variant: String,
}

impl std::fmt::Display for FaultLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runner = self.runner.as_deref().map(|r| format!(" on {r}")).unwrap_or_default();
        write!(f, "at {} ms for {} ms: {}{runner} {}", self.at_ms, self.duration_ms, self.kind, self.variant)
    }
}

/// The `--flag value` pairs of a repeat command (a flag without a value maps to "").
pub fn flags(command: &str) -> BTreeMap<String, Vec<String>> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut i = 0;
    while i < words.len() {
        if let Some(flag) = words[i].strip_prefix("--") {
            let value = words.get(i + 1).filter(|w| !w.starts_with("--"));
            flags.entry(flag.to_string()).or_default().push(value.map(|v| v.to_string()).unwrap_or_default());
            i += 1 + value.is_some() as usize;
        } else {
            i += 1;
        }
    }
    flags
}

/// (checker, kind) → number of anomalies.
fn anomaly_kinds(doc: &ResultsDoc) -> BTreeMap<(String, String), usize> {
    let mut kinds = BTreeMap::new();
    for checker in &doc.checkers {
        for a in &checker.anomalies {
            *kinds.entry((checker.checker.clone(), a.kind.clone())).or_default() += 1;
        }
    }
    kinds
}

fn checker_state(doc: &ResultsDoc, name: &str) -> String {
    match doc.checkers.iter().find(|c| c.checker == name) {
        None => "absent".into(),
        Some(c) if c.verdict == "invalid" => format!("invalid ({} anomalies)", c.anomaly_count),
        Some(c) => match &c.reason {
            Some(reason) => format!("{} ({reason})", c.verdict),
            None => c.verdict.clone(),
        },
    }
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn number_line(out: &mut String, name: &str, a: String, b: String) -> bool {
    if a == b {
        return false;
    }
    let delta = match (a.parse::<i64>(), b.parse::<i64>()) {
        (Ok(x), Ok(y)) => format!("  ({:+})", y - x),
        _ => String::new(),
    };
    let _ = writeln!(out, "  {name:<28} {a} → {b}{delta}");
    true
}

/// What differs between `a` and `b`, as text; the last line says how many sections differ.
pub fn diff_text(a: &Side, b: &Side) -> String {
    let (ra, rb) = (&a.results, &b.results);
    let mut out = String::new();
    let _ = writeln!(out, "A  {}  seed {}, {}, {} ms", a.label, ra.seed, ra.overall, ra.duration_ms);
    let _ = writeln!(out, "B  {}  seed {}, {}, {} ms", b.label, rb.seed, rb.overall, rb.duration_ms);
    let mut differing = Vec::new();

    let mut section = String::new();
    if ra.overall != rb.overall {
        let _ = writeln!(section, "  overall                      {} → {}", ra.overall, rb.overall);
    }
    let names: BTreeSet<&str> = ra.checkers.iter().chain(&rb.checkers).map(|c| c.checker.as_str()).collect();
    for name in names {
        let (x, y) = (checker_state(ra, name), checker_state(rb, name));
        if x != y {
            let _ = writeln!(section, "  {name:<28} {x} → {y}");
        }
    }
    push_section(&mut out, &mut differing, "verdicts", section);

    let (ka, kb) = (anomaly_kinds(ra), anomaly_kinds(rb));
    let mut section = String::new();
    for key in ka.keys().chain(kb.keys()).collect::<BTreeSet<_>>() {
        let (x, y) = (ka.get(key).copied().unwrap_or(0), kb.get(key).copied().unwrap_or(0));
        if x != y {
            let _ = writeln!(section, "  {:<28} {x} → {y}", format!("{} / {}", key.0, key.1));
        }
    }
    push_section(&mut out, &mut differing, "anomalies by checker and kind", section);

    let mut section = String::new();
    match (&a.faults, &b.faults) {
        (Some(fa), Some(fb)) => {
            let (sa, sb): (BTreeSet<&FaultLine>, BTreeSet<&FaultLine>) = (fa.iter().collect(), fb.iter().collect());
            for f in sa.difference(&sb) {
                let _ = writeln!(section, "  only in A: {f}");
            }
            for f in sb.difference(&sa) {
                let _ = writeln!(section, "  only in B: {f}");
            }
            if !section.is_empty() {
                let same = sa.intersection(&sb).count();
                let _ = writeln!(section, "  ({same} faults in both; A has {}, B has {})", fa.len(), fb.len());
            }
        }
        (fa, fb) if fa.is_some() != fb.is_some() => {
            let which = if fa.is_none() { "A" } else { "B" };
            let _ = writeln!(section, "  the schedule of {which} could not be read");
        }
        _ => {}
    }
    push_section(&mut out, &mut differing, "fault schedule", section);

    let (fa, fb) = (flags(&ra.command), flags(&rb.command));
    let mut section = String::new();
    for flag in fa.keys().chain(fb.keys()).collect::<BTreeSet<_>>() {
        if matches!(flag.as_str(), "store" | "schedule") {
            continue;
        }
        let show = |v: Option<&Vec<String>>| v.map_or_else(|| "(absent)".to_string(), |v| v.join(" "));
        let (x, y) = (show(fa.get(flag)), show(fb.get(flag)));
        if x != y {
            let _ = writeln!(section, "  --{flag:<26} {x} → {y}");
        }
    }
    push_section(&mut out, &mut differing, "run flags (from the repeat commands)", section);

    let (ta, tb) = (&ra.timings, &rb.timings);
    let mut section = String::new();
    let lines = [
        ("duration_ms", ra.duration_ms.to_string(), rb.duration_ms.to_string()),
        ("history_span_ms", ta.history_span_ms.to_string(), tb.history_span_ms.to_string()),
        ("fault_windows", ta.fault_windows.to_string(), tb.fault_windows.to_string()),
        ("fault_time_ms", ta.fault_time_ms.to_string(), tb.fault_time_ms.to_string()),
        ("attempt_ms.closed", ta.attempt_ms.closed.to_string(), tb.attempt_ms.closed.to_string()),
        ("attempt_ms.open", ta.attempt_ms.open.to_string(), tb.attempt_ms.open.to_string()),
        ("attempt_ms.median", opt(ta.attempt_ms.median), opt(tb.attempt_ms.median)),
        ("attempt_ms.p99", opt(ta.attempt_ms.p99), opt(tb.attempt_ms.p99)),
        ("attempt_ms.max", opt(ta.attempt_ms.max), opt(tb.attempt_ms.max)),
    ];
    for (name, x, y) in lines {
        number_line(&mut section, name, x, y);
    }
    push_section(&mut out, &mut differing, "timings", section);

    let (ca, cb) = (&ra.counts, &rb.counts);
    let mut section = String::new();
    let mut lines = vec![
        ("events".to_string(), ca.events.to_string(), cb.events.to_string()),
        ("jobs".to_string(), ca.jobs.to_string(), cb.jobs.to_string()),
        ("attempts".to_string(), ca.attempts.to_string(), cb.attempts.to_string()),
        ("steps.applied".to_string(), ca.steps.applied.to_string(), cb.steps.applied.to_string()),
        ("steps.refused".to_string(), ca.steps.refused.to_string(), cb.steps.refused.to_string()),
    ];
    let states: BTreeSet<&String> = ca.jobs_by_final_state.keys().chain(cb.jobs_by_final_state.keys()).collect();
    for state in states {
        let get = |m: &BTreeMap<String, u64>| m.get(state).copied().unwrap_or(0).to_string();
        lines.push((format!("jobs {state}"), get(&ca.jobs_by_final_state), get(&cb.jobs_by_final_state)));
    }
    for (name, x, y) in lines {
        number_line(&mut section, &name, x, y);
    }
    push_section(&mut out, &mut differing, "counts", section);

    if differing.is_empty() {
        out.push_str("no differences in verdicts, anomalies, faults, flags, timings or counts\n");
    } else {
        let _ = writeln!(out, "differs in: {}", differing.join(", "));
    }
    out
}

fn push_section(out: &mut String, differing: &mut Vec<&'static str>, name: &'static str, body: String) {
    if body.is_empty() {
        let _ = writeln!(out, "\n{name}: same");
    } else {
        let _ = write!(out, "\n{name}:\n{body}");
        differing.push(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{results_json, Run};
    use checkers::{Anomaly, CheckerResult, Verdict};
    use serde_json::json;

    fn doc(command: &str, duration_ms: u64, anomalies: usize) -> ResultsDoc {
        let anomaly = |n: usize| Anomaly {
            checker: "stale-completion".into(),
            kind: "superseded-result-accepted".into(),
            job: Some(format!("j{n}")),
            attempts: vec![],
            runners: vec![],
            fences: vec![],
            key: None,
            events: vec![],
            message: "late".into(),
        };
        let verdict = if anomalies == 0 {
            Verdict::Valid
        } else {
            Verdict::Invalid { anomalies: (0..anomalies).map(anomaly).collect() }
        };
        let run = Run {
            test_name: "chaos".into(),
            seed: 5,
            command: command.into(),
            started_at: "2026-12-01T00:00:00Z".into(),
            duration_ms,
            config: json!({}),
            complete: true,
            schedule: json!([]),
            checkers: vec![
                CheckerResult { checker: "stale-completion".into(), description: "d".into(), verdict },
                CheckerResult { checker: "lost-work".into(), description: "d".into(), verdict: Verdict::Valid },
            ],
        };
        crate::read_results(&results_json(&run, &[])).unwrap()
    }

    fn fault(at_ms: u64, kind: &str) -> FaultLine {
        FaultLine {
            at_ms,
            duration_ms: 3000,
            kind: kind.into(),
            runner: Some("r1".into()),
            variant: "cut-links".into(),
        }
    }

    #[test]
    fn flags_are_read_from_a_repeat_command() {
        let f = flags("fencelab run --seed 5 --bug a --bug b --verbose --store x");
        assert_eq!(f["seed"], ["5"]);
        assert_eq!(f["bug"], ["a", "b"]);
        assert_eq!(f["verbose"], [""]);
    }

    #[test]
    fn the_same_run_has_no_differences() {
        let side = Side {
            label: "a".into(),
            results: doc("fencelab run --seed 5", 20_000, 1),
            faults: Some(vec![fault(2000, "reconnects")]),
        };
        let text = diff_text(&side, &side);
        assert!(text.ends_with("no differences in verdicts, anomalies, faults, flags, timings or counts\n"), "{text}");
        assert!(text.contains("\nverdicts: same\n"));
    }

    #[test]
    fn verdicts_anomalies_faults_flags_and_timings_that_differ_are_named() {
        let a = Side {
            label: "store/a".into(),
            results: doc("fencelab run --seed 5 --bug accept-stale-result --store s1", 20_000, 2),
            faults: Some(vec![fault(2000, "reconnects"), fault(6000, "reconnects")]),
        };
        let b = Side {
            label: "store/b".into(),
            results: doc("fencelab run --seed 5 --store s2", 21_500, 0),
            faults: Some(vec![fault(2000, "reconnects"), fault(7000, "kill")]),
        };
        let text = diff_text(&a, &b);
        for line in [
            "A  store/a  seed 5, invalid, 20000 ms",
            "  overall                      invalid → valid",
            "  stale-completion             invalid (2 anomalies) → valid",
            "  stale-completion / superseded-result-accepted 2 → 0",
            "  only in A: at 6000 ms for 3000 ms: reconnects on r1 cut-links",
            "  only in B: at 7000 ms for 3000 ms: kill on r1 cut-links",
            "  (1 faults in both; A has 2, B has 2)",
            "  --bug                        accept-stale-result → (absent)",
            "  duration_ms                  20000 → 21500  (+1500)",
            "differs in: verdicts, anomalies by checker and kind, fault schedule, run flags (from the repeat commands), timings",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(!text.contains("--store"), "the store differs by design");
        assert!(!text.contains("lost-work"), "an unchanged checker is not listed");
    }
}
