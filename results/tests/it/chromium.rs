//! report.html in headless Chromium: the timeline renders, the inline script runs (it adds
//! `<div id="rendered">`), no console message, no network request; for a report with
//! anomalies every plot is drawn and, entered at `#a0`, the first anomaly's story opens and is
//! drawn. Skipped (and passing) when
//! Chromium is not installed, unless `FENCELAB_REQUIRE_ALL=1`.
//!
//! No request can go unnoticed: the page's CSP is `default-src 'none'`, so any fetch is blocked
//! *and* logged to the console, which `--enable-logging=stderr` prints as a `CONSOLE` line; DNS
//! is mapped to nowhere as a second fence. A negative control proves the checks can fail.

use crate::browser::{available, marker_attr, marker_count, problems, Loaded};
use crate::fixture;
use results::report_html;

/// Writes `html` to a fresh temp dir and loads it in headless Chromium.
fn load(html: &str) -> Loaded {
    load_at(html, "")
}

/// As [`load`], entering the page at `#fragment` (when not empty).
fn load_at(html: &str, fragment: &str) -> Loaded {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    std::fs::write(&page, html).unwrap();
    crate::browser::load(&page, fragment, dir.path())
}

#[test]
fn report_renders_in_chromium_without_errors_or_requests() {
    if !available() {
        return;
    }
    let events = fixture::history();
    let html = report_html(&fixture::run(&events), &events);
    let loaded = load(&html);
    assert_eq!(problems(&loaded), Vec::<String>::new(), "\n{}", loaded.log);
    let declared: usize =
        html.split("data-svg-elements=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
    assert_eq!(marker_count(&loaded.dom), Some(declared), "the browser sees every SVG element");
    assert!(loaded.dom.contains(">job j1</text>") && loaded.dom.contains("id=\"legend\""));
}

#[test]
fn negative_control_a_fetch_and_a_script_error_are_detected() {
    if !available() {
        return;
    }
    let events = fixture::history();
    let html = report_html(&fixture::run(&events), &events).replace(
        "<script>",
        "<img src=\"http://example.invalid/x.png\"><script>throw new Error(\"boom\");</script><script>",
    );
    let found = problems(&load(&html)).join("\n");
    assert!(found.contains("example.invalid"), "blocked fetch not detected:\n{found}");
    assert!(found.contains("Uncaught Error: boom"), "script error not detected:\n{found}");
}

#[test]
fn negative_control_a_broken_script_loses_the_marker() {
    if !available() {
        return;
    }
    let events = fixture::history();
    let html =
        report_html(&fixture::run(&events), &events).replace("marker.id = \"rendered\";", "marker.id = rendered;");
    let found = problems(&load(&html)).join("\n");
    assert!(found.contains("no marker of the inline script"), "missing marker not detected:\n{found}");
}

/// What the page's script says about each plot: id → (SVG elements, drawn width, drawn height).
fn plots_drawn(dom: &str) -> std::collections::BTreeMap<String, (usize, u32, u32)> {
    let mut drawn = std::collections::BTreeMap::new();
    for item in marker_attr(dom, "data-plots").unwrap_or_default().split_whitespace() {
        let parts: Vec<&str> = item.split(':').collect();
        if let [id, elements, size] = parts[..] {
            let (w, h) = size.split_once('x').unwrap_or(("0", "0"));
            drawn.insert(
                id.to_string(),
                (elements.parse().unwrap_or(0), w.parse().unwrap_or(0), h.parse().unwrap_or(0)),
            );
        }
    }
    drawn
}

/// The problems of a report entered at `#a0`: those of [`problems`], a plot not drawn (absent,
/// fewer elements than the file has, or no size), the first story not open or not drawn.
fn plot_and_story_problems(html: &str, loaded: &Loaded) -> Vec<String> {
    let mut found = problems(loaded);
    // The first plot, serialised as its save button saves it, parses back as an SVG of its own.
    match marker_attr(&loaded.dom, "data-saved-plot") {
        Some(saved) if saved.starts_with("svg:") && saved != "svg:0" => {}
        other => found.push(format!("the first plot does not save as an SVG of its own: {other:?}")),
    }
    if html.matches("class=\"save-plot\"").count() != crate::plots::PLOTS.len() {
        found.push("not every plot has its save button".into());
    }
    let drawn = plots_drawn(&loaded.dom);
    for id in crate::plots::PLOTS {
        let in_file = crate::html::count_elements(crate::plots::plot_svg(html, id));
        match drawn.get(id) {
            Some(&(elements, w, h)) if elements == in_file && w > 100 && h > 50 => {}
            other => found.push(format!("plot {id} not drawn: {other:?}, {in_file} elements in the file")),
        }
    }
    let steps = html[html.find("id=\"story-a0\"").unwrap_or(0)..]
        .split("</details>")
        .next()
        .unwrap_or("")
        .matches("<li ")
        .count();
    if !loaded.dom.contains("<details class=\"story\" id=\"story-a0\" open=\"\">") {
        found.push("the first story did not open".into());
    }
    let story = marker_attr(&loaded.dom, "data-story").unwrap_or_default();
    let parts: Vec<&str> = story.split(':').collect();
    match parts[..] {
        ["story-a0", count, height, size]
            if count == steps.to_string() && height.parse::<u32>().unwrap_or(0) > 20 && !size.starts_with("0x") => {}
        _ => found.push(format!("the first story ({steps} steps) is not drawn: {story:?}")),
    }
    found
}

#[test]
fn every_plot_and_the_first_story_render_without_errors_or_requests() {
    if !available() {
        return;
    }
    let events = fixture::history();
    let html = report_html(&fixture::run(&events), &events);
    let loaded = load_at(&html, "a0");
    assert_eq!(plot_and_story_problems(&html, &loaded), Vec::<String>::new(), "\n{}", loaded.log);
}

#[test]
fn negative_control_a_story_that_does_not_open_and_a_broken_plot_are_detected() {
    if !available() {
        return;
    }
    let events = fixture::history();
    let html = report_html(&fixture::run(&events), &events).replace("story.open = true;", "").replace(
        "<svg id=\"plot-throughput\" class=\"plot\"",
        "<svg id=\"plot-throughput\" class=\"plot\" style=\"display:none\"",
    );
    let found = plot_and_story_problems(&html, &load_at(&html, "a0")).join("\n");
    assert!(found.contains("the first story did not open"), "{found}");
    assert!(found.contains("the first story (8 steps) is not drawn"), "{found}");
    assert!(found.contains("plot plot-throughput not drawn"), "{found}");
    assert!(!found.contains("plot plot-latency"), "{found}");
}
