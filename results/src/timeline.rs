//! The report's timeline: one inline SVG with a lane per runner and a lane per job, drawn on the
//! run's clock, with a hard bound on how many SVG elements it emits.
//!
//! Bounds: at most [`MAX_RUNNER_LANES`] runner lanes and [`MAX_JOB_LANES`] job lanes (every job
//! involved in an anomaly first, then an evenly spaced sample of the others), at most
//! [`MAX_BARS`] attempt bars per lane (more become merged busy spans), at most [`LANE_BUDGET`]
//! elements of marks per lane (one per kind and pixel, then an evenly spaced sample), and a
//! global cap of [`SVG_BUDGET`] elements; whatever is left out is counted in the caption. An
//! aggregate lane shows the results of *all* jobs as a histogram, so sampling hides no load.
//!
//! A second, zoomed timeline ([`zoom`], [`render_zoom`]; at most [`ZOOM_SVG_BUDGET`]
//! elements) draws the stretch of the first anomaly group's events — or a scenario's steps
//! and faults, without the wait for jobs to settle — across the page, with only the lanes
//! that have something in it; the whole run's timeline marks that stretch.

use crate::escape::html as esc;
use crate::model::{self, Attempt, FaultWindow};
use crate::vocab::name_of;
use crate::{anomalies_of, Run};
use history::{Decision, Event, EventType};
use history::{Op, Process};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

pub const MAX_RUNNER_LANES: usize = 40;
pub const MAX_JOB_LANES: usize = 200;
pub const LANE_BUDGET: usize = 40;
/// Lanes with more attempts than this draw merged busy spans instead of one bar per attempt.
pub const MAX_BARS: usize = 8;
pub const SVG_BUDGET: usize = 15_000;
/// The zoomed timeline's own cap, beside the whole run's.
pub const ZOOM_SVG_BUDGET: usize = 5_000;
const MAX_FAULTS: usize = 300;
/// Rows of fault labels above the lanes (a label that fits in none is left to its title).
const FAULT_LABEL_ROWS: usize = 3;
const FAULT_LABEL_ROW_H: f64 = 10.0;
/// The width of a character of a fault label (9 px text), generously.
const FAULT_LABEL_CHAR_W: f64 = 5.6;
const MAX_ANOMALY_MARKS: usize = 400;
const BUCKETS: usize = 100;
/// The least margin around what a zoomed timeline shows.
const ZOOM_MARGIN_NS: u64 = 500_000_000;

const LABEL_W: f64 = 190.0;
const PLOT_W: f64 = 1000.0;
const LANE_H: f64 = 18.0;
const AXIS_H: f64 = 22.0;
const HIST_H: f64 = 40.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum MarkKind {
    Result(Option<Decision>),
    Step(bool),
    Expire,
    Reconcile,
    Heartbeat(bool),
}

impl MarkKind {
    /// Drawing priority (lower first, so it survives a full lane budget) and a tie-breaker.
    fn rank(self) -> (u8, u8) {
        let decision = |d: Option<Decision>| match d {
            Some(Decision::Conflict) => 0,
            Some(Decision::Accepted) => 1,
            Some(Decision::Rejected) => 2,
            Some(Decision::Duplicate) => 3,
            None => 4,
        };
        match self {
            MarkKind::Result(d) => (0, decision(d)),
            MarkKind::Step(applied) => (1, applied as u8),
            MarkKind::Expire => (2, 0),
            MarkKind::Reconcile => (3, 0),
            MarkKind::Heartbeat(ok) => (4, ok as u8),
        }
    }
}

struct Mark {
    t: u64,
    kind: MarkKind,
    title: String,
}

struct Bar<'a> {
    attempt: &'a Attempt,
    label: String,
}

#[derive(Default)]
struct Lane<'a> {
    label: String,
    anomalous: bool,
    bars: Vec<Bar<'a>>,
    marks: Vec<Mark>,
}

/// The lanes of a history, keyed by job and by runner, each in order of first appearance.
#[derive(Default)]
struct Lanes<'a> {
    jobs: Vec<Lane<'a>>,
    job_index: BTreeMap<String, usize>,
    runners: Vec<Lane<'a>>,
    runner_index: BTreeMap<String, usize>,
}

