//! Fault coverage: for every variant of the fault schedule, how many faults were
//! scheduled, how many took effect, and how many tries found nothing to hit (an idle
//! runner, no result to resend). A run whose faults never landed tested little; this
//! says so in `results.json` and the report.

use std::collections::BTreeMap;
use std::fmt::Write;

use history::{Event, EventType, Process};
use serde::{Deserialize, Serialize};
use workloads::faults::{Fault, FaultKind};

use crate::escape::html as esc;

/// One variant's coverage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCoverage {
    /// The fault kind the variant realises.
    pub kind: String,
    /// Faults of this variant in the realised schedule.
    pub scheduled: u64,
    /// Starts that took effect (a window opened, a result was sent).
    pub effective: u64,
    /// Tries that found nothing to hit and changed nothing.
    pub ineffective_tries: u64,
    /// Why the fault was not run at all: the part of the system contract it needs and the
    /// system lacks (`docs/system.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_run: Option<String>,
}

/// Coverage by variant name (`latency`, `pause`, …), every variant of every scheduled
/// kind listed, with zeros where nothing happened.
pub fn coverage(schedule: &serde_json::Value, events: &[Event]) -> BTreeMap<String, FaultCoverage> {
    let faults: Vec<Fault> = serde_json::from_value(schedule.clone()).unwrap_or_default();
    let mut by_variant: BTreeMap<String, FaultCoverage> = BTreeMap::new();
    let mut kinds: Vec<FaultKind> = faults.iter().map(|fault| fault.kind).collect();
    kinds.dedup();
    for kind in kinds {
        for variant in kind.variants() {
            let entry = by_variant.entry(variant.name().to_string()).or_default();
            entry.kind = kind.name().to_string();
        }
    }
    for fault in &faults {
        let entry = by_variant.entry(fault.variant.name().to_string()).or_default();
        entry.kind = fault.kind.name().to_string();
        entry.scheduled += 1;
    }
    for (kind, only, why) in not_run(events) {
        let named = |variant: &&workloads::faults::Variant| only.as_deref().is_none_or(|name| name == variant.name());
        for variant in kind.variants().iter().filter(named) {
            let entry = by_variant.entry(variant.name().to_string()).or_default();
            entry.kind = kind.name().to_string();
            entry.not_run = Some(why.clone());
        }
    }
    for event in events.iter().filter(|event| event.process == Process::NEMESIS && event.kind == EventType::Invoke) {
        let Some(value) = &event.value else { continue };
        // A stale request sent on top of a fault's act is not another application of it.
        if value.get("stale") == Some(&serde_json::Value::Bool(true)) {
            continue;
        }
        let (Some(effective), Some(how)) = (value.get("effective").and_then(|v| v.as_bool()), variant_name(value))
        else {
            continue;
        };
        let entry = by_variant.entry(how).or_default();
        if effective {
            entry.effective += 1;
        } else {
            entry.ineffective_tries += 1;
        }
    }
    by_variant
}

/// The faults the run's `config` event says were not run — a whole kind, or one variant of
/// it by name — with why (the part each needs, in runs recorded before the reason was).
fn not_run(events: &[Event]) -> Vec<(FaultKind, Option<String>, String)> {
    let config = events.iter().find_map(history::Config::of);
    let Some(list) = config.and_then(|config| config.system?.faults_not_run) else {
        return vec![];
    };
    list.iter()
        .filter_map(|entry| {
            let kind: FaultKind = serde_json::from_value(entry.get("fault")?.clone()).ok()?;
            let variant = entry.get("variant").and_then(|variant| variant.as_str()).map(str::to_string);
            let why = entry.get("why").and_then(|why| why.as_str()).filter(|why| !why.is_empty());
            let why = match why {
                Some(why) => why.to_string(),
                None => format!("the system lacks `{}`", entry.get("needs")?.as_str()?),
            };
            Some((kind, variant, why))
        })
        .collect()
}

