//! Anomaly stories: each anomaly told as a few dated steps in the seed's words, built from its
//! events and the events around them ("t+0.000 s r1 claimed j1-a1 with fence 7", "t+2.1 s
//! j1-a1's lease expired, job j1 uncertain", …), ending on the rule the last proving event
//! broke; plus a mini-timeline of just the attempts involved.
//!
//! A story is a value ([`Story`]) that report.html, results.json and junit.xml each render.
//! Its steps are the anomaly's proving events, and as context the claims, expiries,
//! reconciliations, results and first refused heartbeat of the attempts it involves and the
//! fault windows that overlap it, up to the last proving event; at most [`MAX_STEPS`] steps
//! (every proving event first). Stories are told for the first [`MAX_STORIES`] anomalies.

use crate::escape::html as esc;
use crate::model::{self, Attempt, FaultWindow};
use crate::timeline::find_event;
use crate::{anomalies_of, vocab, Run};
use checkers::Anomaly;
use history::{Decision, Event, EventType, Op, RecordedAs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt::Write;

/// Stories are told for at most this many anomalies (in results order).
pub const MAX_STORIES: usize = 100;
/// At most this many steps per story; every proving event comes first.
pub const MAX_STEPS: usize = 16;
/// At most this many attempt lanes in a mini-timeline.
const MAX_MINI_LANES: usize = 6;

/// One anomaly, told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Story {
    /// The anomaly's number over all checkers, from 0 (its `#a<n>` in report.html).
    pub anomaly: usize,
    pub checker: String,
    pub kind: String,
    /// The rule broken: what the checker enforces.
    pub rule: String,
    /// The history time of the first step (ns on the run's clock); steps are relative to it.
    pub start_ns: u64,
    pub steps: Vec<Step>,
}

/// One step of a story.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Milliseconds after the story's first step.
    pub t_ms: u64,
    /// The history event told (`index`); `None` for a fault window's start or end.
    pub event: Option<u64>,
    /// Whether the event is one that proves the anomaly.
    pub proof: bool,
    /// The step in words; the last proving step ends with "— the rule broken: …".
    pub text: String,
}

impl Story {
    /// The story as lines `t+1.234 s  text`, for plain-text outputs.
    pub fn lines(&self) -> Vec<String> {
        self.steps.iter().map(|s| format!("{}  {}", offset(s.t_ms), s.text)).collect()
    }
}

fn offset(t_ms: u64) -> String {
    format!("t+{}.{:03} s", t_ms / 1000, t_ms % 1000)
}

/// The stories of the run's first [`MAX_STORIES`] anomalies.
pub fn stories(run: &Run, events: &[Event]) -> Vec<Story> {
    let horizon = model::horizon_ns(events, run.duration_ms, &run.schedule);
    let windows = model::fault_windows(&run.schedule, events, horizon);
    let all = run.checkers.iter().flat_map(|c| anomalies_of(c).iter().map(move |a| (c, a)));
    all.take(MAX_STORIES)
        .enumerate()
        .map(|(n, (checker, a))| tell(n, a, &checker.description, events, &windows))
        .collect()
}

/// What a story is about: its job, attempts and runners (from the anomaly and its events).
struct Subjects {
    job: Option<String>,
    attempts: BTreeSet<String>,
    runners: BTreeSet<String>,
}

fn subjects(a: &Anomaly, proofs: &[&Event]) -> Subjects {
    let mut attempts: BTreeSet<String> = a.attempts.iter().cloned().collect();
    let mut runners: BTreeSet<String> = a.runners.iter().cloned().collect();
    for e in proofs {
        attempts.extend(e.attempt.clone());
        runners.extend(e.runner.clone());
    }
    let job = a.job.clone().or_else(|| proofs.iter().find_map(|e| e.job.clone()));
    Subjects { job, attempts, runners }
}

