//! Every instant an anomaly's sentence names is said in seconds on the history's clock (in
//! a run, since its start), with the reading of the record's own clock beside it (issue 38):
//! literal histories whose events are timed as a run times them, the server's and the
//! target's clocks `T0` ms at the run's start.

use super::builder::{claim, H};
use history::Decision::Accepted;
use history::Event;

/// The server's (and the target's) wall clock when the run started, Unix ms.
const T0: i64 = 1_796_563_100_000;

/// The history with each event at its record's instant on the run's clock (its receipt
/// less `T0`), as the collector rebases them; an event without a receipt keeps the time of
/// the one before it.
fn on_the_runs_clock(mut events: Vec<Event>) -> Vec<Event> {
    let mut time_ns = 0;
    for event in &mut events {
        if let Some(received_ms) = event.received_ms {
            time_ns = u64::try_from(received_ms - T0).unwrap() * 1_000_000;
        }
        event.time_ns = time_ns;
    }
    events
}

/// The message of the one anomaly of `kind` that `checker` finds.
fn said(events: &[Event], checker: &str, kind: &str) -> String {
    let result = checkers::check_one(checker, events).unwrap();
    let checkers::Verdict::Invalid { anomalies } = &result.verdict else { panic!("{checker}: {result:?}") };
    let mut of_kind = anomalies.iter().filter(|anomaly| anomaly.kind == kind);
    let anomaly = of_kind.next().unwrap_or_else(|| panic!("{checker}: no {kind} in {anomalies:#?}"));
    assert!(of_kind.next().is_none(), "{checker}: one {kind}: {anomalies:#?}");
    anomaly.message.clone()
}

/// A job claimed at 1 s with a lease to 3 s.
fn claimed() -> (H, super::builder::C) {
    let mut h = H::new();
    let a1 = claim("j1", "j1-a1", "r1", 7);
    h.config("fenced");
    h.submit("j1", "prod", T0 + 900);
    h.ledger_claim(&a1, T0 + 1_000, T0 + 3_000);
    (h, a1)
}

#[test]
fn two_leases_overlapping_are_said_in_the_runs_seconds() {
    let (mut h, _) = claimed();
    let a2 = claim("j1", "j1-a2", "r2", 8);
    h.ledger_claim(&a2, T0 + 2_000, T0 + 4_000);
    let message = said(&on_the_runs_clock(h.build()), "single-owner", "two-attempts-one-job");
    assert_eq!(
        message,
        "j1-a2 held a lease from 2.000 s (server clock 1796563102000 ms) while j1-a1 (fence 7) still held one until \
         3.000 s (server clock 1796563103000 ms) on job j1"
    );
}

#[test]
fn a_step_after_its_lease_is_said_on_the_targets_clock_and_the_lease_on_the_servers() {
    let (mut h, a1) = claimed();
    h.step(&a1, T0 + 3_100, Accepted, None);
    let message = said(&on_the_runs_clock(h.build()), "stale-side-effect", "step-after-lease");
    assert_eq!(
        message,
        "the target applied a step of j1-a1 (fence 7) at 3.100 s (target clock 1796563103100 ms), 100 ms after its lease \
         ended at 3.000 s (server clock 1796563103000 ms): a runner that lost its authority mutated the target"
    );
}

#[test]
fn a_heartbeat_past_its_lease_is_said_in_the_runs_seconds() {
    let (mut h, a1) = claimed();
    h.heartbeat(&a1, T0 + 3_500, T0 + 2_900, Accepted, Some(T0 + 5_500));
    let events = on_the_runs_clock(h.build());
    let message = said(&events, "heartbeat-resurrection", "heartbeat-after-lease-end");
    assert_eq!(
        message,
        "heartbeat for j1-a1 (fence 7) accepted at 3.500 s (server clock 1796563103500 ms), at or after its lease ended at \
         3.000 s (server clock 1796563103000 ms)"
    );
    let message = said(&events, "clock-authority", "runner-clock-trusted");
    assert_eq!(
        message,
        "heartbeat for j1-a1 (fence 7) accepted at 3.500 s (server clock 1796563103500 ms), at or past its lease end \
         3.000 s (server clock 1796563103000 ms): only the runner's clock, which said 1796563102900 ms, puts it \
         inside the lease"
    );
}

#[test]
fn an_early_expiry_is_said_in_the_runs_seconds() {
    let (mut h, a1) = claimed();
    h.expire(&a1, T0 + 2_500, T0 + 3_000, "uncertain");
    let message = said(&on_the_runs_clock(h.build()), "rules-model", "expired-early");
    assert!(
        message.ends_with(
            "was expired at 2.500 s (server clock 1796563102500 ms) but its lease ends at 3.000 s (server clock \
             1796563103000 ms)"
        ),
        "{message}"
    );
}
