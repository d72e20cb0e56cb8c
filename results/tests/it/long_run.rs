//! A 10-minute run with 10 runners, synthesised by the checkers' bench generator (retimed onto
//! ten minutes, its runners spread over ten): the plots stay bounded in points, SVG elements
//! and bytes, and the whole report's size is printed (`--no-capture` shows it).

use crate::html::{assert_offline, count_elements};
use crate::plots::{plot_svg, PLOTS};
use history::{Event, EventType};
use results::report_html;

#[allow(dead_code)]
#[path = "../../../checkers/benches/support/gen.rs"]
mod gen;

const TEN_MINUTES_NS: f64 = 600e9;

/// The generator's correct history of about `target` events, its clock stretched so that it
/// spans ten minutes (each event 1 ms after the last plus the server clock's advance), and each
/// attempt's runner one of r0..r9 (by a hash of the attempt's id).
pub fn ten_minutes_ten_runners(target: usize) -> Vec<Event> {
    let mut g = gen::Gen::new(7);
    let mut events = g.chunk(target);
    events.extend(g.finals());
    let mut t_us: i64 = 0;
    let mut previous: Option<i64> = None;
    let mut times = Vec::with_capacity(events.len());
    for e in &events {
        if let Some(received) = e.received_ms {
            t_us += previous.map_or(0, |p| (received - p).max(0) * 1000);
            previous = Some(received);
        }
        t_us += 1000;
        times.push(t_us);
    }
    let scale = TEN_MINUTES_NS / (t_us * 1000) as f64;
    for (e, t) in events.iter_mut().zip(times) {
        e.time_ns = (t as f64 * 1000.0 * scale) as u64;
    }
    for i in 0..events.len() {
        let attempt = events[i].attempt.clone().or_else(|| {
            let claim = events.get(i + 1).filter(|_| events[i].kind == EventType::Request)?;
            claim.attempt.clone()
        });
        let Some(attempt) = attempt else { continue };
        let number = attempt.bytes().fold(17u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        let runner = format!("r{}", number % 10);
        let e = &mut events[i];
        if e.runner.is_some() {
            e.runner = Some(runner.clone());
        }
        if e.process.is_runner() {
            e.process = history::Process::runner(&runner);
        }
    }
    events
}

#[test]
fn a_ten_minute_ten_runner_run_has_bounded_plots() {
    let events = ten_minutes_ten_runners(150_000);
    let runners: std::collections::BTreeSet<&str> = events.iter().filter_map(|e| e.runner.as_deref()).collect();
    assert_eq!(runners.len(), 10, "{runners:?}");
    let span_s = events.last().unwrap().time_ns as f64 / 1e9;
    assert!((599.0..=600.5).contains(&span_s), "{span_s}");
    let mut run = crate::fixture::run_with(vec![]);
    run.duration_ms = 600_000;
    run.schedule = serde_json::json!((0..20)
        .map(|k| serde_json::json!({"at_ms": 10_000 + k * 30_000, "duration_ms": 8_000, "kind": "reconnects", "runner": format!("r{}", k % 10)}))
        .collect::<Vec<_>>());
    let html = report_html(&run, &events);
    let mut plot_bytes = 0;
    for id in PLOTS {
        let svg = plot_svg(&html, id);
        let (elements, bytes) = (count_elements(svg), svg.len());
        let points: usize = svg.split("data-points=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        println!("{id}: {points} points, {elements} SVG elements, {bytes} bytes");
        assert!(elements < 1_000, "{id}: {elements} elements");
        assert!(bytes < 200_000, "{id}: {bytes} bytes");
        assert!(svg.matches("<rect class=\"band\"").count() == 20, "{id} has every fault band");
        plot_bytes += bytes;
    }
    let latency = plot_svg(&html, "plot-latency");
    let points: usize = latency.split("data-points=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
    assert!(points <= 5 * results::plots::MAX_POINTS, "{points} latency points");
    assert!(
        html.contains("points drawn: every refused, duplicate, conflicting or unanswered one first"),
        "thinned, and says so"
    );
    println!(
        "{} events over {span_s:.0} s, 10 runners: report.html {} bytes, of which the plots {plot_bytes}",
        events.len(),
        html.len()
    );
    assert!(html.len() < 4 * 1024 * 1024, "{} bytes", html.len());
    assert_offline(&html);
}
