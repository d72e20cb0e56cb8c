//! Which sources of evidence a history holds: declared by a `sources` event (fencelab's
//! runs and scenarios write one), or read off the events themselves (a history assembled
//! from a production incident's records). And a history cut down to some of its sources,
//! as production would have it.

use std::collections::BTreeSet;

use crate::{Event, EventType, Op, Process, Source};

/// The `sources` event declaring `sources`.
pub fn sources_event(sources: &BTreeSet<Source>) -> Event {
    let mut event = Event::new(0, Process::HARNESS, EventType::Ok, Op::Sources);
    let words: Vec<&str> = sources.iter().map(|source| source.as_str()).collect();
    event.value = Some(serde_json::json!({ "sources": words }));
    event
}

/// The sources a `sources` event declares; `None` for any other event or one whose value
/// is not a list of source words.
pub fn declared(event: &Event) -> Option<BTreeSet<Source>> {
    if event.f != Op::Sources {
        return None;
    }
    let words = event.value.as_ref()?.get("sources")?.as_array()?;
    words.iter().map(|word| word.as_str().and_then(Source::parse)).collect()
}

/// The sources `events` holds: the declared ones when a `sources` event says, else every
/// source one of its events belongs to.
pub fn sources_of(events: &[Event]) -> BTreeSet<Source> {
    if let Some(said) = events.iter().find_map(declared) {
        return said;
    }
    events.iter().filter_map(Source::of).collect()
}

/// `events` with only the events of `keep` (and the harness's own bookkeeping), without
/// any declaration of sources, renumbered: what a history assembled from those records
/// alone would hold.
pub fn cut(events: &[Event], keep: &BTreeSet<Source>) -> Vec<Event> {
    let kept = events
        .iter()
        .filter(|event| event.f != Op::Sources)
        .filter(|event| Source::of(event).is_none_or(|source| keep.contains(&source)));
    let mut out: Vec<Event> = kept.cloned().collect();
    for (index, event) in out.iter_mut().enumerate() {
        event.index = index as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history() -> Vec<Event> {
        let mut events = vec![
            Event::new(0, Process::HARNESS, EventType::Ok, Op::Config),
            Event::new(1, Process::CONTROL_PLANE, EventType::Ledger, Op::Claim),
            Event::new(2, Process::runner("r1"), EventType::Request, Op::Heartbeat),
            Event::new(3, Process::TARGET, EventType::Step, Op::Step),
            Event::new(4, Process::HARNESS, EventType::Ok, Op::Final),
        ];
        for (index, event) in events.iter_mut().enumerate() {
            event.index = index as u64;
        }
        events
    }

    #[test]
    fn sources_are_read_off_the_events_unless_declared() {
        let events = history();
        let read: Vec<Source> = sources_of(&events).into_iter().collect();
        assert_eq!(read, [Source::Ledger, Source::RunnerLogs, Source::TargetLog, Source::Config, Source::Finals]);
        let said = BTreeSet::from([Source::Ledger, Source::Operator]);
        let declared = [vec![sources_event(&said)], events].concat();
        assert_eq!(sources_of(&declared), said, "a declaration is taken as it is: an operator that did nothing");
    }

    #[test]
    fn a_cut_keeps_only_the_sources_asked_for_renumbered() {
        let keep = BTreeSet::from([Source::Ledger, Source::RunnerLogs]);
        let declared = [vec![sources_event(&Source::ALL.iter().copied().collect::<BTreeSet<_>>())], history()].concat();
        let cut = cut(&declared, &keep);
        assert_eq!(sources_of(&cut), keep);
        assert_eq!(cut.iter().map(|event| event.index).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn a_declaration_with_an_unknown_word_declares_nothing() {
        let mut event = sources_event(&BTreeSet::new());
        event.value = Some(serde_json::json!({"sources": ["ledger", "tea-leaves"]}));
        assert_eq!(declared(&event), None);
    }
}
