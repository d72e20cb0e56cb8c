//! The history's vocabulary as the plots and the anomaly stories read it: a few helpers
//! over the typed words of `history` (`Op`, `Process`, `RecordedAs`), in one place.

use history::{Event, EventType, Op, Process, RecordedAs};

/// The runner request kinds the latency plot draws, in its order.
pub const REQUEST_KINDS: [Op; 5] = [Op::Claim, Op::Heartbeat, Op::Capability, Op::Result, Op::Step];

/// The operation's name, for display and grouping.
pub fn f_name(e: &Event) -> &'static str {
    e.f.as_str()
}

/// True when the event's operation is `op`.
pub fn f_is(e: &Event, op: Op) -> bool {
    e.f == op
}

/// The runner id of an event a runner logged (`runner:r1` → `r1`).
pub fn runner_process(e: &Event) -> Option<&str> {
    e.process.runner_id()
}

pub fn is_client(e: &Event) -> bool {
    e.process == Process::CLIENT
}

/// A ledger entry of kind `op` (`claim`, `heartbeat`, `result`, `expire`, ...).
pub fn is_ledger_f(e: &Event, op: Op) -> bool {
    e.kind == EventType::Ledger && f_is(e, op)
}

/// The client's submit operation.
pub fn is_submit(e: &Event) -> bool {
    is_client(e) && f_is(e, Op::Submit)
}

/// `value.recorded_as` of a ledger entry (`uncertain`, `requeued`, `late_observation`, ...).
pub fn recorded_as(e: &Event) -> Option<RecordedAs> {
    e.recorded_as()
}

/// Who recorded the event, for display.
pub fn process_name(e: &Event) -> String {
    e.process.to_string()
}

pub fn is_operator(e: &Event) -> bool {
    e.process == Process::OPERATOR
}

pub fn is_nemesis(e: &Event) -> bool {
    e.process == Process::NEMESIS
}

/// The harness's final state of a job.
pub fn is_final(e: &Event) -> bool {
    e.process == Process::HARNESS && f_is(e, Op::Final)
}

/// `value.phase` of a nemesis event (`start` / `heal`).
pub fn phase(e: &Event) -> Option<&str> {
    e.value.as_ref()?.get("phase")?.as_str()
}

/// `value.step` of a target step or a runner's step request.
pub fn step_number(e: &Event) -> Option<u64> {
    e.value.as_ref()?.get("step")?.as_u64()
}

/// The snake_case name of an event type or decision, as in the history.
pub(crate) fn name_of<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}
