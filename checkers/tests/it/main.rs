//! Integration tests of the checkers: literal histories built with [`builder::H`], each
//! checked by name against the anomaly kinds it must (or must not) produce.

mod builder;
mod instants;
mod model;
mod observed;
mod progress;
mod runner_contract;
mod scenarios;
mod stream;
mod violations;

use checkers::{Anomaly, Verdict};
use history::Event;

/// Runs one checker and asserts its verdict: Valid when `expected` is empty, else Invalid
/// with exactly these anomaly kinds (in any order). Returns the anomalies.
pub fn check(events: &[Event], checker: &str, expected: &[&str]) -> Vec<Anomaly> {
    let result = checkers::check_one(checker, events).unwrap_or_else(|| panic!("no checker {checker}"));
    match (&result.verdict, expected.is_empty()) {
        (Verdict::Valid, true) => vec![],
        (Verdict::Invalid { anomalies }, false) => {
            let mut kinds: Vec<&str> = anomalies.iter().map(|anomaly| anomaly.kind.as_str()).collect();
            let mut wanted = expected.to_vec();
            kinds.sort_unstable();
            wanted.sort_unstable();
            assert_eq!(kinds, wanted, "{checker}: {anomalies:#?}");
            for anomaly in anomalies {
                assert_eq!(anomaly.checker, checker);
                assert!(!anomaly.events.is_empty() && !anomaly.message.is_empty(), "{anomaly:?}");
            }
            anomalies.clone()
        }
        (verdict, _) => panic!("{checker}: expected {expected:?}, got {verdict:#?}"),
    }
}

/// Asserts that every checker finds the history valid.
pub fn all_valid(events: &[Event]) {
    for result in checkers::check_all(events) {
        assert_eq!(result.verdict, Verdict::Valid, "{}", result.checker);
    }
}

#[test]
fn names_list_thirteen_checkers_in_order_and_check_all_follows_it() {
    let names: Vec<&str> = checkers::names().iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "stale-completion",
            "heartbeat-resurrection",
            "single-owner",
            "fence-order",
            "terminal-stability",
            "explicit-uncertainty",
            "clock-authority",
            "stale-side-effect",
            "lost-work",
            "ledger-completeness",
            "rules-model",
            "progress",
            "runner-contract"
        ]
    );
    let results = checkers::check_all(&scenarios::walk_through(false));
    let order: Vec<&str> = results.iter().map(|result| result.checker.as_str()).collect();
    assert_eq!(order, names);
    assert!(results.iter().all(|result| !result.description.is_empty()));
}

#[test]
fn each_module_function_agrees_with_check_all() {
    let events = scenarios::walk_through(true);
    let all = checkers::check_all(&events);
    let singles = [
        checkers::stale_completion::check(&events),
        checkers::heartbeat_resurrection::check(&events),
        checkers::single_owner::check(&events),
        checkers::fence_order::check(&events),
        checkers::terminal_stability::check(&events),
        checkers::explicit_uncertainty::check(&events),
        checkers::clock_authority::check(&events),
        checkers::stale_side_effect::check(&events),
        checkers::lost_work::check(&events),
        checkers::ledger_completeness::check(&events),
        checkers::rules_model::check(&events),
        checkers::progress::check(&events),
        checkers::runner_contract::check(&events),
    ];
    assert_eq!(all, singles);
}

#[test]
fn an_empty_history_is_unknown_everywhere() {
    for result in checkers::check_all(&[]) {
        assert!(matches!(result.verdict, Verdict::Unknown { .. }), "{result:?}");
    }
}

#[path = "../../benches/support/gen.rs"]
#[allow(dead_code)]
mod gen;

#[test]
fn generated_correct_histories_are_valid_for_every_checker() {
    for seed in 1..=5 {
        let mut generator = gen::Gen::new(seed);
        let mut events = generator.chunk(20_000);
        events.extend(generator.finals());
        all_valid(&events);
    }
}