fn variant_name(value: &serde_json::Value) -> Option<String> {
    let fault: Fault = serde_json::from_value(value.clone()).ok()?;
    Some(fault.variant.name().to_string())
}

/// The report's coverage table; nothing when the run had no faults.
pub fn section(out: &mut String, coverage: &BTreeMap<String, FaultCoverage>) {
    if coverage.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"coverage\">\n<h2>Fault coverage</h2>\n<table class=\"summary\">\n\
         <tr><th>variant</th><th>fault</th><th>scheduled</th><th>took effect</th><th>tries that found nothing</th></tr>\n",
    );
    for (name, row) in coverage {
        if let Some(why) = &row.not_run {
            let _ = writeln!(
                out,
                "<tr class=\"missed\"><td>{}</td><td>{}</td><td colspan=\"3\">not run: {}</td></tr>",
                esc(name),
                esc(&row.kind),
                esc(why)
            );
            continue;
        }
        let missed = if row.effective == 0 { " class=\"missed\"" } else { "" };
        let _ = writeln!(
            out,
            "<tr{missed}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            esc(&row.kind),
            row.scheduled,
            row.effective,
            row.ineffective_tries
        );
    }
    out.push_str("</table>\n</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use history::Op;
    use serde_json::json;

    fn start(how: serde_json::Value, effective: bool) -> Event {
        let mut event = Event::new(0, Process::NEMESIS, EventType::Invoke, Op::DelayedHeartbeats);
        let fault = json!({"at_ms": 0, "duration_ms": 10, "kind": "delayed-heartbeats", "runner": 0, "variant": how});
        let mut value = fault;
        value["phase"] = json!("start");
        value["effective"] = json!(effective);
        event.value = Some(value);
        event
    }

    #[test]
    fn counts_scheduled_effective_and_idle_tries_per_variant() {
        let schedule = json!([
            {"at_ms": 0, "duration_ms": 10, "kind": "delayed-heartbeats", "runner": 0, "variant": {"how": "pause"}},
            {"at_ms": 5, "duration_ms": 10, "kind": "delayed-heartbeats", "runner": 1, "variant": {"how": "pause"}},
        ]);
        let pause = json!({"how": "pause"});
        let events = vec![start(pause.clone(), false), start(pause.clone(), true), start(pause, true)];
        let coverage = coverage(&schedule, &events);
        let row = &coverage["pause"];
        assert_eq!((row.scheduled, row.effective, row.ineffective_tries), (2, 2, 1));
        assert_eq!(coverage["latency"].scheduled, 0, "a variant of a scheduled kind is listed even when not drawn");
        let mut html = String::new();
        section(&mut html, &coverage);
        assert!(html.contains("<tr class=\"missed\"><td>latency</td>"), "{html}");
    }

    #[test]
    fn faults_the_system_cannot_take_are_listed_as_not_run() {
        let mut config = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        config.value = Some(json!({"system": {"faults_not_run": [{"fault": "clock-skew", "needs": "runner-clock"}]}}));
        let coverage = coverage(&json!([]), &[config]);
        let skew: Vec<&FaultCoverage> = coverage.values().filter(|row| row.kind == "clock-skew").collect();
        assert!(!skew.is_empty());
        assert!(skew.iter().all(|row| row.not_run.as_deref() == Some("the system lacks `runner-clock`")));
        let mut html = String::new();
        section(&mut html, &coverage);
        assert!(html.contains("not run: the system lacks `runner-clock`"), "{html}");
    }

    #[test]
    fn a_fault_not_run_for_want_of_a_tool_says_so_rather_than_blame_the_system() {
        let mut config = Event::new(0, Process::HARNESS, EventType::Ok, Op::Config);
        let why = "`target-clock` moves a clock with libfaketime, which is not installed here";
        let not_run = json!([{"fault": "target-clock-skew", "needs": "target-clock", "why": why}]);
        config.value = Some(json!({"system": {"faults_not_run": not_run}}));
        let coverage = coverage(&json!([]), &[config]);
        assert_eq!(coverage["target-skew"].not_run.as_deref(), Some(why));
    }
}