impl<'a> Lanes<'a> {
    fn lane(list: &mut Vec<Lane<'a>>, index: &mut BTreeMap<String, usize>, key: &str, label: String) -> usize {
        *index.entry(key.to_string()).or_insert_with(|| {
            list.push(Lane { label, ..Lane::default() });
            list.len() - 1
        })
    }

    fn job(&mut self, job: &str) -> &mut Lane<'a> {
        let i = Self::lane(&mut self.jobs, &mut self.job_index, job, format!("job {job}"));
        &mut self.jobs[i]
    }

    fn runner(&mut self, runner: &str) -> &mut Lane<'a> {
        let i = Self::lane(&mut self.runners, &mut self.runner_index, runner, format!("runner {runner}"));
        &mut self.runners[i]
    }

    /// Keeps only the lanes with an attempt or a mark within `scale`, and of those only what
    /// lies within it.
    fn keep_within(&mut self, scale: Scale) {
        let within = |lane: &mut Lane<'a>| {
            lane.bars.retain(|bar| scale.overlaps(bar.attempt.start_ns, bar.attempt.end_ns.unwrap_or(scale.horizon)));
            lane.marks.retain(|mark| scale.contains(mark.t));
            !lane.bars.is_empty() || !lane.marks.is_empty()
        };
        self.runners.retain_mut(within);
        self.jobs.retain_mut(within);
        self.runner_index.clear();
        self.job_index =
            self.jobs.iter().enumerate().map(|(i, lane)| (lane.label["job ".len()..].to_string(), i)).collect();
    }

    /// Puts the runner lanes in runner order (`r2` before `r10`), not of first appearance.
    fn order_runners(&mut self) {
        self.runners.sort_by(|a, b| natural(&a.label).cmp(&natural(&b.label)));
        self.runner_index.clear();
    }
}

/// A name's sort key: its text before the trailing digits, then their number.
fn natural(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (text, number) = name.split_at(name.len() - digits);
    (text, number.parse().unwrap_or(0), name)
}

/// The SVG text being built, with its element count and budget.
struct Svg {
    out: String,
    count: usize,
    omitted: usize,
    budget: usize,
}

impl Svg {
    /// Appends `elements` elements rendered by `f`, unless that would exceed the budget.
    fn add(&mut self, elements: usize, f: impl FnOnce() -> String) -> bool {
        if self.count + elements > self.budget {
            self.omitted += elements;
            return false;
        }
        self.count += elements;
        self.out.push_str(&f());
        true
    }

    /// Appends markup that is always emitted (group tags): counted, never refused.
    fn raw(&mut self, text: &str) {
        self.count += text.matches("<g").count();
        self.out.push_str(text);
    }
}

/// The scale from a stretch of the run's clock, `start..=end`, to x pixels; `horizon` is
/// where the run ends (an attempt still open is drawn to it).
#[derive(Clone, Copy)]
struct Scale {
    start: u64,
    end: u64,
    horizon: u64,
}

impl Scale {
    fn x(self, t: u64) -> f64 {
        let span = self.end.saturating_sub(self.start).max(1);
        LABEL_W + (t.clamp(self.start, self.end) - self.start) as f64 / span as f64 * PLOT_W
    }

    fn span(self) -> u64 {
        self.end.saturating_sub(self.start).max(1)
    }

    fn contains(self, t: u64) -> bool {
        (self.start..=self.end).contains(&t)
    }

    fn overlaps(self, from: u64, to: u64) -> bool {
        from <= self.end && to >= self.start
    }

    /// Whether it draws the whole run.
    fn whole(self) -> bool {
        self.start == 0 && self.end >= self.horizon
    }
}

fn decision_class(d: Option<Decision>) -> String {
    d.map(|d| format!("d-{}", name_of(&d))).unwrap_or_else(|| "d-none".to_string())
}

fn secs(t: u64) -> String {
    format!("{:.3} s", t as f64 / 1e9)
}

