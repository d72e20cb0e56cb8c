//! The report's plots, each one inline SVG on the run's clock with the fault windows as bands:
//! request latency per runner request kind (log scale, one point per request, coloured by its
//! answer), throughput per second (submitted, claimed, succeeded, failed, uncertain) and lease
//! margin (how much lease an accepted heartbeat had left when the server received it; refused
//! heartbeats marked).
//!
//! Pure: a history (and the run's fault windows) in, SVG text out. Bounded: at most
//! [`MAX_POINTS`] points per latency panel and for the lease margin, at most [`MAX_BUCKETS`]
//! throughput buckets and [`MAX_BANDS`] fault bands per plot. Points are thinned
//! deterministically ([`thin`]): the notable ones (every answer that is not an acceptance,
//! every refused heartbeat) up to half the cap, then the lowest and highest point of every
//! pixel column of the rest, then an evenly spaced sample of those, keeping the overall
//! lowest and highest. Points of one class are one `<path>` (round dots), so a plot's element
//! count stays small whatever the history.

use crate::escape::html as esc;
use crate::model::{self, FaultWindow};
use crate::vocab;
use crate::Run;
use history::{Decision, Event, EventType, Op, RecordedAs};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Most points drawn per latency panel, and on the lease-margin plot.
pub const MAX_POINTS: usize = 1200;
/// Most buckets per throughput series (a bucket is one second, or more on long runs).
pub const MAX_BUCKETS: usize = 600;
/// Most fault bands drawn per plot.
pub const MAX_BANDS: usize = 300;

const LEFT: f64 = 70.0;
/// The top row of a latency panel, where unanswered requests sit.
const NO_ANSWER_ROW_H: f64 = 8.0;
const PLOT_W: f64 = 1000.0;
const WIDTH: f64 = LEFT + PLOT_W + 20.0;
const MS: f64 = 1e6;

/// One rendered plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// The SVG's id: `plot-latency`, `plot-throughput`, `plot-lease-margin`.
    pub id: &'static str,
    pub title: &'static str,
    pub svg: String,
    /// What is drawn and what was thinned out.
    pub caption: String,
    /// Points (or buckets) drawn.
    pub drawn: usize,
}

/// What every plot shares: the time axis's end and the fault windows.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub horizon_ns: u64,
    pub windows: Vec<FaultWindow>,
}

impl Frame {
    /// The run's time axis (as the timeline's) and its fault windows.
    pub fn of(run: &Run, events: &[Event]) -> Frame {
        let horizon_ns = model::horizon_ns(events, run.duration_ms, &run.schedule);
        Frame { horizon_ns, windows: model::fault_windows(&run.schedule, events, horizon_ns) }
    }

    fn x(&self, t: u64) -> f64 {
        LEFT + (t.min(self.horizon_ns) as f64 / self.horizon_ns.max(1) as f64) * PLOT_W
    }
}

/// Every plot of the report, in order.
pub fn all(run: &Run, events: &[Event]) -> Vec<Plot> {
    let frame = Frame::of(run, events);
    vec![latency_plot(events, &frame), throughput_plot(events, &frame), lease_margin_plot(events, &frame)]
}

// ---------------------------------------------------------------------------------------------
// Data

/// How a runner's request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Answer {
    Accepted,
    Refused,
    Duplicate,
    Conflict,
    /// Answered, nothing granted (a claim poll with no job to claim).
    Empty,
    /// No answer: a transport error or timeout (`info`), or no answer logged at all.
    NoAnswer,
}

impl Answer {
    pub const ALL: [Answer; 6] =
        [Answer::Accepted, Answer::Refused, Answer::Duplicate, Answer::Conflict, Answer::Empty, Answer::NoAnswer];

    pub fn name(self) -> &'static str {
        match self {
            Answer::Accepted => "accepted",
            Answer::Refused => "refused",
            Answer::Duplicate => "duplicate",
            Answer::Conflict => "conflict",
            Answer::Empty => "nothing to claim",
            Answer::NoAnswer => "no answer",
        }
    }

    fn class(self) -> &'static str {
        match self {
            Answer::Accepted => "a-accepted",
            Answer::Refused => "a-refused",
            Answer::Duplicate => "a-duplicate",
            Answer::Conflict => "a-conflict",
            Answer::Empty => "a-empty",
            Answer::NoAnswer => "a-none",
        }
    }

    fn of(answer: &Event) -> Answer {
        match (answer.kind, answer.decision) {
            (EventType::Info, _) => Answer::NoAnswer,
            (_, Some(Decision::Accepted)) => Answer::Accepted,
            (_, Some(Decision::Rejected)) => Answer::Refused,
            (_, Some(Decision::Duplicate)) => Answer::Duplicate,
            (_, Some(Decision::Conflict)) => Answer::Conflict,
            // A claim answered with a claim is a grant, whether or not a decision was logged.
            (_, None) if vocab::f_is(answer, Op::Claim) && answer.attempt.is_some() => Answer::Accepted,
            (_, None) if answer.reason.as_deref() == Some("none_claimable") => Answer::Empty,
            (_, None) => Answer::Refused,
        }
    }
}

