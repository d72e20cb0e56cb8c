//! `report.html`: one self-contained page (inline CSS, inline SVG, a few lines of inline JS)
//! that opens from disk and makes no network request: verdict, repeat command, checker
//! summary, anomalies linked to the events that prove them, and the run's timeline.

use crate::escape::html as esc;
use crate::timeline::{self, find_event};
use crate::vocab::name_of;
use crate::{anomalies_of, verdict_name, Run};
use checkers::Verdict;
use history::Event;
use std::collections::BTreeSet;
use std::fmt::Write;

/// At most this many rows in the events table; larger histories show only the proof events.
pub const MAX_EVENT_ROWS: usize = 3000;
/// At most this many anomalies are listed (all of them are in results.json).
pub const MAX_LISTED_ANOMALIES: usize = 1000;

const STYLE: &str = include_str!("report.css");
const PLOT_STYLE: &str = include_str!("plots.css");
const SCRIPT: &str = include_str!("report.js");

/// Renders `report.html` of a history held whole.
pub fn report_html(run: &Run, events: &[Event]) -> String {
    let digest = crate::Digest::of(events);
    report_html_of(run, &crate::View { events, digest: &digest, one_in: None })
}

/// Renders `report.html` from a [`crate::View`]: drawn from its events, a sample's
/// drawings captioned as such.
pub fn report_html_of(run: &Run, view: &crate::View) -> String {
    let events = view.events;
    let overall = run.overall();
    let shown = shown_events(run, events, view.digest.events());
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; \
         script-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <link rel=\"icon\" href=\"data:,\">\n<title>fencelab {}: {}</title>\n<style>\n{STYLE}{PLOT_STYLE}</style>\n</head>\n\
         <body class=\"overall-{overall}\">\n",
        esc(&run.test_name),
        overall.as_str().to_uppercase()
    );
    header(&mut out, run);
    summary(&mut out, run);
    anomalies(&mut out, run, events, &shown);
    let zoom = timeline::zoom(run, events);
    let drawn = timeline::render(run, events, zoom.as_ref());
    let sampled = view
        .sampled_caption()
        .map(|caption| format!("<p class=\"caption\" id=\"drawn-from\">{}</p>\n", esc(&caption)))
        .unwrap_or_default();
    let _ = write!(
        out,
        "<section id=\"timeline\" data-svg-elements=\"{}\">\n<h2>Timeline</h2>\n{sampled}{}\n<p class=\"caption\">{}</p>\n<div class=\"scroll\">\n{}</div>\n",
        drawn.elements,
        legend(),
        esc(&drawn.caption),
        drawn.svg
    );
    if let Some(zoom) = &zoom {
        let zoomed = timeline::render_zoom(run, events, zoom);
        let _ = write!(
            out,
            "<h3 id=\"timeline-zoom\">From {:.3} s to {:.3} s: {}</h3>\n<p class=\"caption\">The stretch shaded on the \
             timeline above, drawn across the page: {}</p>\n<div class=\"scroll\">\n{}</div>\n",
            zoom.start_ns as f64 / 1e9,
            zoom.end_ns as f64 / 1e9,
            esc(&zoom.why),
            esc(&zoomed.caption),
            zoomed.svg
        );
    }
    out.push_str("</section>\n");
    crate::plots::section(&mut out, run, events);
    crate::coverage::section(&mut out, &crate::coverage::coverage(&run.schedule, events));
    let proofs: BTreeSet<u64> =
        run.checkers.iter().flat_map(anomalies_of).flat_map(|a| a.events.iter().copied()).collect();
    events_table(&mut out, events, view.digest.events(), &shown, &proofs);
    details(&mut out, run);
    let _ = write!(out, "<script>\n{SCRIPT}</script>\n</body>\n</html>\n");
    out
}

fn header(out: &mut String, run: &Run) {
    let overall = run.overall();
    let _ = write!(
        out,
        "<header>\n<h1>fencelab: {name} <span class=\"verdict v-{overall}\" id=\"overall\">{upper}</span></h1>\n\
         <dl class=\"facts\"><dt>seed</dt><dd id=\"seed\">{seed}</dd><dt>started</dt><dd>{started}</dd>\
         <dt>duration</dt><dd>{secs:.3} s</dd><dt>exit code</dt><dd>{code}</dd></dl>\n\
         <p>Repeat this run:</p>\n<div class=\"command\"><code id=\"command\">{command}</code>\
         <button type=\"button\" id=\"copy\">copy</button></div>\n</header>\n",
        name = esc(&run.test_name),
        upper = overall.as_str().to_uppercase(),
        seed = run.seed,
        started = esc(&run.started_at),
        secs = run.duration_ms as f64 / 1000.0,
        code = overall.exit().code(),
        command = esc(&run.command),
    );
}

