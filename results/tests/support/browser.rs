//! A report as a browser shows it: `report.html` loaded in headless Chromium, its DOM after
//! the inline script ran, and what Chromium logged (console messages, blocked or failed
//! requests). The tests of this crate and of the harness judge reports this way, on fixture
//! reports and on the reports of real runs: this one file, included by both test suites
//! (`#[path]`), since `results` itself does no I/O.
//!
//! No request can go unnoticed: the page's CSP is `default-src 'none'`, so any fetch is
//! blocked *and* logged to the console, which `--enable-logging=stderr` prints as a `CONSOLE`
//! line; DNS is mapped to nowhere as a second fence.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian installs Chromium.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Longest wait for one load.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// A loaded page: the DOM Chromium dumped and the log it wrote.
pub struct Loaded {
    pub dom: String,
    pub log: String,
}

/// Whether Chromium is there; prints SKIPPED (or panics under `FENCELAB_REQUIRE_ALL=1`).
pub fn available() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    assert!(std::env::var("FENCELAB_REQUIRE_ALL").as_deref() != Ok("1"), "chromium not installed at {CHROMIUM}");
    println!("SKIPPED: chromium not installed");
    false
}

/// Loads `page` in headless Chromium, entering it at `#fragment` (when not empty), with its
/// profile, DOM and log in `scratch`; kills it (its whole process group, which only it is in)
/// after [`TIMEOUT`].
pub fn load(page: &Path, fragment: &str, scratch: &Path) -> Loaded {
    let profile = scratch.join("profile");
    let (out, err) = (scratch.join("dom.html"), scratch.join("chromium.log"));
    let mut child = Command::new(CHROMIUM)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--enable-logging=stderr", "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", "--dump-dom"])
        .arg(format!(
            "file://{}{}",
            page.display(),
            if fragment.is_empty() { String::new() } else { format!("#{fragment}") }
        ))
        .stdin(Stdio::null())
        .stdout(File::create(&out).expect("the DOM's file"))
        .stderr(File::create(&err).expect("the log's file"))
        .process_group(0)
        .spawn()
        .expect("start chromium");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("chromium's status") {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = Command::new("kill").args(["-KILL", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            panic!("chromium did not finish within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let loaded = Loaded { dom: read(&out), log: read(&err) };
    assert!(status.success(), "chromium failed: {status}\n{}", loaded.log);
    loaded
}

/// The problems a load shows: console messages (script errors, CSP-blocked fetches), failed
/// requests, a missing timeline or a missing marker of the inline script.
pub fn problems(loaded: &Loaded) -> Vec<String> {
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
pub fn marker_count(dom: &str) -> Option<usize> {
    marker_attr(dom, "data-svg-elements")?.parse().ok()
}

/// The value of attribute `name` on the script's marker, as the browser left it.
pub fn marker_attr<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let marker = &dom[dom.find("<div id=\"rendered\"")?..];
    let marker = &marker[..marker.find('>')?];
    let key = format!("{name}=\"");
    let rest = &marker[marker.find(&key)? + key.len()..];
    Some(&rest[..rest.find('"')?])
}