fn describe(e: &Event) -> String {
    let mut s = format!("#{} {} {} {}", e.index, secs(e.time_ns), e.process, e.f);
    for (name, v) in [("attempt", &e.attempt), ("runner", &e.runner), ("reason", &e.reason), ("outcome", &e.outcome)] {
        if let Some(v) = v {
            let _ = write!(s, " {name}={v}");
        }
    }
    if let Some(f) = e.fence {
        let _ = write!(s, " fence={f}");
    }
    if let Some(d) = e.decision {
        let _ = write!(s, " {}", name_of(&d));
    }
    s
}

fn build_lanes<'a>(events: &[Event], attempts: &'a [Attempt]) -> Lanes<'a> {
    let mut lanes = Lanes::default();
    for e in events {
        if let Some(job) = e.job.as_deref().filter(|_| e.process != Process::HARNESS) {
            lanes.job(job);
        }
    }
    for a in attempts {
        let fence = a.fence.map(|f| format!("f{f}")).unwrap_or_else(|| "f?".into());
        lanes.job(&a.job).bars.push(Bar { attempt: a, label: fence.clone() });
        lanes.runner(&a.runner).bars.push(Bar { attempt: a, label: format!("{} {fence}", a.job) });
    }
    for e in events {
        let kind = match (e.kind, e.f) {
            (EventType::Ledger, Op::Heartbeat) => MarkKind::Heartbeat(e.decision == Some(Decision::Accepted)),
            (EventType::Ledger, Op::Result) => MarkKind::Result(e.decision),
            (EventType::Ledger, Op::Expire) => MarkKind::Expire,
            (EventType::Ledger, Op::Reconcile) => MarkKind::Reconcile,
            (EventType::Step, _) => MarkKind::Step(e.decision == Some(Decision::Accepted)),
            _ => continue,
        };
        let mark = |title: String| Mark { t: e.time_ns, kind, title };
        if let Some(job) = &e.job {
            lanes.job(job).marks.push(mark(describe(e)));
        }
        let on_runner = matches!(kind, MarkKind::Heartbeat(_) | MarkKind::Result(_));
        if let (Some(runner), true) = (&e.runner, on_runner) {
            lanes.runner(runner).marks.push(mark(describe(e)));
        }
    }
    lanes
}

/// Which job lanes to draw: all anomalous jobs (up to the cap), then an evenly spaced sample.
fn select_jobs(total: usize, anomalous: &BTreeSet<usize>) -> Vec<usize> {
    if total <= MAX_JOB_LANES {
        return (0..total).collect();
    }
    let mut chosen: BTreeSet<usize> = anomalous.iter().copied().take(MAX_JOB_LANES).collect();
    let room = MAX_JOB_LANES - chosen.len();
    let others: Vec<usize> = (0..total).filter(|i| !anomalous.contains(i)).collect();
    for k in 0..room.min(others.len()) {
        chosen.insert(others[k * others.len() / room.max(1)]);
    }
    chosen.into_iter().collect()
}

/// Where each anomaly points on the timeline: (anomaly number, job, event times).
fn anomaly_points(run: &Run, events: &[Event]) -> Vec<(usize, Option<String>, Vec<u64>)> {
    let all = run.checkers.iter().flat_map(anomalies_of);
    all.enumerate()
        .map(|(n, a)| {
            let times = a.events.iter().filter_map(|&i| find_event(events, i)).map(|e| e.time_ns).collect();
            let job = a.job.clone().or_else(|| a.events.iter().find_map(|&i| find_event(events, i)?.job.clone()));
            (n, job, times)
        })
        .collect()
}

/// The event with history index `index` (histories are numbered from 0 without gaps).
pub fn find_event(events: &[Event], index: u64) -> Option<&Event> {
    match events.get(index as usize) {
        Some(e) if e.index == index => Some(e),
        _ => events.binary_search_by_key(&index, |e| e.index).ok().map(|i| &events[i]),
    }
}

/// What the timeline drew, for the caption.
pub struct Drawn {
    pub svg: String,
    pub elements: usize,
    pub caption: String,
}

/// Renders the timeline SVG of the whole run (with `zoom`'s stretch marked on it) and a
/// caption that says what was left out.
pub fn render(run: &Run, events: &[Event], zoom: Option<&Zoom>) -> Drawn {
    let horizon = model::horizon_ns(events, run.duration_ms, &run.schedule);
    draw(run, events, Scale { start: 0, end: horizon, horizon }, zoom)
}