/// One runner request and its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// The request kind (`claim`, `heartbeat`, `capability`, `result`, `step`).
    pub kind: String,
    pub runner: String,
    /// When the request was sent (run clock).
    pub t_ns: u64,
    /// Time to its answer; `None` when no answer was logged at all.
    pub latency_ns: Option<u64>,
    pub answer: Answer,
}

/// Every runner request paired with its answer: a runner makes one call of a kind at a time,
/// so the answer of a request is the next `response` or `info` of the same runner and kind.
pub fn request_latencies(events: &[Event]) -> Vec<Latency> {
    let mut open: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    let mut out: Vec<Latency> = Vec::new();
    for e in events {
        let Some(runner) = vocab::runner_process(e) else { continue };
        let key = (runner, vocab::f_name(e));
        match e.kind {
            EventType::Request => {
                open.entry(key).or_default().push(out.len());
                out.push(Latency {
                    kind: vocab::f_name(e).to_string(),
                    runner: runner.to_string(),
                    t_ns: e.time_ns,
                    latency_ns: None,
                    answer: Answer::NoAnswer,
                });
            }
            EventType::Response | EventType::Info => {
                let Some(queue) = open.get_mut(&key) else { continue };
                if queue.is_empty() {
                    continue;
                }
                let l = &mut out[queue.remove(0)];
                l.latency_ns = Some(e.time_ns.saturating_sub(l.t_ns));
                l.answer = Answer::of(e);
            }
            _ => {}
        }
    }
    out
}

/// Throughput series, counts per bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    /// Bucket width in seconds (1 unless the run is longer than [`MAX_BUCKETS`] seconds).
    pub bucket_s: u64,
    /// (series name, count per bucket), in the order submitted, claimed, succeeded, failed,
    /// uncertain.
    pub series: Vec<(&'static str, Vec<u32>)>,
}

pub const SERIES: [&str; 5] = ["submitted", "claimed", "succeeded", "failed", "uncertain"];

/// Which throughput series an event counts in: a client submit answered `ok`, a ledger
/// claim, an accepted ledger result by its outcome, a ledger expire that left the job
/// uncertain.
fn series_of(e: &Event) -> Option<usize> {
    if vocab::is_submit(e) && e.kind == EventType::Ok {
        return Some(0);
    }
    if vocab::is_ledger_f(e, Op::Claim) {
        return Some(1);
    }
    if vocab::is_ledger_f(e, Op::Result) && e.decision == Some(Decision::Accepted) {
        return match e.outcome.as_deref() {
            Some("succeeded") => Some(2),
            Some("failed") => Some(3),
            _ => None,
        };
    }
    if vocab::is_ledger_f(e, Op::Expire) && matches!(vocab::recorded_as(e), None | Some(RecordedAs::Uncertain)) {
        return Some(4);
    }
    None
}

pub fn throughput(events: &[Event], horizon_ns: u64) -> Throughput {
    let seconds = horizon_ns.div_ceil(1_000_000_000).max(1);
    let bucket_s = seconds.div_ceil(MAX_BUCKETS as u64).max(1);
    let buckets = seconds.div_ceil(bucket_s) as usize;
    let mut series: Vec<(&'static str, Vec<u32>)> = SERIES.iter().map(|s| (*s, vec![0; buckets])).collect();
    for e in events {
        if let Some(i) = series_of(e) {
            let b = ((e.time_ns / 1_000_000_000) / bucket_s) as usize;
            series[i].1[b.min(buckets - 1)] += 1;
        }
    }
    Throughput { bucket_s, series }
}

/// One ledger heartbeat and the lease its attempt had left when the server received it.
#[derive(Clone, Debug, PartialEq)]
pub struct Margin {
    pub t_ns: u64,
    pub attempt: String,
    pub runner: String,
    /// The attempt's lease end before this heartbeat minus its `received_ms` (server clock):
    /// negative when the lease had already lapsed.
    pub margin_ms: i64,
    pub accepted: bool,
}

/// The lease margins of every ledger heartbeat of an attempt whose lease is known (from its
/// claim and the accepted heartbeats before it), and the lease lengths granted at claim.
pub fn lease_margins(events: &[Event]) -> (Vec<Margin>, Vec<i64>) {
    let mut lease_end: BTreeMap<&str, i64> = BTreeMap::new();
    let mut margins = Vec::new();
    let mut ttls = Vec::new();
    for e in events.iter().filter(|e| e.kind == EventType::Ledger) {
        let Some(attempt) = e.attempt.as_deref() else { continue };
        if vocab::is_ledger_f(e, Op::Claim) {
            if let Some(end) = e.lease_expires_ms {
                lease_end.insert(attempt, end);
                if let Some(received) = e.received_ms {
                    ttls.push(end - received);
                }
            }
            continue;
        }
        if !vocab::is_ledger_f(e, Op::Heartbeat) {
            continue;
        }
        let (Some(&end), Some(received)) = (lease_end.get(attempt), e.received_ms) else { continue };
        let accepted = e.decision == Some(Decision::Accepted);
        margins.push(Margin {
            t_ns: e.time_ns,
            attempt: attempt.to_string(),
            runner: e.runner.clone().unwrap_or_default(),
            margin_ms: end - received,
            accepted,
        });
        if let (true, Some(new_end)) = (accepted, e.lease_expires_ms) {
            lease_end.insert(attempt, new_end);
        }
    }
    (margins, ttls)
}

// ---------------------------------------------------------------------------------------------
// Thinning

/// A point in pixels, its class (an index into the plot's classes) and whether it is notable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dot {
    pub x: f64,
    pub y: f64,
    pub class: usize,
    pub notable: bool,
}