/// Whether a non-proving event is worth telling as context, and how much (lower first).
fn context_rank(e: &Event, s: &Subjects, refused_seen: &mut BTreeSet<String>) -> Option<u8> {
    if e.kind != EventType::Ledger {
        return None;
    }
    let mine = match (&e.attempt, &e.job) {
        (Some(attempt), _) => s.attempts.contains(attempt) || (s.attempts.is_empty() && e.job == s.job),
        (None, Some(job)) => s.job.as_ref() == Some(job) && vocab::f_is(e, Op::Submit),
        _ => false,
    };
    if !mine {
        return None;
    }
    if vocab::f_is(e, Op::Claim) {
        Some(0)
    } else if vocab::f_is(e, Op::Expire) || vocab::f_is(e, Op::Reconcile) {
        Some(1)
    } else if vocab::f_is(e, Op::Result) {
        Some(2)
    } else if vocab::f_is(e, Op::Heartbeat) && e.decision != Some(Decision::Accepted) {
        // The first refused heartbeat of each attempt: when it learnt it lost the lease.
        refused_seen.insert(e.attempt.clone().unwrap_or_default()).then_some(3)
    } else {
        None
    }
}

fn tell(n: usize, a: &Anomaly, rule: &str, events: &[Event], windows: &[FaultWindow]) -> Story {
    let proofs: Vec<&Event> = a.events.iter().filter_map(|&i| find_event(events, i)).collect();
    let s = subjects(a, &proofs);
    let end = proofs.iter().map(|e| e.time_ns).max().unwrap_or(0);
    let proof_set: BTreeSet<u64> = proofs.iter().map(|e| e.index).collect();
    // (rank, time, event index or none, text); proofs rank lowest so they always fit.
    let mut picked: Vec<(u8, u64, Option<u64>, String)> =
        proofs.iter().map(|e| (0, e.time_ns, Some(e.index), say(e))).collect();
    picked.sort_by_key(|p| (p.1, p.2));
    picked.dedup_by_key(|p| p.2);
    let mut refused_seen = BTreeSet::new();
    for e in events.iter().take_while(|e| e.time_ns <= end) {
        if proof_set.contains(&e.index) {
            continue;
        }
        if let Some(rank) = context_rank(e, &s, &mut refused_seen) {
            picked.push((1 + rank, e.time_ns, Some(e.index), say(e)));
        }
    }
    let first = picked.iter().map(|p| p.1).min().unwrap_or(0);
    for w in windows.iter().filter(|w| w.start_ns <= end && w.end_ns >= first) {
        if w.runner.as_ref().is_some_and(|r| !s.runners.contains(r)) {
            continue;
        }
        let on = w.runner.as_deref().map(|r| format!(" on {r}")).unwrap_or_default();
        if w.start_ns >= first {
            picked.push((5, w.start_ns, None, format!("fault {}{on} begins", w.kind)));
        } else {
            // In effect before the story starts (a target's clock moved long before its
            // stale step lands): said at the story's start, or it would be left out.
            let before_s = (first - w.start_ns) as f64 / 1e9;
            picked.push((5, first, None, format!("fault {}{on} in effect (it began {before_s:.3} s before)", w.kind)));
        }
        if w.end_ns <= end {
            picked.push((5, w.end_ns, None, format!("fault {}{on} healed", w.kind)));
        }
    }
    picked.sort_by_key(|p| (p.0, p.1));
    picked.truncate(MAX_STEPS);
    picked.sort_by_key(|p| (p.1, p.2.is_none(), p.2));
    let start_ns = picked.first().map(|p| p.1).unwrap_or(0);
    let mut steps: Vec<Step> = picked
        .into_iter()
        .map(|(rank, t, event, text)| Step { t_ms: (t - start_ns) / 1_000_000, event, proof: rank == 0, text })
        .collect();
    if let Some(last) = steps.iter_mut().rev().find(|s| s.proof) {
        let _ = write!(last.text, " — the rule broken: {rule}");
    } else {
        steps.push(Step {
            t_ms: 0,
            event: None,
            proof: true,
            text: format!("{} — the rule broken: {rule}", a.message),
        });
    }
    Story { anomaly: n, checker: a.checker.clone(), kind: a.kind.clone(), rule: rule.to_string(), start_ns, steps }
}