/// A stretch of the run worth a closer look, and why.
pub struct Zoom {
    pub start_ns: u64,
    pub end_ns: u64,
    pub why: String,
}

/// Where the timeline zooms: the events of the first anomaly group (the one the report
/// opens), else a scenario's steps and the faults they started (not the wait for jobs to
/// settle after them), each with a margin; none when that is most of the run anyway. The
/// harness's own records at the end (final states) are left out of a group's stretch; when
/// the group still spans most of the run, its first anomaly's events are taken, and failing
/// that, the stretch just before and after that anomaly's last event.
pub fn zoom(run: &Run, events: &[Event]) -> Option<Zoom> {
    let horizon = model::horizon_ns(events, run.duration_ms, &run.schedule);
    let narrow = |from: u64, to: u64| {
        let margin = ((to - from) / 4).max(ZOOM_MARGIN_NS);
        let (start, end) = (from.saturating_sub(margin), to.saturating_add(margin).min(horizon));
        (end.saturating_sub(start) < horizon / 2).then_some((start, end))
    };
    let groups = crate::anomaly_groups(run);
    let Some(group) = groups.first() else {
        let steps = events.iter().filter(|e| e.process == Process::SCENARIO).map(|e| e.time_ns).max()?;
        let windows = model::fault_windows(&run.schedule, events, horizon);
        let to = windows.iter().map(|w| w.end_ns).fold(steps, u64::max);
        let (start_ns, end_ns) = narrow(0, to)?;
        return Some(Zoom { start_ns, end_ns, why: "the scenario's steps and the faults they started".to_string() });
    };
    let all: Vec<_> = run.checkers.iter().flat_map(anomalies_of).collect();
    let times = |members: &[usize]| -> Vec<u64> {
        (members.iter().filter_map(|&n| all.get(n)))
            .flat_map(|a| a.events.iter().filter_map(|&i| find_event(events, i)))
            .filter(|e| e.process != Process::HARNESS)
            .map(|e| e.time_ns)
            .collect()
    };
    let span = |times: &[u64]| Some((*times.iter().min()?, *times.iter().max()?));
    let why = format!("the first anomaly group ({})", group.group);
    let whole = times(&group.anomalies);
    let first = times(&group.anomalies[..1]);
    let (start_ns, end_ns) = span(&whole)
        .and_then(|(from, to)| narrow(from, to))
        .or_else(|| span(&first).and_then(|(from, to)| narrow(from, to)))
        .or_else(|| {
            let last = span(&first)?.1;
            narrow(last.saturating_sub(horizon / 10), last.saturating_add(horizon / 20))
        })?;
    Some(Zoom { start_ns, end_ns, why })
}

/// The timeline of `zoom` alone: every lane with something in it, at that scale.
pub fn render_zoom(run: &Run, events: &[Event], zoom: &Zoom) -> Drawn {
    let horizon = model::horizon_ns(events, run.duration_ms, &run.schedule);
    draw(run, events, Scale { start: zoom.start_ns, end: zoom.end_ns, horizon }, None)
}