/// At most `cap` of `dots`, deterministically: every dot when they fit; else the notable dots
/// up to half the cap (an evenly spaced sample when more), then the lowest and highest dot of
/// every pixel column of the others (an evenly spaced sample of those when more), always
/// keeping the overall lowest and highest. Returns the dots kept and how many were left out.
pub fn thin(dots: Vec<Dot>, cap: usize) -> (Vec<Dot>, usize) {
    let total = dots.len();
    if total <= cap {
        return (dots, 0);
    }
    let (notable, plain): (Vec<Dot>, Vec<Dot>) = dots.into_iter().partition(|d| d.notable);
    let mut kept = sample(notable, cap / 2);
    let mut columns: BTreeMap<i64, (Dot, Dot)> = BTreeMap::new();
    for d in &plain {
        let column = columns.entry(d.x.round() as i64).or_insert((*d, *d));
        if d.y < column.0.y {
            column.0 = *d;
        }
        if d.y > column.1.y {
            column.1 = *d;
        }
    }
    let lowest = plain.iter().copied().reduce(|a, b| if b.y > a.y { b } else { a });
    let highest = plain.iter().copied().reduce(|a, b| if b.y < a.y { b } else { a });
    let extremes: Vec<Dot> =
        columns.into_values().flat_map(|(lo, hi)| if lo == hi { vec![lo] } else { vec![lo, hi] }).collect();
    let room = cap.saturating_sub(kept.len()).saturating_sub(2);
    let mut chosen = sample(extremes, room);
    for d in [lowest, highest].into_iter().flatten() {
        if !chosen.contains(&d) {
            chosen.push(d);
        }
    }
    kept.extend(chosen);
    let left_out = total - kept.len();
    (kept, left_out)
}

/// At most `n` items, evenly spaced, in order.
fn sample<T: Copy>(items: Vec<T>, n: usize) -> Vec<T> {
    if items.len() <= n {
        return items;
    }
    (0..n).map(|k| items[k * items.len() / n]).collect()
}

// ---------------------------------------------------------------------------------------------
// Drawing

fn secs(t: u64) -> String {
    format!("{:.3} s", t as f64 / 1e9)
}

/// A "nice" step (1, 2 or 5 times a power of ten) for about `parts` parts of `span`.
fn nice_step(span: f64, parts: f64) -> f64 {
    let raw = (span / parts).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}

fn open_svg(out: &mut String, id: &str, height: f64, label: &str, drawn: usize) {
    let _ = writeln!(
        out,
        "<svg id=\"{id}\" class=\"plot\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" \
         role=\"img\" aria-label=\"{}\" data-points=\"{drawn}\">",
        esc(label)
    );
}

/// The fault windows as bands from `top` to `bottom`, each with a tooltip.
fn bands(out: &mut String, frame: &Frame, top: f64, bottom: f64) {
    out.push_str("<g class=\"bands\">");
    for w in frame.windows.iter().take(MAX_BANDS) {
        let (x1, x2) = (frame.x(w.start_ns), frame.x(w.end_ns));
        let who = w.runner.as_deref().map(|r| format!(" on {r}")).unwrap_or_default();
        let title = esc(&format!("{}{who}: {} to {}", w.kind, secs(w.start_ns), secs(w.end_ns)));
        let _ = write!(
            out,
            "<rect class=\"band\" x=\"{x1:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{title}</title></rect>",
            (x2 - x1).max(1.0),
            bottom - top
        );
    }
    out.push_str("</g>\n");
}

/// The time axis: grid lines from `top` to `bottom`, labels under `bottom`.
fn time_axis(out: &mut String, frame: &Frame, top: f64, bottom: f64) {
    let span_s = frame.horizon_ns as f64 / 1e9;
    let step = nice_step(span_s, 10.0);
    out.push_str("<g class=\"axis\">");
    let mut k = 0.0;
    while k * step <= span_s + 1e-9 {
        let t = k * step;
        let x = frame.x((t * 1e9) as u64);
        let label = if step < 1.0 { format!("{:.0} ms", t * 1000.0) } else { format!("{t:.0} s") };
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            bottom + 12.0
        );
        k += 1.0;
    }
    out.push_str("</g>\n");
}

/// A horizontal rule with a label at the left, at `y`.
fn rule(out: &mut String, class: &str, y: f64, label: &str) {
    let _ = write!(
        out,
        "<line class=\"{class}\" x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>\
         <text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
        LEFT + PLOT_W,
        LEFT - 4.0,
        y + 3.0,
        esc(label)
    );
}