/// "success" / "failure" / the outcome as written.
fn outcome_word(e: &Event) -> String {
    match e.outcome.as_deref() {
        Some("succeeded") => "success".into(),
        Some("failed") => "failure".into(),
        Some(other) => other.into(),
        None => "result".into(),
    }
}

fn reason(e: &Event) -> String {
    e.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
}

/// One event in the seed's words.
pub fn say(e: &Event) -> String {
    let runner = e.runner.clone().or_else(|| vocab::runner_process(e).map(str::to_string)).unwrap_or("?".into());
    let attempt = e.attempt.as_deref().unwrap_or("?");
    let job = e.job.as_deref().unwrap_or("?");
    let fence = e.fence.map(|f| format!(" (fence {f})")).unwrap_or_default();
    let f = vocab::f_name(e);
    match e.kind {
        EventType::Ledger => match e.f {
            Op::Submit => format!("job {job} submitted"),
            Op::Claim => {
                let lease = match (e.lease_expires_ms, e.received_ms) {
                    (Some(end), Some(at)) => format!(", lease {} ms", end - at),
                    _ => String::new(),
                };
                let fence = e.fence.map(|f| format!(" with fence {f}")).unwrap_or_default();
                format!("{runner} claimed {attempt}{fence}{lease}")
            }
            Op::Heartbeat | Op::Capability => match e.decision {
                Some(Decision::Accepted) => format!("{runner}'s {f} for {attempt} accepted"),
                _ => format!("{runner}'s {f} for {attempt} refused{}", reason(e)),
            },
            Op::Result => {
                let what = format!("{runner}'s {} for {attempt}", outcome_word(e));
                match e.decision {
                    Some(Decision::Accepted) => format!("{what} accepted as current"),
                    Some(Decision::Rejected) => format!("{what} refused{}, kept as a late observation", reason(e)),
                    Some(Decision::Duplicate) => format!("{what} acknowledged as a duplicate"),
                    Some(Decision::Conflict) => format!("{what} recorded as a conflict"),
                    None => format!("{what} recorded"),
                }
            }
            Op::Expire => match vocab::recorded_as(e) {
                Some(RecordedAs::Requeued) => format!("{attempt}'s lease expired, job {job} requeued"),
                _ => format!("{attempt}'s lease expired, job {job} uncertain"),
            },
            Op::Reconcile => {
                format!("the operator reconciled {attempt}: {}", e.outcome.as_deref().unwrap_or("no finding"))
            }
            _ => format!("control plane recorded {f} for {attempt}{}", reason(e)),
        },
        EventType::Step => {
            let step = vocab::step_number(e).map(|s| format!("step {s}")).unwrap_or("a step".into());
            match e.decision {
                Some(Decision::Accepted) => format!("the target applied {step} of {attempt}{fence}"),
                _ => format!("the target refused {step} of {attempt}{fence}{}", reason(e)),
            }
        }
        _ if vocab::runner_process(e).is_some() => {
            let target = e.attempt.as_deref().map(|a| format!(" for {a}")).unwrap_or_default();
            match (e.kind, e.decision) {
                (EventType::Request, _) => format!("{runner} sent {f}{target}"),
                (EventType::Info, _) => format!("{runner}'s {f}{target} got no answer{}", reason(e)),
                (_, Some(d)) => format!("{runner}'s {f}{target} answered {}", crate::vocab::name_of(&d)),
                (_, None) => format!("{runner}'s {f}{target} answered{}", reason(e)),
            }
        }
        _ if vocab::is_final(e) => format!("final state of {job}: {}", e.outcome.as_deref().unwrap_or("?")),
        _ if vocab::is_nemesis(e) => {
            let on = e.runner.as_deref().map(|r| format!(" on {r}")).unwrap_or_default();
            format!("nemesis {f}{on}: {}", vocab::phase(e).unwrap_or(crate::vocab::name_of(&e.kind).as_str()))
        }
        _ if vocab::is_operator(e) => {
            let outcome = e.outcome.as_deref().map(|o| format!(": {o}")).unwrap_or_default();
            format!("the operator's {f} of {attempt} ({}){outcome}", crate::vocab::name_of(&e.kind))
        }
        _ => format!("{} {} {f}{}", vocab::process_name(e), crate::vocab::name_of(&e.kind), reason(e)),
    }
}