fn draw(run: &Run, events: &[Event], scale: Scale, zoom: Option<&Zoom>) -> Drawn {
    let attempts = model::attempts(events);
    let mut lanes = build_lanes(events, &attempts);
    lanes.order_runners();
    if !scale.whole() {
        lanes.keep_within(scale);
    }
    let points = anomaly_points(run, events);
    let mut anomalous = BTreeSet::new();
    for job in points.iter().filter_map(|p| p.1.as_deref()) {
        if let Some(&i) = lanes.job_index.get(job) {
            lanes.jobs[i].anomalous = true;
            anomalous.insert(i);
        }
    }
    let jobs = select_jobs(lanes.jobs.len(), &anomalous);
    let runners = lanes.runners.len().min(MAX_RUNNER_LANES);
    let lane_count = runners + jobs.len();
    let top = AXIS_H + HIST_H + 6.0;
    let height = top + lane_count as f64 * LANE_H + 4.0;
    let width = LABEL_W + PLOT_W + 10.0;
    let budget = if scale.whole() { SVG_BUDGET } else { ZOOM_SVG_BUDGET };
    let mut svg = Svg { out: String::new(), count: 1, omitted: 0, budget };
    let (id, prefix, label) = if scale.whole() {
        ("timeline-svg", "lane", "timeline of the run".to_string())
    } else {
        ("timeline-zoom-svg", "zoom-lane", format!("timeline from {} to {}", secs(scale.start), secs(scale.end)))
    };
    svg.raw(&format!(
        "<svg id=\"{id}\" class=\"timeline\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         role=\"img\" aria-label=\"{label}\" data-start-ns=\"{}\" data-end-ns=\"{}\">\n",
        scale.start, scale.end
    ));
    draw_axis(&mut svg, scale, height);
    draw_histogram(&mut svg, scale, events);
    let windows = model::fault_windows(&run.schedule, events, scale.horizon);
    draw_faults(&mut svg, scale, &windows, top, height);
    if let Some(zoom) = zoom {
        let (x1, x2) = (scale.x(zoom.start_ns), scale.x(zoom.end_ns));
        svg.add(3, || {
            format!(
                "<a href=\"#timeline-zoom\"><rect class=\"zoom-window\" x=\"{x1:.1}\" y=\"{AXIS_H}\" width=\"{:.1}\" height=\"{:.1}\">\
                 <title>zoomed below: {} to {}</title></rect></a>\n",
                (x2 - x1).max(2.0),
                height - AXIS_H,
                secs(zoom.start_ns),
                secs(zoom.end_ns)
            )
        });
    }
    let mut y = top;
    let mut lane_y: BTreeMap<String, f64> = BTreeMap::new();
    for (i, lane) in lanes.runners.iter().take(runners).enumerate() {
        draw_lane(&mut svg, scale, lane, &format!("{prefix}-r{i}"), y);
        y += LANE_H;
    }
    for &i in &jobs {
        draw_lane(&mut svg, scale, &lanes.jobs[i], &format!("{prefix}-j{i}"), y);
        lane_y.insert(lanes.jobs[i].label.clone(), y);
        y += LANE_H;
    }
    draw_anomalies(&mut svg, scale, &points, &lane_y, (top, height));
    svg.raw("</svg>\n");
    let caption = caption(&lanes, jobs.len(), anomalous.len(), runners, windows.len(), svg.omitted);
    Drawn { svg: svg.out, elements: svg.count, caption }
}

fn caption(lanes: &Lanes, jobs: usize, anomalous: usize, runners: usize, faults: usize, omitted: usize) -> String {
    let mut s =
        format!("{runners} of {} runner lanes and {jobs} of {} job lanes", lanes.runners.len(), lanes.jobs.len());
    if jobs < lanes.jobs.len() {
        let _ = write!(s, " (all {anomalous} jobs with anomalies first, then an evenly spaced sample of the others)");
    }
    let _ = write!(s, "; {faults} fault windows.");
    if omitted > 0 {
        let _ = write!(s, " {omitted} further SVG elements were left out to keep the page small.");
    }
    s
}

fn draw_axis(svg: &mut Svg, scale: Scale, height: f64) {
    let span_s = scale.span() as f64 / 1e9;
    let raw = span_s / 10.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    svg.raw("<g class=\"axis\">\n");
    // Ticks at multiples of the step, from the first at or after the start.
    let mut t = (scale.start as f64 / 1e9 / step).ceil() * step;
    let last_s = scale.end as f64 / 1e9;
    while t <= last_s + 1e-9 {
        let x = scale.x((t * 1e9).round() as u64);
        // Milliseconds on a short run; seconds with the step's decimals on a zoomed one.
        let label = match step {
            step if step >= 1.0 => format!("{t:.0} s"),
            _ if scale.start == 0 => format!("{:.0} ms", t * 1000.0),
            step if step >= 0.1 => format!("{t:.1} s"),
            step if step >= 0.01 => format!("{t:.2} s"),
            _ => format!("{t:.3} s"),
        };
        svg.add(2, || {
            format!(
                "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{AXIS_H}\" x2=\"{x:.1}\" y2=\"{height}\"/>\
                 <text x=\"{x:.1}\" y=\"14\" text-anchor=\"middle\">{label}</text>\n"
            )
        });
        t += step;
    }
    svg.raw("</g>\n");
}

