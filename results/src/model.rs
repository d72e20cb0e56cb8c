//! What the renderers derive from a history: attempts (claim to close, with their leases) and
//! fault windows, all on the run's clock (`time_ns`).

use history::{Decision, Event, EventType, Op, Process};
use std::collections::BTreeMap;

/// One attempt, from its ledger `claim` to the ledger entry that closed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    pub job: String,
    pub attempt: String,
    pub runner: String,
    pub fence: Option<u64>,
    pub start_ns: u64,
    /// When an accepted `result`, an `expire` or a `reconcile` closed it; `None` if never.
    pub end_ns: Option<u64>,
    /// The ledger entry kind that closed it (`result`, `expire`, `reconcile`).
    pub closed_by: Option<Op>,
    /// The lease as it was granted and renewed, merged into disjoint intervals (run clock).
    pub lease: Vec<(u64, u64)>,
}

/// A span during which a fault was active.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultWindow {
    pub start_ns: u64,
    pub end_ns: u64,
    pub kind: String,
    pub runner: Option<String>,
}

const MS: u64 = 1_000_000;

/// True for an entry of the control plane's ledger.
pub fn is_ledger(e: &Event) -> bool {
    e.kind == EventType::Ledger
}

/// The end of the lease an event grants, on the run clock: the event's time plus the lease's
/// remaining time at receipt (both server-clock figures, so clock skew cancels out).
fn lease_end(e: &Event) -> Option<u64> {
    let (expires, received) = (e.lease_expires_ms?, e.received_ms?);
    let remaining = expires.saturating_sub(received).max(0) as u64;
    Some(e.time_ns.saturating_add(remaining.saturating_mul(MS)))
}

/// The attempts of a history, in claim order.
pub fn attempts(events: &[Event]) -> Vec<Attempt> {
    let mut list: Vec<Attempt> = Vec::new();
    let mut by_id: BTreeMap<String, usize> = BTreeMap::new();
    for e in events.iter().filter(|e| is_ledger(e)) {
        let Some(id) = e.attempt.as_deref() else { continue };
        if e.f == Op::Claim {
            by_id.insert(id.to_string(), list.len());
            list.push(Attempt {
                job: e.job.clone().unwrap_or_default(),
                attempt: id.to_string(),
                runner: e.runner.clone().unwrap_or_default(),
                fence: e.fence,
                start_ns: e.time_ns,
                end_ns: None,
                closed_by: None,
                lease: lease_end(e).map(|end| vec![(e.time_ns, end)]).unwrap_or_default(),
            });
            continue;
        }
        let Some(a) = by_id.get(id).map(|&i| &mut list[i]) else { continue };
        let accepted = e.decision == Some(Decision::Accepted);
        if e.f == Op::Heartbeat && accepted && a.end_ns.is_none() {
            if let Some(end) = lease_end(e) {
                extend_lease(&mut a.lease, e.time_ns, end);
            }
        }
        let closes = (e.f == Op::Result && accepted) || e.f == Op::Expire || e.f == Op::Reconcile;
        if closes && a.end_ns.is_none() {
            a.end_ns = Some(e.time_ns);
            a.closed_by = Some(e.f);
        }
    }
    list
}

/// Adds `[start, end]` to a list of disjoint intervals kept in time order (renewals come in
/// time order, so only the last interval can overlap).
fn extend_lease(lease: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    match lease.last_mut() {
        Some(last) if start <= last.1 => last.1 = last.1.max(end),
        _ => lease.push((start, end)),
    }
}

/// The fault windows as they happened: from the nemesis's events — a window opens at the
/// start that took effect and closes at its heal (a one-off fault, a resent result, lasts
/// its scheduled duration), on the runner the event names — else, for a history without
/// them, from the schedule. Windows still open at the end of the history end at `end_ns`.
pub fn fault_windows(schedule: &serde_json::Value, events: &[Event], end_ns: u64) -> Vec<FaultWindow> {
    let realised = from_history(events, end_ns);
    if !realised.is_empty() {
        return realised;
    }
    from_schedule(schedule)
}