// ---------------------------------------------------------------------------------------------
// HTML

const MINI_LABEL_W: f64 = 150.0;
const MINI_W: f64 = 560.0;
const MINI_LANE_H: f64 = 20.0;

/// A story as HTML: `<details id="story-a<n>">` with the steps as a list (each step's event
/// linked to its row when the events table shows it, `shown`) and a mini-timeline of the
/// attempts involved.
pub fn story_html(
    story: &Story,
    events: &[Event],
    windows: &[FaultWindow],
    attempts: &[Attempt],
    shown: &BTreeSet<u64>,
) -> String {
    let mut s = format!(
        "<details class=\"story\" id=\"story-a{n}\"><summary>the story</summary>\n<ol class=\"story-steps\">\n",
        n = story.anomaly
    );
    for (k, step) in story.steps.iter().enumerate() {
        let link = match step.event {
            Some(i) if shown.contains(&i) => format!(" <a href=\"#e{i}\">#{i}</a>"),
            Some(i) => format!(" <span class=\"proof\">#{i}</span>"),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "<li class=\"{}\" id=\"story-a{}-s{k}\"><span class=\"t\">{}</span> {}{link}</li>",
            if step.proof { "proof" } else { "context" },
            story.anomaly,
            offset(step.t_ms),
            esc(&step.text)
        );
    }
    s.push_str("</ol>\n");
    s.push_str(&mini_timeline(story, events, windows, attempts));
    s.push_str("</details>");
    s
}

/// The attempts a story involves: those its steps name, in claim order.
fn story_attempts<'a>(story: &Story, events: &[Event], attempts: &'a [Attempt]) -> Vec<&'a Attempt> {
    let named: BTreeSet<&str> =
        story.steps.iter().filter_map(|s| find_event(events, s.event?)?.attempt.as_deref()).collect();
    attempts.iter().filter(|a| named.contains(a.attempt.as_str())).take(MAX_MINI_LANES).collect()
}