/// Dots as one `<path>` per class (zero-length segments drawn with round caps).
fn dots(out: &mut String, dots: &[Dot], classes: &[&str]) {
    for (i, class) in classes.iter().enumerate() {
        let mut d = String::new();
        for p in dots.iter().filter(|p| p.class == i) {
            let _ = write!(d, "M{:.1} {:.1}h0", p.x, p.y);
        }
        if !d.is_empty() {
            let _ = writeln!(out, "<path class=\"dots {class}\" d=\"{d}\"/>");
        }
    }
}

/// A duration in ms as text: µs under 1 ms, s from 1000 ms.
fn duration_label(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{} s", ms / 1000.0)
    } else if ms >= 1.0 {
        format!("{ms} ms")
    } else {
        format!("{} µs", (ms * 1000.0).round())
    }
}

const PANEL_H: f64 = 90.0;
const PANEL_GAP: f64 = 24.0;
/// Latencies below this many ms are drawn at it (log scale).
const LATENCY_FLOOR_MS: f64 = 0.01;

/// Request latency over time, one panel per runner request kind, log scale.
pub fn latency_plot(events: &[Event], frame: &Frame) -> Plot {
    let all = request_latencies(events);
    // The time to give up on a request is no latency: unanswered ones sit on their own row.
    let answered = all
        .iter()
        .filter(|l| l.answer != Answer::NoAnswer)
        .filter_map(|l| l.latency_ns)
        .map(|ns| (ns as f64 / MS).max(LATENCY_FLOOR_MS));
    let (lo, hi) = answered.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo_dec, mut hi_dec) = if lo > hi { (0, 3) } else { (lo.log10().floor() as i32, hi.log10().ceil() as i32) };
    if hi_dec <= lo_dec {
        hi_dec = lo_dec + 1;
    }
    let height = PANEL_GAP + vocab::REQUEST_KINDS.len() as f64 * (PANEL_H + PANEL_GAP) + 4.0;
    let bottom = height - PANEL_GAP + 4.0;
    let mut body = String::new();
    let (mut drawn, mut left_out) = (0, 0);
    let classes: Vec<&str> = Answer::ALL.iter().map(|a| a.class()).collect();
    for (k, kind) in vocab::REQUEST_KINDS.iter().enumerate() {
        let top = PANEL_GAP + k as f64 * (PANEL_H + PANEL_GAP);
        // The panel's top row holds the unanswered requests; latencies fill the rest.
        let y = |ms: f64| {
            let f = (ms.max(LATENCY_FLOOR_MS).log10() - lo_dec as f64) / (hi_dec - lo_dec) as f64;
            top + (PANEL_H - NO_ANSWER_ROW_H) * (1.0 - f.clamp(0.0, 1.0))
        };
        let mine: Vec<&Latency> = all.iter().filter(|l| l.kind == kind.as_str()).collect();
        let mut counts: BTreeMap<Answer, usize> = BTreeMap::new();
        for l in &mine {
            *counts.entry(l.answer).or_default() += 1;
        }
        let summary: Vec<String> = counts.iter().map(|(a, n)| format!("{n} {}", a.name())).collect();
        let title = if mine.is_empty() {
            format!("{kind}: no requests")
        } else {
            format!("{kind}: {} requests ({})", mine.len(), summary.join(", "))
        };
        let _ = write!(
            body,
            "<g class=\"panel\" id=\"latency-{kind}\"><text class=\"panel-title\" x=\"{LEFT}\" y=\"{:.1}\">{}</text>\
             <rect class=\"frame\" x=\"{LEFT}\" y=\"{top:.1}\" width=\"{PLOT_W}\" height=\"{PANEL_H}\"/>",
            top - 6.0,
            esc(&title)
        );
        for dec in lo_dec..=hi_dec {
            let ms = 10f64.powi(dec);
            rule(&mut body, "grid", y(ms) + NO_ANSWER_ROW_H, &duration_label(ms));
        }
        rule(&mut body, "no-answer", top + NO_ANSWER_ROW_H / 2.0, "no answer");
        let points: Vec<Dot> = mine
            .iter()
            .map(|l| Dot {
                x: frame.x(l.t_ns),
                y: match (l.answer, l.latency_ns) {
                    (Answer::NoAnswer, _) | (_, None) => top + NO_ANSWER_ROW_H / 2.0,
                    (_, Some(ns)) => y(ns as f64 / MS) + NO_ANSWER_ROW_H,
                },
                class: Answer::ALL.iter().position(|a| *a == l.answer).unwrap_or(0),
                notable: l.answer != Answer::Accepted && l.answer != Answer::Empty,
            })
            .collect();
        let (kept, out) = thin(points, MAX_POINTS);
        drawn += kept.len();
        left_out += out;
        dots(&mut body, &kept, &classes);
        body.push_str("</g>\n");
    }
    let mut svg = String::new();
    open_svg(&mut svg, "plot-latency", height + 14.0, "request latency over time per request kind", drawn);
    bands(&mut svg, frame, PANEL_GAP, bottom);
    time_axis(&mut svg, frame, PANEL_GAP, bottom);
    svg.push_str(&body);
    svg.push_str("</svg>\n");
    let mut caption = format!(
        "{} requests, one point each at the time it was sent, its height the time to its answer (log scale); \
         a request that got no answer (a transport error, a timeout, or none logged) sits on the top row of its \
         panel, marked \u{201c}no answer\u{201d}, however soon it gave up.",
        all.len()
    );
    if left_out > 0 {
        let _ = write!(
            caption,
            " {drawn} points drawn: every refused, duplicate, conflicting or unanswered one first (up to {} a \
             panel), then the fastest and slowest of each pixel column; {left_out} left out.",
            MAX_POINTS / 2
        );
    }
    Plot { id: "plot-latency", title: "Request latency", svg, caption, drawn }
}