fn from_history(events: &[Event], end_ns: u64) -> Vec<FaultWindow> {
    let mut open: BTreeMap<(String, Option<String>), (u64, u64)> = BTreeMap::new();
    let mut windows = Vec::new();
    let close = |kind: String, runner: Option<String>, start_ns: u64, end: u64| FaultWindow {
        start_ns,
        end_ns: end,
        kind,
        runner,
    };
    for e in events.iter().filter(|e| e.process == Process::NEMESIS) {
        let Some(value) = e.value.as_ref() else { continue };
        let phase = value.get("phase").and_then(|p| p.as_str());
        let key = (e.f.to_string(), e.runner.clone());
        match (phase, e.kind) {
            (Some("start"), EventType::Ok) if value.get("effective") != Some(&serde_json::Value::Bool(false)) => {
                let duration_ns = value.get("duration_ms").and_then(|d| d.as_u64()).unwrap_or(0).saturating_mul(MS);
                if let Some((start_ns, duration)) = open.insert(key.clone(), (e.time_ns, duration_ns)) {
                    windows.push(close(key.0, key.1, start_ns, (start_ns + duration).min(e.time_ns)));
                }
            }
            (Some("heal"), EventType::Ok | EventType::Info) => {
                if let Some((start_ns, _)) = open.remove(&key) {
                    windows.push(close(key.0, key.1, start_ns, e.time_ns));
                }
            }
            _ => {}
        }
    }
    for ((kind, runner), (start_ns, duration_ns)) in open {
        let end = if duration_ns > 0 { start_ns.saturating_add(duration_ns).min(end_ns) } else { end_ns };
        windows.push(close(kind, runner, start_ns, end.max(start_ns)));
    }
    windows.sort_by(|a, b| (a.start_ns, &a.kind).cmp(&(b.start_ns, &b.kind)));
    windows
}

/// Reads `[{at_ms, duration_ms, kind, runner, ...}]`; entries without `at_ms` are skipped.
fn from_schedule(schedule: &serde_json::Value) -> Vec<FaultWindow> {
    let Some(items) = schedule.as_array() else { return Vec::new() };
    let mut windows: Vec<FaultWindow> = items
        .iter()
        .filter_map(|item| {
            let at_ms = item.get("at_ms")?.as_u64()?;
            let duration_ms = item.get("duration_ms").and_then(|d| d.as_u64()).unwrap_or(0);
            let name = item.get("kind").or_else(|| item.get("fault")).and_then(|k| k.as_str());
            Some(FaultWindow {
                start_ns: at_ms.saturating_mul(MS),
                end_ns: at_ms.saturating_add(duration_ms).saturating_mul(MS),
                kind: name.unwrap_or("fault").to_string(),
                // The schedule numbers runners from 0; the rest of the report names them.
                runner: match item.get("runner") {
                    Some(serde_json::Value::Number(index)) => index.as_u64().map(|index| format!("r{}", index + 1)),
                    Some(serde_json::Value::String(name)) => Some(name.clone()),
                    _ => None,
                },
            })
        })
        .collect();
    windows.sort_by(|a, b| (a.start_ns, &a.kind).cmp(&(b.start_ns, &b.kind)));
    windows
}

/// The last time on the run's clock worth drawing: the last event, the run's duration, or the
/// end of the last fault, whichever is latest (at least 1 ns, to keep scales finite).
pub fn horizon_ns(events: &[Event], duration_ms: u64, schedule: &serde_json::Value) -> u64 {
    let last_event = events.iter().map(|e| e.time_ns).max().unwrap_or(0);
    let last_fault = from_schedule(schedule).iter().map(|w| w.end_ns).max().unwrap_or(0);
    last_event.max(duration_ms.saturating_mul(MS)).max(last_fault).max(1)
}