/// A small SVG: one lane per attempt involved (bar from claim to close, lease under it), each
/// step a numbered mark on its attempt's lane (red when it proves the anomaly), fault windows
/// as bands, over the story's span.
fn mini_timeline(story: &Story, events: &[Event], windows: &[FaultWindow], attempts: &[Attempt]) -> String {
    let lanes = story_attempts(story, events, attempts);
    let from = story.start_ns;
    let last = story.steps.iter().map(|s| from + s.t_ms * 1_000_000).max().unwrap_or(from);
    let span = (last - from).max(1_000_000);
    let (lo, hi) = (from.saturating_sub(span / 20), last + span / 20);
    let x = |t: u64| MINI_LABEL_W + ((t.clamp(lo, hi) - lo) as f64 / (hi - lo) as f64) * MINI_W;
    let rows = lanes.len().max(1);
    let height = 16.0 + rows as f64 * MINI_LANE_H + 4.0;
    let width = MINI_LABEL_W + MINI_W + 10.0;
    let mut s = format!(
        "<svg class=\"mini\" id=\"mini-a{}\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         role=\"img\" aria-label=\"the attempts of anomaly {}\">\n",
        story.anomaly, story.anomaly
    );
    for w in windows.iter().filter(|w| w.start_ns <= hi && w.end_ns >= lo).take(20) {
        let (x1, x2) = (x(w.start_ns), x(w.end_ns));
        let _ = writeln!(
            s,
            "<rect class=\"band\" x=\"{x1:.1}\" y=\"12\" width=\"{:.1}\" height=\"{:.1}\"><title>{}</title></rect>",
            (x2 - x1).max(1.0),
            height - 12.0,
            esc(&w.kind)
        );
    }
    let lane_of = |attempt: Option<&str>| lanes.iter().position(|a| Some(a.attempt.as_str()) == attempt);
    for (i, a) in lanes.iter().enumerate() {
        let y = 16.0 + i as f64 * MINI_LANE_H;
        let fence = a.fence.map(|f| format!(" f{f}")).unwrap_or_default();
        let (x1, x2) = (x(a.start_ns), x(a.end_ns.unwrap_or(hi)));
        let _ = writeln!(
            s,
            "<text class=\"lane-label\" x=\"4\" y=\"{:.1}\">{} · {}{fence}</text>\
             <rect class=\"attempt\" x=\"{x1:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"8\"/>",
            y + 11.0,
            esc(&a.attempt),
            esc(&a.runner),
            y + 3.0,
            (x2 - x1).max(2.0)
        );
        for &(l1, l2) in a.lease.iter().take(8) {
            let (l1, l2) = (x(l1), x(l2));
            let _ = write!(
                s,
                "<rect class=\"lease\" x=\"{l1:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"3\"/>",
                y + 12.0,
                (l2 - l1).max(1.0)
            );
        }
    }
    for (k, step) in story.steps.iter().enumerate() {
        let t = from + step.t_ms * 1_000_000;
        let attempt = step.event.and_then(|i| find_event(events, i)).and_then(|e| e.attempt.as_deref());
        let y = 16.0 + lane_of(attempt).unwrap_or(0) as f64 * MINI_LANE_H;
        let class = if step.proof { "mark proof" } else { "mark" };
        let _ = writeln!(
            s,
            "<a href=\"#story-a{}-s{k}\"><g class=\"{class}\"><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"6\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><title>{} {}</title></g></a>",
            story.anomaly,
            x(t),
            y + 7.0,
            x(t),
            y + 10.0,
            k + 1,
            offset(step.t_ms),
            esc(&step.text)
        );
    }
    let _ = writeln!(
        s,
        "<text class=\"tick\" x=\"{MINI_LABEL_W}\" y=\"9\">{}</text><text class=\"tick\" x=\"{:.1}\" y=\"9\" text-anchor=\"end\">{}</text>",
        offset(0),
        MINI_LABEL_W + MINI_W,
        offset((hi - from) / 1_000_000)
    );
    s.push_str("</svg>\n");
    s
}