/// The height of a throughput panel (one per series) and the gap above each.
const THROUGHPUT_PANEL_H: f64 = 42.0;
const THROUGHPUT_GAP: f64 = 18.0;

/// Jobs submitted, claimed, succeeded, failed and made uncertain per second: one panel per
/// series on one time axis and one scale, so that no line hides another.
pub fn throughput_plot(events: &[Event], frame: &Frame) -> Plot {
    let t = throughput(events, frame.horizon_ns);
    let per_s = |n: u32| n as f64 / t.bucket_s as f64;
    let max = t.series.iter().flat_map(|(_, v)| v.iter().copied()).map(per_s).fold(0.0, f64::max).max(1.0);
    let step = nice_step(max, 2.0);
    let ymax = (max / step).ceil() * step;
    let (top, bottom) = (THROUGHPUT_GAP, t.series.len() as f64 * (THROUGHPUT_PANEL_H + THROUGHPUT_GAP));
    let mut svg = String::new();
    let buckets = t.series.first().map(|s| s.1.len()).unwrap_or(0);
    open_svg(&mut svg, "plot-throughput", bottom + 20.0, "throughput per second", buckets);
    bands(&mut svg, frame, top, bottom);
    time_axis(&mut svg, frame, top, bottom);
    let bucket_ns = t.bucket_s * 1_000_000_000;
    for (k, (name, counts)) in t.series.iter().enumerate() {
        let panel_top = THROUGHPUT_GAP + k as f64 * (THROUGHPUT_PANEL_H + THROUGHPUT_GAP);
        let y = |v: f64| panel_top + THROUGHPUT_PANEL_H * (1.0 - v / ymax);
        let total: u32 = counts.iter().sum();
        let peak = counts.iter().copied().map(per_s).fold(0.0, f64::max);
        let _ = write!(
            svg,
            "<g class=\"panel\" id=\"throughput-{name}\"><text class=\"panel-title\" x=\"{LEFT}\" y=\"{:.1}\">{name}: \
             {total} in all, at most {peak:.1}/s</text><rect class=\"frame\" x=\"{LEFT}\" y=\"{panel_top:.1}\" \
             width=\"{PLOT_W}\" height=\"{THROUGHPUT_PANEL_H}\"/>",
            panel_top - 4.0
        );
        rule(&mut svg, "grid", y(ymax), &format!("{ymax}/s"));
        rule(&mut svg, "grid", y(0.0), "0");
        let mut points = String::new();
        for (i, &n) in counts.iter().enumerate() {
            let (x1, x2) = (frame.x(i as u64 * bucket_ns), frame.x((i as u64 + 1) * bucket_ns));
            let _ = write!(points, "{x1:.1},{:.1} {x2:.1},{:.1} ", y(per_s(n)), y(per_s(n)));
        }
        let _ = writeln!(
            svg,
            "<polyline class=\"series s-{name}\" points=\"{}\"><title>{name}: {total} in all</title></polyline></g>",
            points.trim_end()
        );
    }
    svg.push_str("</svg>\n");
    let totals: Vec<String> = t.series.iter().map(|(name, v)| format!("{} {name}", v.iter().sum::<u32>())).collect();
    let per =
        if t.bucket_s == 1 { "per second".to_string() } else { format!("per second, averaged over {} s", t.bucket_s) };
    let caption = format!("Jobs {per}: {}.", totals.join(", "));
    Plot { id: "plot-throughput", title: "Throughput", svg, caption, drawn: buckets }
}

const MARGIN_H: f64 = 200.0;