/// Results of all jobs per time bucket, stacked by decision.
fn draw_histogram(svg: &mut Svg, scale: Scale, events: &[Event]) {
    let mut buckets = vec![[0u32; 4]; BUCKETS];
    let results = events.iter().filter(|e| e.kind == EventType::Ledger && e.f == Op::Result);
    for e in results.filter(|e| scale.contains(e.time_ns)) {
        let b = ((e.time_ns - scale.start) as f64 / scale.span() as f64 * BUCKETS as f64) as usize;
        let d = match e.decision {
            Some(Decision::Accepted) => 0,
            Some(Decision::Rejected) => 1,
            Some(Decision::Duplicate) => 2,
            _ => 3,
        };
        buckets[b.min(BUCKETS - 1)][d] += 1;
    }
    let max = buckets.iter().map(|b| b.iter().sum::<u32>()).max().unwrap_or(0).max(1) as f64;
    let classes = ["d-accepted", "d-rejected", "d-duplicate", "d-conflict"];
    let bw = PLOT_W / BUCKETS as f64;
    svg.raw("<g class=\"histogram\" id=\"lane-all\">\n");
    svg.add(1, || format!("<text class=\"lane-label\" x=\"4\" y=\"{}\">results, all jobs</text>\n", AXIS_H + 24.0));
    for (i, counts) in buckets.iter().enumerate() {
        let mut base = AXIS_H + HIST_H;
        for (d, &n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
            let h = (n as f64 / max) * (HIST_H - 4.0);
            base -= h;
            let x = LABEL_W + i as f64 * bw;
            svg.add(1, || {
                format!(
                    "<rect class=\"{}\" x=\"{x:.1}\" y=\"{base:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\"/>\n",
                    classes[d]
                )
            });
        }
    }
    svg.raw("</g>\n");
}

fn draw_faults(svg: &mut Svg, scale: Scale, windows: &[FaultWindow], top: f64, height: f64) {
    svg.raw("<g class=\"faults\">\n");
    // Where each row of labels is free again: a label goes in the first row it fits in.
    let mut rows_free_x = [f64::MIN; FAULT_LABEL_ROWS];
    for w in windows.iter().filter(|w| scale.overlaps(w.start_ns, w.end_ns)).take(MAX_FAULTS) {
        let (x1, x2) = (scale.x(w.start_ns), scale.x(w.end_ns));
        let width = (x2 - x1).max(1.0);
        let who = w.runner.as_deref().map(|r| format!(" on {r}")).unwrap_or_default();
        let title = esc(&format!("{}{who}: {} to {}", w.kind, secs(w.start_ns), secs(w.end_ns)));
        let row = (width >= 40.0).then(|| rows_free_x.iter().position(|free| x1 >= *free)).flatten();
        if let Some(row) = row {
            rows_free_x[row] = x1 + 2.0 + w.kind.len() as f64 * FAULT_LABEL_CHAR_W + 4.0;
        }
        let labelled = row.is_some();
        svg.add(2 + labelled as usize, || {
            let label = if let Some(row) = row {
                format!(
                    "<text class=\"fault-label\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                    x1 + 2.0,
                    top - 2.0 - row as f64 * FAULT_LABEL_ROW_H,
                    esc(&w.kind)
                )
            } else {
                String::new()
            };
            format!(
                "<rect class=\"fault\" x=\"{x1:.1}\" y=\"{AXIS_H}\" width=\"{width:.1}\" height=\"{:.1}\"><title>{title}</title></rect>{label}\n",
                height - AXIS_H,
            )
        });
    }
    let within = windows.iter().filter(|w| scale.overlaps(w.start_ns, w.end_ns)).count();
    svg.omitted += within.saturating_sub(MAX_FAULTS) * 2;
    svg.raw("</g>\n");
}

