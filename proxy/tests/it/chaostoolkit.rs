//! Chaos Toolkit as a real client: `chaos run` (PyPI `chaostoolkit` with
//! `chaostoolkit-toxiproxy`, unmodified) runs the experiment in
//! `proxy/tests/chaostoolkit/toxiproxy-experiment.json` against the embedded
//! server, in-process on a free loopback port, in front of a small HTTP
//! service. Chaos Toolkit's own verdict (exit status, hypothesis before and
//! after) must pass, and the journal must show each probe's effect.
//!
//! The `chaos` program is `$FENCELAB_CHAOS_BIN`, by default
//! `.ci/venv/bin/chaos` under the workspace root (`scripts/setup` installs it). When
//! it is missing the test says it skipped, unless `FENCELAB_REQUIRE_ALL=1`,
//! where it fails.

use crate::support::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bound of the whole `chaos run`.
const CHAOS_TIMEOUT: Duration = Duration::from_secs(50);

/// The `chaos` program to run, if present.
fn chaos_bin() -> Result<PathBuf, String> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = match std::env::var_os("FENCELAB_CHAOS_BIN") {
        Some(path) => PathBuf::from(path),
        None => workspace.join(".ci/venv/bin/chaos"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("no chaos program at {} (set FENCELAB_CHAOS_BIN or run scripts/setup)", path.display()))
    }
}

/// A tiny HTTP/1.1 service: answers every request `200 ok`, keeping the
/// connection open for the next one (as a real service would).
async fn http_service() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = sock.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        request.drain(..end + 4);
                        let answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
                        if sock.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

/// The journal's run of the method activity called `name`.
fn run_of<'a>(journal: &'a Value, name: &str) -> &'a Value {
    journal["run"]
        .as_array()
        .and_then(|runs| runs.iter().find(|r| r["activity"]["name"] == name))
        .unwrap_or_else(|| panic!("no run of {name} in the journal"))
}

fn succeeded_with(journal: &Value, name: &str, output: Value) {
    let run = run_of(journal, name);
    assert_eq!(run["status"], "succeeded", "{name}: {run}");
    assert_eq!(run["output"], output, "{name}: {run}");
}

fn answered(journal: &Value, name: &str) -> f64 {
    let run = run_of(journal, name);
    assert_eq!(run["status"], "succeeded", "{name}: {run}");
    assert_eq!(run["output"]["status"], 200, "{name}: {run}");
    assert_eq!(run["output"]["body"], "ok", "{name}: {run}");
    run["duration"].as_f64().unwrap()
}

fn failed(journal: &Value, name: &str) -> f64 {
    let run = run_of(journal, name);
    assert_eq!(run["status"], "failed", "{name} should not get an answer: {run}");
    run["duration"].as_f64().unwrap()
}

#[tokio::test]
async fn chaos_toolkit_experiment_passes_against_the_embedded_server() {
    let chaos = match chaos_bin() {
        Ok(path) => path,
        Err(why) if std::env::var("FENCELAB_REQUIRE_ALL").as_deref() == Ok("1") => {
            panic!("FENCELAB_REQUIRE_ALL=1 and {why}")
        }
        Err(why) => {
            println!("skipped: {why}");
            eprintln!("skipped: {why}");
            return;
        }
    };
    bounded(async {
        let s = server().await;
        let upstream_port = http_service().await;
        let proxy_port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let experiment = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/chaostoolkit/toxiproxy-experiment.json");
        let journal_path = dir.path().join("journal.json");
        let mut command = tokio::process::Command::new(&chaos);
        command
            .args(["--no-version-check", "--log-file"])
            .arg(dir.path().join("chaostoolkit.log"))
            .arg("--settings")
            .arg(dir.path().join("settings.yaml"))
            .args(["run", "--journal-path"])
            .arg(&journal_path)
            .arg(&experiment)
            .current_dir(dir.path())
            .env("FENCELAB_TOXIPROXY_URL", s.url())
            .env("FENCELAB_CTK_UPSTREAM_PORT", upstream_port.to_string())
            .env("FENCELAB_CTK_PROXY_PORT", proxy_port.to_string())
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(CHAOS_TIMEOUT, command.output())
            .await
            .expect("chaos run exceeded its time bound")
            .expect("chaos runs");
        let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        let journal: Value = std::fs::read_to_string(&journal_path)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_else(|| panic!("no journal; chaos said:\n{log}"));
        assert!(output.status.success(), "chaos run failed ({}):\n{log}", output.status);
        assert_eq!(
            (journal["status"].clone(), journal["deviated"].clone()),
            ("completed".into(), false.into()),
            "{log}"
        );

        succeeded_with(&journal, "create-proxy", true.into());
        succeeded_with(&journal, "proxy-exists", true.into());
        let clean = answered(&journal, "request-through-clean-proxy");
        assert!(clean < 1.0, "clean request took {clean}s");
        succeeded_with(&journal, "add-latency-toxic", true.into());
        let slow = answered(&journal, "request-under-latency");
        assert!((0.95..6.0).contains(&slow), "request under 1000 ms latency took {slow}s");
        succeeded_with(&journal, "remove-latency-toxic", true.into());
        // Chaos Toolkit's default attributes are null: Toxiproxy makes a timeout 0 toxic.
        succeeded_with(&journal, "add-timeout-toxic-with-default-attributes", true.into());
        let held = failed(&journal, "request-into-timeout");
        assert!(held >= 0.9, "the timeout toxic answered early ({held}s)");
        succeeded_with(&journal, "remove-timeout-toxic", true.into());
        succeeded_with(&journal, "add-limit-toxic", true.into());
        failed(&journal, "request-into-limit");
        succeeded_with(&journal, "remove-limit-toxic", true.into());
        succeeded_with(&journal, "disable-proxy", true.into());
        failed(&journal, "request-while-disabled");
        succeeded_with(&journal, "enable-proxy", true.into());
        answered(&journal, "request-after-recovery");
        succeeded_with(&journal, "proxy-has-no-toxics-left", Value::Array(vec![]));
        // The rollbacks removed the proxy.
        assert_eq!(call(&s.url(), "GET", "/proxies", None).await.1, serde_json::json!({}));
        println!(
            "chaos run passed: {} method activities, latency probe {slow:.2}s, timeout probe held {held:.2}s",
            journal["run"].as_array().unwrap().len()
        );
        s.shutdown().await;
    })
    .await;
}