fn summary(out: &mut String, run: &Run) {
    out.push_str(
        "<section id=\"summary\">\n<h2>Checkers</h2>\n<table class=\"summary\">\n\
         <thead><tr><th>checker</th><th>verdict</th><th>anomalies</th><th>what it enforces</th></tr></thead>\n<tbody>\n",
    );
    let mut first = 0;
    for c in &run.checkers {
        let count = anomalies_of(c).len();
        let verdict = verdict_name(&c.verdict);
        let cell = match (&c.verdict, count) {
            (Verdict::Unknown { reason }, _) => format!("<span class=\"reason\">{}</span>", esc(reason)),
            (_, 0) => "0".to_string(),
            (_, n) => format!("<a href=\"#a{first}\">{n}</a>"),
        };
        let _ = writeln!(
            out,
            "<tr class=\"v-{verdict}\"><td>{}</td><td><span class=\"verdict v-{verdict}\">{verdict}</span></td>\
             <td>{cell}</td><td>{}</td></tr>",
            esc(&c.checker),
            esc(&c.description)
        );
        first += count;
    }
    out.push_str("</tbody>\n</table>\n</section>\n");
}

fn anomalies(out: &mut String, run: &Run, events: &[Event], shown: &BTreeSet<u64>) {
    let all: Vec<_> = run.checkers.iter().flat_map(anomalies_of).collect();
    let groups = crate::anomaly_groups(run);
    if all.is_empty() {
        out.push_str("<section id=\"anomalies\">\n<h2>Anomalies (0)</h2>\n<p>None.</p>\n</section>\n");
        return;
    }
    let plural = if groups.len() == 1 { "" } else { "s" };
    let _ = write!(
        out,
        "<section id=\"anomalies\">\n<h2>Anomalies ({}, in {} group{plural})</h2>\n",
        all.len(),
        groups.len()
    );
    out.push_str(
        "<p class=\"caption\">Grouped by the job (else the attempt, the key or the kind) they tell of: \
         one group per broken rule instance, the first open.</p>\n<div class=\"anomaly-groups\">\n",
    );
    let told = crate::story::rendered(run, events, shown);
    let mut listed = 0;
    for (g, group) in groups.iter().enumerate() {
        let members: Vec<usize> = group.anomalies.iter().copied().filter(|&n| n < MAX_LISTED_ANOMALIES).collect();
        if members.is_empty() {
            continue;
        }
        let first = all[group.anomalies[0]];
        let _ = write!(
            out,
            "<details class=\"anomaly-group\" id=\"g{g}\"{}><summary><strong>{}</strong>: {} anomal{} \
             <span class=\"kinds\">({})</span> <span class=\"message\">{}</span></summary>\n\
             <ol class=\"anomalies\" start=\"{}\">\n",
            if g == 0 { " open" } else { "" },
            esc(&group.group),
            group.count,
            if group.count == 1 { "y" } else { "ies" },
            esc(&group.kinds.join(", ")),
            esc(&first.message),
            members[0] + 1,
        );
        for n in members {
            listed += 1;
            anomaly_item(out, n, all[n], events, shown, told.get(n).map(String::as_str).unwrap_or_default());
        }
        out.push_str("</ol>\n</details>\n");
    }
    out.push_str("</div>\n");
    if all.len() > listed {
        let _ = writeln!(out, "<p>{} more anomalies are in results.json.</p>", all.len() - listed);
    }
    out.push_str("</section>\n");
}

/// One anomaly as `<li id="a<n>">`: checker, kind, message, what it names, its proof
/// links and its story.
fn anomaly_item(
    out: &mut String,
    n: usize,
    a: &checkers::Anomaly,
    events: &[Event],
    shown: &BTreeSet<u64>,
    told: &str,
) {
    let mut facts = String::new();
    let lists: [(&str, Vec<String>); 5] = [
        ("job", a.job.iter().cloned().collect()),
        ("attempts", a.attempts.clone()),
        ("runners", a.runners.clone()),
        ("fences", a.fences.iter().map(u64::to_string).collect()),
        ("key", a.key.iter().cloned().collect()),
    ];
    for (name, values) in lists.iter().filter(|(_, v)| !v.is_empty()) {
        let _ = write!(facts, "<span class=\"fact\">{name}: {}</span> ", esc(&values.join(", ")));
    }
    let links: Vec<String> = a.events.iter().map(|&i| event_link(i, events, shown)).collect();
    let _ = writeln!(
        out,
        "<li class=\"anomaly\" id=\"a{n}\" value=\"{}\"><strong>{} / {}</strong>: <span class=\"message\">{}</span><br>\
         {facts}<span class=\"proof-links\">events: {}</span>{told}</li>",
        n + 1,
        esc(&a.checker),
        esc(&a.kind),
        esc(&a.message),
        links.join(" "),
    );
}