fn draw_lane(svg: &mut Svg, scale: Scale, lane: &Lane, id: &str, y: f64) {
    let class = if lane.anomalous { "lane anomalous" } else { "lane" };
    let label = esc(&lane.label);
    if !svg.add(3, || {
        format!(
            "<g class=\"{class}\" id=\"{id}\" transform=\"translate(0 {y})\">\
             <rect class=\"lane-bg\" x=\"0\" y=\"0\" width=\"{}\" height=\"{LANE_H}\"/>\
             <text class=\"lane-label\" x=\"4\" y=\"13\">{label}</text>\n",
            LABEL_W + PLOT_W
        )
    }) {
        return;
    }
    let mut used = 0;
    let mut labels = Vec::new();
    if lane.bars.len() <= MAX_BARS {
        for bar in &lane.bars {
            used += draw_bar(svg, scale, bar, &mut labels);
        }
    } else {
        used += draw_busy(svg, scale, &lane.bars);
    }
    draw_marks(svg, scale, &lane.marks, LANE_BUDGET.saturating_sub(used));
    // Fence labels last, so that no heartbeat tick or mark is drawn over them.
    for label in labels {
        svg.add(1, || label);
    }
    svg.raw("</g>\n");
}

/// A lane with too many attempts to draw one by one: the spans during which any attempt was
/// open, merged (with a growing tolerance for gaps) until at most `MAX_BARS` remain.
fn draw_busy(svg: &mut Svg, scale: Scale, bars: &[Bar]) -> usize {
    let mut spans: Vec<(u64, u64, usize)> =
        bars.iter().map(|b| (b.attempt.start_ns, b.attempt.end_ns.unwrap_or(scale.horizon), 1)).collect();
    spans.sort_unstable();
    let mut gap = scale.span() / PLOT_W as u64;
    loop {
        let mut merged: Vec<(u64, u64, usize)> = Vec::new();
        for &(s, e, n) in &spans {
            match merged.last_mut() {
                Some(last) if s <= last.1.saturating_add(gap) => {
                    last.1 = last.1.max(e);
                    last.2 += n;
                }
                _ => merged.push((s, e, n)),
            }
        }
        spans = merged;
        if spans.len() <= MAX_BARS {
            break;
        }
        gap = gap.saturating_mul(2).max(1);
    }
    let mut used = 0;
    for (s, e, n) in spans {
        let (x1, x2) = (scale.x(s), scale.x(e));
        let title = format!("{n} attempts, {} to {}", secs(s), secs(e));
        if svg.add(2, || {
            format!(
                "<rect class=\"attempt busy\" x=\"{x1:.1}\" y=\"3\" width=\"{:.1}\" height=\"10\"><title>{title}</title></rect>\n",
                (x2 - x1).max(2.0)
            )
        }) {
            used += 2;
        }
    }
    used
}

fn draw_bar(svg: &mut Svg, scale: Scale, bar: &Bar, labels: &mut Vec<String>) -> usize {
    let a = bar.attempt;
    let (x1, x2) = (scale.x(a.start_ns), scale.x(a.end_ns.unwrap_or(scale.horizon)));
    let w = (x2 - x1).max(2.0);
    let mut used = 0;
    for &(s, e) in a.lease.iter().filter(|(s, e)| scale.overlaps(*s, *e)).take(4) {
        let (l1, l2) = (scale.x(s), scale.x(e));
        let lw = (l2 - l1).max(1.0);
        if svg.add(1, || format!("<rect class=\"lease\" x=\"{l1:.1}\" y=\"14\" width=\"{lw:.1}\" height=\"3\"/>")) {
            used += 1;
        }
    }
    let open = if a.end_ns.is_none() { " open" } else { "" };
    let closed = a.closed_by.map_or("still open at the end", Op::as_str);
    let title = esc(&format!(
        "attempt {} of {} on {} fence {}: {} to {} ({closed})",
        a.attempt,
        a.job,
        a.runner,
        a.fence.map(|f| f.to_string()).unwrap_or_else(|| "?".into()),
        secs(a.start_ns),
        a.end_ns.map(secs).unwrap_or_else(|| "end".into())
    ));
    if w >= 8.0 * bar.label.len() as f64 {
        labels.push(format!("<text class=\"fence\" x=\"{:.1}\" y=\"11.5\">{}</text>\n", x1 + 2.0, esc(&bar.label)));
    }
    if svg.add(2, || {
        format!(
            "<rect class=\"attempt{open}\" x=\"{x1:.1}\" y=\"3\" width=\"{w:.1}\" height=\"10\"><title>{title}</title></rect>\n"
        )
    }) {
        used += 2;
    }
    used
}