/// Every story of the run rendered as HTML, indexed by anomaly number; events in `shown` (the
/// events table's rows) are linked.
pub fn rendered(run: &Run, events: &[Event], shown: &BTreeSet<u64>) -> Vec<String> {
    let horizon = model::horizon_ns(events, run.duration_ms, &run.schedule);
    let windows = model::fault_windows(&run.schedule, events, horizon);
    let attempts = model::attempts(events);
    stories(run, events).iter().map(|story| story_html(story, events, &windows, &attempts, shown)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkers::{CheckerResult, Verdict};
    use serde_json::json;

    const BASE: i64 = 1_700_000_000_000;
    const RULE: &str = "no result is accepted as the current completion of an attempt that was superseded";

    fn ledger(ms: u64, f: &str, claim: (&str, &str, u64), lease_ms: Option<i64>, decision: Option<Decision>) -> Event {
        let op = Op::parse(f).expect("a known op");
        let mut e = Event::new(ms * 1_000_000, history::Process::CONTROL_PLANE, EventType::Ledger, op)
            .with_claim("j1", claim.0, claim.1, claim.2);
        e.received_ms = Some(BASE + ms as i64);
        e.lease_expires_ms = lease_ms.map(|l| BASE + ms as i64 + l);
        e.decision = decision;
        e
    }

    /// The seed's walkthrough: r1 claims j1-a1 (fence 7), its heartbeats are delayed, the
    /// lease expires (uncertain), r2 claims j1-a2 (fence 8), r1's late success is accepted.
    fn history() -> Vec<Event> {
        let a1 = ("j1-a1", "r1", 7);
        let a2 = ("j1-a2", "r2", 8);
        let mut expire = ledger(1600, "expire", a1, None, None);
        expire.value = Some(json!({"seq": 4, "recorded_as": "uncertain"}));
        let mut late = ledger(2200, "result", a1, None, Some(Decision::Accepted));
        late.outcome = Some("succeeded".into());
        let mut refused = ledger(1700, "heartbeat", a1, None, Some(Decision::Rejected));
        refused.reason = Some("expired".into());
        let mut events = vec![
            Event::new(0, history::Process::CLIENT, EventType::Invoke, Op::Submit).with_job("j1"),
            Event::new(1_000_000, history::Process::CLIENT, EventType::Ok, Op::Submit).with_job("j1"),
            ledger(10, "claim", a1, Some(1000), None),
            ledger(500, "heartbeat", a1, Some(1000), Some(Decision::Accepted)),
            expire,
            refused,
            ledger(2000, "claim", a2, Some(1000), None),
            late,
            ledger(2900, "heartbeat", a2, Some(1000), Some(Decision::Accepted)),
        ];
        for (i, e) in events.iter_mut().enumerate() {
            e.index = i as u64;
        }
        events
    }

    fn run(events: &[Event]) -> Run {
        let anomaly = Anomaly {
            checker: "stale-completion".into(),
            kind: "late-report-accepted".into(),
            job: Some("j1".into()),
            attempts: vec!["j1-a1".into(), "j1-a2".into()],
            runners: vec!["r1".into(), "r2".into()],
            fences: vec![7, 8],
            key: None,
            events: vec![events[4].index, events[6].index, events[7].index],
            message: "late report for j1-a1 accepted".into(),
        };
        Run {
            test_name: "t".into(),
            seed: 1,
            command: "fencelab run".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            duration_ms: 3000,
            config: json!({}),
            complete: true,
            schedule: json!([{"at_ms": 600, "duration_ms": 2000, "kind": "delayed-heartbeats", "runner": "r1"}]),
            checkers: vec![
                CheckerResult { checker: "other".into(), description: "d".into(), verdict: Verdict::Valid },
                CheckerResult {
                    checker: "stale-completion".into(),
                    description: RULE.into(),
                    verdict: Verdict::Invalid { anomalies: vec![anomaly] },
                },
            ],
        }
    }

    #[test]
    fn the_story_is_told_in_the_seeds_words_from_its_events() {
        let events = history();
        let stories = stories(&run(&events), &events);
        assert_eq!(stories.len(), 1);
        let story = &stories[0];
        assert_eq!((story.anomaly, story.checker.as_str(), story.rule.as_str()), (0, "stale-completion", RULE));
        assert_eq!(
            story.lines(),
            vec![
                "t+0.000 s  r1 claimed j1-a1 with fence 7, lease 1000 ms".to_string(),
                "t+0.590 s  fault delayed-heartbeats on r1 begins".into(),
                "t+1.590 s  j1-a1's lease expired, job j1 uncertain".into(),
                "t+1.690 s  r1's heartbeat for j1-a1 refused (expired)".into(),
                "t+1.990 s  r2 claimed j1-a2 with fence 8, lease 1000 ms".into(),
                format!("t+2.190 s  r1's success for j1-a1 accepted as current — the rule broken: {RULE}"),
            ]
        );
        let proofs: Vec<Option<u64>> = story.steps.iter().filter(|s| s.proof).map(|s| s.event).collect();
        assert_eq!(proofs, vec![Some(4), Some(6), Some(7)]);
        assert_eq!(story.steps[1].event, None, "a fault window is a step without an event");
        assert_eq!(story.start_ns, 10_000_000);
    }

    #[test]
    fn a_fault_in_effect_before_the_story_starts_is_told_at_its_start() {
        let events = history();
        let mut run = run(&events);
        // The target's clock, moved long before the claim and back after the last proof.
        run.schedule = json!([{"at_ms": 0, "duration_ms": 5000, "kind": "target-clock-skew"}]);
        let story = &stories(&run, &events)[0];
        assert_eq!(story.lines()[1], "t+0.000 s  fault target-clock-skew in effect (it began 0.010 s before)");
    }

    #[test]
    fn a_story_keeps_every_proof_within_its_bound() {
        let mut events = history();
        // Forty more refused results of j1-a1 before the late one: context, not proof.
        let mut extra: Vec<Event> =
            (0..40).map(|k| ledger(1800 + k, "result", ("j1-a1", "r1", 7), None, Some(Decision::Rejected))).collect();
        let tail = events.split_off(7);
        events.append(&mut extra);
        events.extend(tail);
        for (i, e) in events.iter_mut().enumerate() {
            e.index = i as u64;
        }
        let mut r = run(&events);
        let late =
            events.iter().find(|e| e.decision == Some(Decision::Accepted) && vocab::f_is(e, Op::Result)).unwrap();
        if let Verdict::Invalid { anomalies } = &mut r.checkers[1].verdict {
            anomalies[0].events = vec![4, 6, late.index];
        }
        let story = &stories(&r, &events)[0];
        assert_eq!(story.steps.len(), MAX_STEPS);
        assert_eq!(story.steps.iter().filter(|s| s.proof).count(), 3, "every proof is told");
        assert!(story.steps.last().unwrap().text.ends_with(RULE));
    }

    #[test]
    fn the_story_html_has_steps_linked_to_events_and_a_mini_timeline() {
        let events = history();
        let r = run(&events);
        let mut shown: BTreeSet<u64> = (0..events.len() as u64).collect();
        shown.remove(&2);
        let html = rendered(&r, &events, &shown).remove(0);
        assert!(html.contains("with fence 7, lease 1000 ms <span class=\"proof\">#2</span></li>"), "{html}");
        assert!(html.starts_with("<details class=\"story\" id=\"story-a0\">"), "{html}");
        assert!(html.contains("<li class=\"proof\" id=\"story-a0-s2\"><span class=\"t\">t+1.590 s</span> j1-a1&#39;s lease expired, job j1 uncertain <a href=\"#e4\">#4</a></li>"), "{html}");
        assert!(html.contains("<svg class=\"mini\" id=\"mini-a0\""));
        assert!(html.contains(">j1-a1 · r1 f7</text>") && html.contains(">j1-a2 · r2 f8</text>"), "{html}");
        assert_eq!(html.matches("<g class=\"mark proof\">").count(), 3);
        assert_eq!(html.matches("<a href=\"#story-a0-s").count(), 6, "every step is a mark linking its line");
        // The marks are numbered as the list is, from 1.
        assert!(html.contains("text-anchor=\"middle\">1</text>") && html.contains("text-anchor=\"middle\">6</text>"));
        assert!(!html.contains("text-anchor=\"middle\">0</text>"), "no mark 0");
        assert!(html.contains("<rect class=\"band\""), "the fault window is drawn");
    }

    #[test]
    fn events_are_said_in_words() {
        let mut step =
            Event::new(0, history::Process::TARGET, EventType::Step, Op::Step).with_claim("j1", "j1-a1", "r1", 7);
        step.value = Some(json!({"step": 2}));
        let refused = step.clone().with_decision(Decision::Rejected, Some(history::Reason::StaleFence));
        assert_eq!(say(&step.with_decision(Decision::Accepted, None)), "the target applied step 2 of j1-a1 (fence 7)");
        assert_eq!(say(&refused), "the target refused step 2 of j1-a1 (fence 7) (stale_fence)");
        let mut conflict = ledger(0, "result", ("j1-a2", "r2", 8), None, Some(Decision::Conflict));
        conflict.outcome = Some("failed".into());
        assert_eq!(say(&conflict), "r2's failure for j1-a2 recorded as a conflict");
        let mut requeued = ledger(0, "expire", ("j1-a2", "r2", 8), None, None);
        requeued.value = Some(json!({"recorded_as": "requeued"}));
        assert_eq!(say(&requeued), "j1-a2's lease expired, job j1 requeued");
        let mut reconcile = ledger(0, "reconcile", ("j1-a2", "r2", 8), None, None);
        reconcile.outcome = Some("stopped".into());
        assert_eq!(say(&reconcile), "the operator reconciled j1-a2: stopped");
    }
}
