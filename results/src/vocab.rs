//! The history's vocabulary as the plots and the anomaly stories read it. Every comparison of
//! an event's `process` or `f` with a name in those modules goes through these few functions,
//! so a typed vocabulary (enums for `process` and `f`) changes this file and nothing else.

use history::{Event, EventType};

/// The runner request kinds the latency plot draws, in its order.
pub const REQUEST_KINDS: [&str; 5] = ["claim", "heartbeat", "capability", "result", "step"];

/// The operation's name, for display and grouping.
pub fn f_name(e: &Event) -> &str {
    &e.f
}

/// True when the event's operation is `name`.
pub fn f_is(e: &Event, name: &str) -> bool {
    e.f == name
}

/// The runner id of an event a runner logged (`runner:r1` → `r1`).
pub fn runner_process(e: &Event) -> Option<&str> {
    e.process.strip_prefix("runner:")
}

pub fn is_client(e: &Event) -> bool {
    e.process == "client"
}

/// A ledger entry of kind `name` (`claim`, `heartbeat`, `result`, `expire`, ...).
pub fn is_ledger_f(e: &Event, name: &str) -> bool {
    e.kind == EventType::Ledger && f_is(e, name)
}

/// The client's submit operation.
pub fn is_submit(e: &Event) -> bool {
    is_client(e) && f_is(e, "submit")
}

/// `value.recorded_as` of a ledger entry (`uncertain`, `requeued`, `late_observation`, ...).
pub fn recorded_as(e: &Event) -> Option<&str> {
    e.value.as_ref()?.get("recorded_as")?.as_str()
}

/// Who recorded the event, for display.
pub fn process_name(e: &Event) -> &str {
    &e.process
}

pub fn is_operator(e: &Event) -> bool {
    e.process == "operator"
}

pub fn is_nemesis(e: &Event) -> bool {
    e.process == "nemesis"
}

/// The harness's final state of a job.
pub fn is_final(e: &Event) -> bool {
    e.process == "harness" && f_is(e, "final")
}

/// `value.phase` of a nemesis event (`start` / `heal`).
pub fn phase(e: &Event) -> Option<&str> {
    e.value.as_ref()?.get("phase")?.as_str()
}

/// `value.step` of a target step or a runner's step request.
pub fn step_number(e: &Event) -> Option<u64> {
    e.value.as_ref()?.get("step")?.as_u64()
}