/// Draws a lane's marks within `budget`: kinds in priority order, one mark per kind and pixel,
/// and an evenly spaced sample in time when a kind has more marks than the budget has room for.
fn draw_marks(svg: &mut Svg, scale: Scale, marks: &[Mark], budget: usize) {
    let mut groups: BTreeMap<(u8, u8), BTreeMap<i64, &Mark>> = BTreeMap::new();
    for m in marks {
        let pixel = scale.x(m.t).round() as i64;
        groups.entry(m.kind.rank()).or_default().entry(pixel).or_insert(m);
    }
    let mut used = 0;
    for (rank, group) in groups {
        let cost = if rank.0 == 4 { 1 } else { 2 };
        let room = budget.saturating_sub(used) / cost;
        let chosen: Vec<&Mark> = group.into_values().collect();
        let take = room.min(chosen.len());
        svg.omitted += (chosen.len() - take) * cost;
        for k in 0..take {
            let m = chosen[k * chosen.len() / take];
            if svg.add(cost, || mark_svg(m, scale.x(m.t))) {
                used += cost;
            }
        }
    }
}

fn mark_svg(m: &Mark, x: f64) -> String {
    let title = esc(&m.title);
    match m.kind {
        MarkKind::Heartbeat(ok) => {
            let class = if ok { "hb" } else { "hb refused" };
            format!("<line class=\"{class}\" x1=\"{x:.1}\" y1=\"1\" x2=\"{x:.1}\" y2=\"15\"/>\n")
        }
        MarkKind::Result(d) => format!(
            "<circle class=\"result {}\" cx=\"{x:.1}\" cy=\"8\" r=\"4.5\"><title>result {title}</title></circle>\n",
            decision_class(d)
        ),
        MarkKind::Step(applied) => format!(
            "<rect class=\"step {}\" x=\"{:.1}\" y=\"5\" width=\"6\" height=\"6\"><title>step {title}</title></rect>\n",
            if applied { "applied" } else { "refused" },
            x - 3.0
        ),
        MarkKind::Expire => format!(
            "<path class=\"expire\" d=\"M{:.1} 4l7 8m0 -8l-7 8\"><title>expire {title}</title></path>\n",
            x - 3.5
        ),
        MarkKind::Reconcile => format!(
            "<path class=\"reconcile\" d=\"M{x:.1} 2l5 6l-5 6l-5 -6z\"><title>reconcile {title}</title></path>\n"
        ),
    }
}

type Point = (usize, Option<String>, Vec<u64>);

/// Red markers at the events that prove each anomaly, on its job's lane when that lane is drawn
/// (else across all lanes), each linking to the anomaly in the list below.
fn draw_anomalies(svg: &mut Svg, scale: Scale, points: &[Point], lane_y: &BTreeMap<String, f64>, span: (f64, f64)) {
    svg.raw("<g class=\"anomalies\">\n");
    let mut drawn = 0;
    for (n, job, times) in points {
        let lane = job.as_ref().and_then(|j| lane_y.get(&format!("job {j}")));
        let (y1, y2) = lane.map(|y| (*y, y + LANE_H)).unwrap_or(span);
        for &t in times.iter().filter(|t| scale.contains(**t)) {
            if drawn >= MAX_ANOMALY_MARKS {
                svg.omitted += 3;
                continue;
            }
            let x = scale.x(t);
            if svg.add(3, || {
                format!(
                    "<a href=\"#a{n}\"><rect class=\"anomaly-mark\" x=\"{:.1}\" y=\"{y1:.1}\" width=\"4\" height=\"{:.1}\">\
                     <title>anomaly {n}</title></rect></a>\n",
                    x - 2.0,
                    y2 - y1
                )
            }) {
                drawn += 1;
            }
        }
    }
    svg.raw("</g>\n");
}
