//! report.html in headless Chromium: the timeline renders, the inline script runs (it adds
//! `<div id="rendered">`), no console message, no network request. Skipped (and passing) when
//! Chromium is not installed, unless `FENCELAB_REQUIRE_ALL=1`.
//!
//! No request can go unnoticed: the page's CSP is `default-src 'none'`, so any fetch is blocked
//! *and* logged to the console, which `--enable-logging=stderr` prints as a `CONSOLE` line; DNS
//! is mapped to nowhere as a second fence. A negative control proves the checks can fail.

use crate::fixture;
use results::report_html;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
const TIMEOUT: Duration = Duration::from_secs(60);

struct Loaded {
    dom: String,
    log: String,
}

/// Whether Chromium is there; prints SKIPPED (or panics under `FENCELAB_REQUIRE_ALL=1`).
fn available() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    assert!(std::env::var("FENCELAB_REQUIRE_ALL").as_deref() != Ok("1"), "chromium not installed at {CHROMIUM}");
    println!("SKIPPED: chromium not installed");
    false
}

/// Writes `html` to a fresh temp dir and loads it in headless Chromium, killing it (its whole
/// process group, which only it is in) after [`TIMEOUT`].
fn load(html: &str) -> Loaded {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    std::fs::write(&page, html).unwrap();
    let profile = dir.path().join("profile");
    let (out, err) = (dir.path().join("dom.html"), dir.path().join("chromium.log"));
    let mut child = Command::new(CHROMIUM)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--enable-logging=stderr", "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .expect("start chromium");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            panic!("chromium did not finish within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let loaded = Loaded { dom: std::fs::read_to_string(&out).unwrap(), log: std::fs::read_to_string(&err).unwrap() };
    assert!(status.success(), "chromium failed: {status}\n{}", loaded.log);
    loaded
}

/// The problems a load shows: console messages (script errors, CSP-blocked fetches), failed
/// requests, a missing timeline or a missing marker of the inline script.
fn problems(loaded: &Loaded) -> Vec<String> {
    let mut found: Vec<String> = loaded
        .log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught") || l.contains("net::ERR") || l.contains("ERR_NAME"))
        .map(str::to_string)
        .collect();
    if !loaded.dom.contains("<svg id=\"timeline-svg\"") {
        found.push("no timeline svg in the DOM".into());
    }
    match marker_count(&loaded.dom) {
        Some(n) if n > 50 => {}
        other => found.push(format!("no marker of the inline script with the SVG drawn: {other:?}")),
    }
    found
}

/// The SVG element count that the page's script wrote on its marker, as the browser parsed it.
fn marker_count(dom: &str) -> Option<usize> {
    let marker = &dom[dom.find("<div id=\"rendered\"")?..];
    let rest = &marker[marker.find("data-svg-elements=\"")? + "data-svg-elements=\"".len()..];
    rest[..rest.find('"')?].parse().ok()
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