/// For every ledger heartbeat, the lease its attempt had left when the server received it.
pub fn lease_margin_plot(events: &[Event], frame: &Frame) -> Plot {
    let (margins, ttls) = lease_margins(events);
    let ttl = ttls.iter().copied().max();
    let values = margins.iter().map(|m| m.margin_ms).chain(ttl).chain([0]);
    let (lo, hi) = values.fold((i64::MAX, i64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let span = ((hi - lo) as f64).max(1.0);
    let (vlo, vhi) = (lo as f64 - span * 0.05, hi as f64 + span * 0.05);
    let (top, bottom) = (10.0, 10.0 + MARGIN_H);
    let y = |ms: f64| bottom - MARGIN_H * ((ms - vlo) / (vhi - vlo));
    let points: Vec<Dot> = margins
        .iter()
        .map(|m| Dot {
            x: frame.x(m.t_ns),
            y: y(m.margin_ms as f64),
            class: !m.accepted as usize,
            notable: !m.accepted,
        })
        .collect();
    let (kept, left_out) = thin(points, MAX_POINTS);
    let mut svg = String::new();
    open_svg(&mut svg, "plot-lease-margin", bottom + 20.0, "lease left at each heartbeat", kept.len());
    bands(&mut svg, frame, top, bottom);
    time_axis(&mut svg, frame, top, bottom);
    let _ = write!(svg, "<rect class=\"frame\" x=\"{LEFT}\" y=\"{top}\" width=\"{PLOT_W}\" height=\"{MARGIN_H}\"/>");
    let step = nice_step(vhi - vlo, 5.0);
    let mut v = (vlo / step).ceil() * step;
    while v <= vhi {
        if v != 0.0 && ttl.is_none_or(|t| (v - t as f64).abs() > step / 4.0) {
            rule(&mut svg, "grid", y(v), &format!("{v} ms"));
        }
        v += step;
    }
    rule(&mut svg, "zero", y(0.0), "0: lapsed");
    if let Some(ttl) = ttl {
        rule(&mut svg, "ttl", y(ttl as f64), &format!("TTL {ttl} ms"));
    }
    dots(&mut svg, &kept.iter().filter(|d| d.class == 0).copied().collect::<Vec<_>>(), &["m-accepted"]);
    let mut crosses = String::new();
    for d in kept.iter().filter(|d| d.class == 1) {
        let _ = write!(crosses, "M{:.1} {:.1}l6 6m0 -6l-6 6", d.x - 3.0, d.y - 3.0);
    }
    if !crosses.is_empty() {
        let _ = writeln!(svg, "<path class=\"cross m-refused\" d=\"{crosses}\"/>");
    }
    svg.push_str("</svg>\n");
    let refused = margins.iter().filter(|m| !m.accepted).count();
    let lapsed = margins.iter().filter(|m| m.accepted && m.margin_ms < 0).count();
    let mut caption = format!(
        "{} heartbeats ({} accepted, {refused} refused); {lapsed} accepted after their lease had lapsed.",
        margins.len(),
        margins.len() - refused
    );
    if let (Some(min), Some(ttl)) = (margins.iter().filter(|m| m.accepted).map(|m| m.margin_ms).min(), ttl) {
        let _ = write!(caption, " Least lease left at an accepted heartbeat: {min} ms of {ttl} ms.");
    }
    if left_out > 0 {
        let _ = write!(
            caption,
            " {} points drawn (refused first, then the extremes of each pixel column); {left_out} left out.",
            kept.len()
        );
    }
    Plot { id: "plot-lease-margin", title: "Lease margin", svg, caption, drawn: kept.len() }
}

/// The legend of the plots, as HTML.
pub fn legend() -> String {
    let mut s = String::from("<ul class=\"legend\" id=\"plots-legend\">");
    for a in Answer::ALL {
        let _ = write!(s, "<li><span class=\"sw pdot {}\"></span>{}</li>", a.class(), a.name());
    }
    for name in SERIES {
        let _ = write!(s, "<li><span class=\"sw pline s-{name}\"></span>{name}</li>");
    }
    s.push_str(
        "<li><span class=\"sw pdot m-accepted\"></span>heartbeat accepted (lease left)</li>\
         <li><span class=\"sw pcross\">×</span>heartbeat refused</li>\
         <li><span class=\"sw fault\"></span>fault window</li></ul>",
    );
    s
}

/// The plots section of report.html.
pub fn section(out: &mut String, run: &Run, events: &[Event]) {
    let plots = all(run, events);
    let _ = writeln!(out, "<section id=\"plots\">\n<h2>Plots</h2>\n{}", legend());
    for p in &plots {
        let _ = write!(
            out,
            "<figure class=\"plot\" id=\"{}-figure\">\n<figcaption><strong>{}</strong>. {} \
             <button type=\"button\" class=\"save-plot\" data-plot=\"{}\">save as SVG</button></figcaption>\n\
             <div class=\"scroll\">\n{}</div>\n</figure>\n",
            p.id,
            p.title,
            esc(&p.caption),
            p.id,
            p.svg
        );
    }
    out.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const BASE: i64 = 1_700_000_000_000;

    fn at(ms: u64, process: &str, kind: EventType, f: &str) -> Event {
        let process = history::Process::parse(process).expect("a known process");
        Event::new(ms * 1_000_000, process, kind, Op::parse(f).expect("a known op"))
    }

    fn answer(ms: u64, runner: &str, f: &str, decision: Option<Decision>) -> Event {
        let mut e = at(ms, &format!("runner:{runner}"), EventType::Response, f);
        e.decision = decision;
        e
    }

    fn ledger(ms: u64, f: &str, attempt: &str, lease_ms: Option<i64>, decision: Option<Decision>) -> Event {
        let mut e = at(ms, "control-plane", EventType::Ledger, f).with_claim("j1", attempt, "r1", 1);
        e.received_ms = Some(BASE + ms as i64);
        e.lease_expires_ms = lease_ms.map(|l| BASE + ms as i64 + l);
        e.decision = decision;
        e
    }

    fn frame(horizon_ms: u64) -> Frame {
        Frame { horizon_ns: horizon_ms * 1_000_000, windows: vec![] }
    }

    #[test]
    fn requests_pair_with_the_next_answer_of_the_same_runner_and_kind() {
        let events = vec![
            at(0, "runner:r1", EventType::Request, "claim"),
            at(1, "runner:r2", EventType::Request, "heartbeat"),
            at(2, "runner:r1", EventType::Request, "heartbeat"),
            answer(5, "r1", "claim", Some(Decision::Accepted)),
            answer(9, "r1", "heartbeat", Some(Decision::Rejected)),
            at(40, "runner:r2", EventType::Info, "heartbeat"),
            at(50, "runner:r1", EventType::Request, "result"),
            at(60, "runner:r1", EventType::Request, "claim"),
            {
                let mut e = answer(61, "r1", "claim", None);
                e.reason = Some("none_claimable".into());
                e
            },
            at(70, "runner:r1", EventType::Request, "step"),
            answer(72, "r1", "step", Some(Decision::Duplicate)),
            at(80, "runner:r1", EventType::Request, "result"),
            answer(83, "r1", "result", Some(Decision::Conflict)),
        ];
        let latencies = request_latencies(&events);
        let got: Vec<(&str, &str, u64, Option<u64>, Answer)> = latencies
            .iter()
            .map(|l| {
                (l.kind.as_str(), l.runner.as_str(), l.t_ns / 1_000_000, l.latency_ns.map(|n| n / 1_000_000), l.answer)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("claim", "r1", 0, Some(5), Answer::Accepted),
                ("heartbeat", "r2", 1, Some(39), Answer::NoAnswer),
                ("heartbeat", "r1", 2, Some(7), Answer::Refused),
                ("result", "r1", 50, Some(33), Answer::Conflict),
                ("claim", "r1", 60, Some(1), Answer::Empty),
                ("step", "r1", 70, Some(2), Answer::Duplicate),
                ("result", "r1", 80, None, Answer::NoAnswer),
            ]
        );
    }

    #[test]
    fn throughput_counts_per_second_by_series() {
        let mut expire = ledger(2500, "expire", "a1", None, None);
        expire.value = Some(json!({"recorded_as": "uncertain"}));
        let mut requeued = ledger(2600, "expire", "a2", None, None);
        requeued.value = Some(json!({"recorded_as": "requeued"}));
        let mut ok = ledger(1200, "result", "a3", None, Some(Decision::Accepted));
        ok.outcome = Some("succeeded".into());
        let mut late = ledger(1300, "result", "a4", None, Some(Decision::Rejected));
        late.outcome = Some("succeeded".into());
        let mut failed = ledger(1900, "result", "a5", None, Some(Decision::Accepted));
        failed.outcome = Some("failed".into());
        let events = vec![
            at(0, "client", EventType::Invoke, "submit"),
            at(10, "client", EventType::Ok, "submit"),
            at(20, "client", EventType::Ok, "submit"),
            at(30, "client", EventType::Info, "submit"),
            ledger(100, "claim", "a1", Some(1000), None),
            ledger(1100, "claim", "a2", Some(1000), None),
            ok,
            late,
            failed,
            expire,
            requeued,
        ];
        let t = throughput(&events, 3_000_000_000);
        assert_eq!(t.bucket_s, 1);
        assert_eq!(
            t.series,
            vec![
                ("submitted", vec![2, 0, 0]),
                ("claimed", vec![1, 1, 0]),
                ("succeeded", vec![0, 1, 0]),
                ("failed", vec![0, 1, 0]),
                ("uncertain", vec![0, 0, 1]),
            ]
        );
        let long = throughput(&events, 3_600 * 1_000_000_000);
        assert_eq!((long.bucket_s, long.series[0].1.len()), (6, 600), "an hour is 600 buckets of 6 s");
    }

    #[test]
    fn lease_margin_is_the_previous_lease_end_minus_receipt() {
        let events = vec![
            ledger(0, "claim", "a1", Some(1000), None),
            ledger(400, "heartbeat", "a1", Some(1000), Some(Decision::Accepted)),
            ledger(1300, "heartbeat", "a1", Some(1000), Some(Decision::Accepted)),
            ledger(2600, "heartbeat", "a1", None, Some(Decision::Rejected)),
            ledger(2700, "heartbeat", "unknown-attempt", None, Some(Decision::Rejected)),
        ];
        let (margins, ttls) = lease_margins(&events);
        let got: Vec<(i64, bool)> = margins.iter().map(|m| (m.margin_ms, m.accepted)).collect();
        assert_eq!(got, vec![(600, true), (100, true), (-300, false)]);
        assert_eq!(ttls, vec![1000]);
        let plot = lease_margin_plot(&events, &frame(3000));
        assert!(plot.svg.contains("<path class=\"cross m-refused\""), "{}", plot.svg);
        assert!(plot.svg.contains("TTL 1000 ms"));
        assert!(plot.caption.starts_with("3 heartbeats (2 accepted, 1 refused)"), "{}", plot.caption);
        assert!(plot.caption.contains("Least lease left at an accepted heartbeat: 100 ms of 1000 ms"));
    }

    #[test]
    fn thinning_keeps_notable_points_and_extremes_within_the_cap() {
        let mut points: Vec<Dot> =
            (0..10_000).map(|i| Dot { x: (i % 1000) as f64, y: (i % 97) as f64, class: 0, notable: false }).collect();
        points.push(Dot { x: 500.2, y: -50.0, class: 0, notable: false });
        for i in 0..20 {
            points.push(Dot { x: i as f64 * 3.0, y: 5.5, class: 1, notable: true });
        }
        let (kept, left_out) = thin(points.clone(), 300);
        assert!(kept.len() <= 300, "{}", kept.len());
        assert_eq!(kept.len() + left_out, points.len());
        assert_eq!(kept.iter().filter(|d| d.notable).count(), 20, "every notable point fits in half the cap");
        assert!(kept.iter().any(|d| d.y == -50.0), "the extreme point is kept");
        assert!(kept.iter().any(|d| d.y == 96.0), "the other extreme is kept");
        assert_eq!(thin(points.clone(), 300), (kept, left_out), "deterministic");
        let few = points[..5].to_vec();
        assert_eq!(thin(few.clone(), 300), (few, 0));
    }

    #[test]
    fn latency_plot_has_a_panel_per_kind_log_ticks_and_bands() {
        let events = vec![
            at(0, "runner:r1", EventType::Request, "heartbeat"),
            answer(2, "r1", "heartbeat", Some(Decision::Accepted)),
            at(100, "runner:r1", EventType::Request, "heartbeat"),
            answer(300, "r1", "heartbeat", Some(Decision::Rejected)),
            at(400, "runner:r1", EventType::Request, "result"),
        ];
        let mut f = frame(1000);
        f.windows.push(FaultWindow {
            start_ns: 50_000_000,
            end_ns: 350_000_000,
            kind: "kill".into(),
            runner: Some("r1".into()),
        });
        let plot = latency_plot(&events, &f);
        for kind in vocab::REQUEST_KINDS {
            assert!(plot.svg.contains(&format!("id=\"latency-{kind}\"")), "panel {kind}");
        }
        for label in [">1 ms<", ">10 ms<", ">100 ms<", ">1 s<"] {
            assert!(plot.svg.contains(label), "decade {label}");
        }
        assert!(plot.svg.contains("heartbeat: 2 requests (1 accepted, 1 refused)"));
        assert!(plot.svg.contains("<path class=\"dots a-refused\""));
        assert!(plot.svg.contains("<path class=\"dots a-none\""), "the unanswered result is drawn");
        assert!(plot.svg.contains("<rect class=\"band\" x=\"120.0\""), "{}", plot.svg);
        assert!(plot.svg.contains("kill on r1: 0.050 s to 0.350 s"));
        assert_eq!(plot.drawn, 3);
    }

    /// The first dot of a class in a plot: its y.
    fn dot_y(svg: &str, class: &str) -> f64 {
        let path = svg.split(&format!("<path class=\"dots {class}\" d=\"M")).nth(1).expect("dots");
        let y: String =
            path.split(' ').nth(1).unwrap().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
        y.parse().unwrap()
    }

    #[test]
    fn an_unanswered_request_sits_on_the_no_answer_row_however_soon_it_gave_up() {
        let events = vec![
            at(10, "runner:r1", EventType::Request, "heartbeat"),
            at(11, "runner:r1", EventType::Info, "heartbeat"),
            at(20, "runner:r1", EventType::Request, "heartbeat"),
            answer(520, "r1", "heartbeat", Some(Decision::Accepted)),
        ];
        let plot = latency_plot(&events, &frame(1000));
        let (refused_at_once, slow) = (dot_y(&plot.svg, "a-none"), dot_y(&plot.svg, "a-accepted"));
        assert!(refused_at_once < slow, "no answer ({refused_at_once}) above a 500 ms answer ({slow})");
        assert!(plot.svg.contains("<line class=\"no-answer\""), "its row is marked");
        assert!(plot.caption.contains("however soon it gave up"), "{}", plot.caption);
    }

    #[test]
    fn throughput_plot_draws_every_series() {
        let events = vec![at(10, "client", EventType::Ok, "submit"), ledger(20, "claim", "a1", Some(1000), None)];
        let plot = throughput_plot(&events, &frame(2000));
        for name in SERIES {
            assert!(plot.svg.contains(&format!("<polyline class=\"series s-{name}\"")), "series {name}");
            assert!(plot.svg.contains(&format!("<g class=\"panel\" id=\"throughput-{name}\">")), "a panel for {name}");
        }
        assert_eq!(plot.caption, "Jobs per second: 1 submitted, 1 claimed, 0 succeeded, 0 failed, 0 uncertain.");
    }
}