fn event_link(index: u64, events: &[Event], shown: &BTreeSet<u64>) -> String {
    match find_event(events, index) {
        Some(_) if shown.contains(&index) => format!("<a class=\"proof\" href=\"#e{index}\">#{index}</a>"),
        Some(_) => format!("<span class=\"proof\">#{index}</span>"),
        None => format!("<span class=\"proof missing\" title=\"not in the history\">#{index}?</span>"),
    }
}

/// The events the table shows: every event of a small history; else the events that prove an
/// anomaly (at most [`MAX_EVENT_ROWS`]).
fn shown_events(run: &Run, events: &[Event], total: u64) -> BTreeSet<u64> {
    if total <= MAX_EVENT_ROWS as u64 {
        return events.iter().map(|e| e.index).collect();
    }
    let proofs = run.checkers.iter().flat_map(anomalies_of).flat_map(|a| a.events.iter().copied());
    proofs
        .filter(|&i| find_event(events, i).is_some())
        .collect::<BTreeSet<u64>>()
        .into_iter()
        .take(MAX_EVENT_ROWS)
        .collect()
}

fn events_table(out: &mut String, events: &[Event], total: u64, shown: &BTreeSet<u64>, proofs: &BTreeSet<u64>) {
    let _ = write!(out, "<section id=\"events\">\n<h2>Events</h2>\n");
    if (shown.len() as u64) < total {
        let _ = writeln!(
            out,
            "<p class=\"caption\">{} of {} events: those that prove an anomaly. The whole history is history.jsonl.</p>",
            shown.len(),
            total
        );
    }
    out.push_str(
        "<table class=\"events\">\n<thead><tr><th>#</th><th>time</th><th>process</th><th>type</th><th>f</th>\
         <th>job</th><th>attempt</th><th>runner</th><th>fence</th><th>key</th><th>decision</th><th>reason</th>\
         <th>outcome</th><th>value</th></tr></thead>\n<tbody>\n",
    );
    for &i in shown {
        if let Some(e) = find_event(events, i) {
            event_row(out, e, proofs.contains(&i));
        }
    }
    out.push_str("</tbody>\n</table>\n</section>\n");
}

fn event_row(out: &mut String, e: &Event, proof: bool) {
    let opt = |v: &Option<String>| v.as_deref().map(esc).unwrap_or_default();
    let decision = e.decision.map(|d| name_of(&d)).unwrap_or_default();
    let mut value = e.value.as_ref().map(|v| v.to_string()).unwrap_or_default();
    if value.chars().count() > 200 {
        value = value.chars().take(200).collect::<String>() + "…";
    }
    let _ = writeln!(
        out,
        "<tr id=\"e{i}\"{class}><td><a href=\"#e{i}\">{i}</a></td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"d-{decision}\">{decision}</td><td>{}</td><td>{}</td>\
         <td class=\"value\">{}</td></tr>",
        e.time_ns as f64 / 1e9,
        esc(&e.process.to_string()),
        name_of(&e.kind),
        esc(e.f.as_str()),
        opt(&e.job),
        opt(&e.attempt),
        opt(&e.runner),
        e.fence.map(|f| f.to_string()).unwrap_or_default(),
        opt(&e.key),
        opt(&e.reason),
        opt(&e.outcome),
        esc(&value),
        i = e.index,
        class = if proof { " class=\"proof\"" } else { "" },
    );
}

fn legend() -> String {
    let items = [
        ("sw attempt", "attempt (claim to result / expire / reconcile), labelled with its fence"),
        ("sw lease", "lease (granted and renewed)"),
        ("sw hb", "heartbeat (tick; orange when refused)"),
        ("sw dot d-accepted", "result accepted"),
        ("sw dot d-rejected", "result rejected (late observation)"),
        ("sw dot d-duplicate", "result duplicate"),
        ("sw dot d-conflict", "result conflict"),
        ("sw step applied", "target step applied"),
        ("sw step refused", "target step refused"),
        ("sw expire", "expire"),
        ("sw reconcile", "reconcile"),
        ("sw fault", "fault window"),
        ("sw anomaly-mark", "anomaly (links to it)"),
    ];
    let mut s = String::from("<ul class=\"legend\" id=\"legend\">");
    for (class, text) in items {
        let _ = write!(s, "<li><span class=\"{class}\"></span>{text}</li>");
    }
    s.push_str("</ul>");
    s
}

fn details(out: &mut String, run: &Run) {
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let _ = write!(
        out,
        "<section id=\"config\">\n<h2>Run</h2>\n<details><summary>config</summary><pre>{}</pre></details>\n\
         <details><summary>fault schedule</summary><pre>{}</pre></details>\n</section>\n",
        esc(&pretty(&run.config)),
        esc(&pretty(&run.schedule))
    );
}
