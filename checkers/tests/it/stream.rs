//! The streaming checker against the whole-history one: the same verdicts on every
//! history whose ledger order a stream can restore, and a refusal (`None`) on those it
//! cannot, never a different answer.

use checkers::Stream;
use history::{Event, EventType};
use serde_json::json;

fn streamed(events: &[Event]) -> Option<Vec<checkers::CheckerResult>> {
    streamed_within(events, checkers::LOOKAHEAD_EVENTS)
}

fn streamed_within(events: &[Event], lookahead: usize) -> Option<Vec<checkers::CheckerResult>> {
    let mut stream = Stream::new().lookahead(lookahead);
    for event in events {
        stream.push(event);
    }
    stream.finish()
}

fn ledger_positions(events: &[Event]) -> Vec<usize> {
    events.iter().enumerate().filter(|(_, e)| e.kind == EventType::Ledger).map(|(at, _)| at).collect()
}

fn set_seq(event: &mut Event, seq: u64) {
    let value = event.value.get_or_insert_with(|| json!({}));
    value["seq"] = json!(seq);
}

fn seq(event: &Event) -> u64 {
    event.value.as_ref().and_then(|value| value["seq"].as_u64()).expect("a seq")
}

/// The history with the `seq`s of the ledger events at these ranks (in history order, each
/// range from its first to before its second) rotated by one: the last of each range takes the first's `seq`, the others move up.
fn rotated(events: &[Event], ranges: &[(usize, usize)]) -> Vec<Event> {
    let mut out = events.to_vec();
    let positions = ledger_positions(events);
    for range in ranges {
        let seqs: Vec<u64> = (range.0..range.1).map(|rank| seq(&events[positions[rank]])).collect();
        for (offset, rank) in (range.0..range.1).enumerate() {
            let from = (offset + 1) % seqs.len();
            set_seq(&mut out[positions[rank]], seqs[from]);
        }
    }
    out
}

fn histories() -> Vec<(&'static str, Vec<Event>)> {
    vec![
        ("walk-through", crate::scenarios::walk_through(false)),
        ("walk-through, late accepted", crate::scenarios::walk_through(true)),
        ("realistic", crate::scenarios::realistic()),
    ]
}

#[test]
fn a_history_in_ledger_order_streams_to_the_same_verdicts() {
    for (name, events) in histories() {
        assert_eq!(streamed(&events), Some(checkers::check_all(&events)), "{name}");
    }
}

#[test]
fn ledger_entries_read_before_their_turn_or_after_it_stream_to_the_same_verdicts() {
    for (name, events) in histories() {
        let count = ledger_positions(&events).len();
        assert!(count >= 10, "{name}: {count} ledger events");
        let cases: [&[(usize, usize)]; 5] =
            [&[(0, 2)], &[(1, 3), (5, 7)], &[(2, 9)], &[(count - 2, count)], &[(0, count)]];
        for ranges in cases {
            let shuffled = rotated(&events, ranges);
            assert_ne!(shuffled, events);
            assert_eq!(streamed(&shuffled), Some(checkers::check_all(&shuffled)), "{name}, rotated {ranges:?}");
        }
    }
}

#[test]
fn a_ledger_starting_past_one_with_gaps_streams_to_the_same_verdicts() {
    for (name, events) in histories() {
        let mut spaced = events.clone();
        for (rank, position) in ledger_positions(&events).into_iter().enumerate() {
            set_seq(&mut spaced[position], 1_000 + 3 * rank as u64);
        }
        let spaced = rotated(&spaced, &[(0, 3), (6, 8)]);
        assert_eq!(streamed(&spaced), Some(checkers::check_all(&spaced)), "{name}");
    }
}

#[test]
fn an_entry_read_far_past_its_turn_is_waited_for_within_the_lookahead_and_refused_beyond_it() {
    let events = crate::scenarios::realistic();
    let positions = ledger_positions(&events);
    let mut late = events.clone();
    let last = positions.len() - 1;
    for (rank, position) in positions.iter().enumerate() {
        let seq = match rank {
            3 => 1_000,
            rank if rank == last => 4,
            rank if rank > 3 => rank as u64 + 1,
            rank => rank as u64 + 1,
        };
        set_seq(&mut late[*position], seq);
    }
    assert_eq!(streamed(&late), Some(checkers::check_all(&late)));
    assert_eq!(streamed_within(&late, 4), None, "seq 4 is read long after seq 5 was checked");
}

#[test]
fn a_ledger_a_stream_cannot_order_is_refused_not_answered() {
    let events = crate::scenarios::realistic();
    let positions = ledger_positions(&events);
    let mut repeated = events.clone();
    let first = seq(&events[positions[0]]);
    set_seq(&mut repeated[positions[4]], first);
    let mut unnumbered = events.clone();
    unnumbered[positions[3]].value = None;
    for (name, broken) in [("repeated seq", repeated), ("no seq", unnumbered)] {
        assert_eq!(streamed(&broken), None, "{name}");
    }
}
