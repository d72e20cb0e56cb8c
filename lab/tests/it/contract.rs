//! Edges of the contract over real processes and real TCP: raw bytes no HTTP client would
//! send, the exact bearer header, the spellings of `Content-Type` and `null` that are
//! accepted, the read endpoints' parameters, the target's deployments and step log, and the
//! servers' command lines, announcements and stops. (What is refused and changes nothing is
//! in `bad_input.rs`.)
//!
//! Repeat with: `cargo nextest run -p lab contract::`

use std::path::Path;
use std::time::Duration;

use lab::demo::{LabOptions, LocalLab, CAPABILITY_SECRET, OPERATOR_TOKEN};
use procs::launch;
use protocol::client::Client;
use protocol::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// Every wait on a condition (generous: the machine may be loaded).
const WAIT_MAX: Duration = Duration::from_secs(30);

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fencelab-lab"))
}

fn now_ms() -> i64 {
    lab::control::Now::read().ms
}

/// Sends `request` as bytes on a new connection and reads until the server closes it.
async fn raw(base: &str, request: &[u8]) -> Vec<u8> {
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("the server accepts");
    stream.write_all(request).await.expect("the request is sent");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT_MAX, stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection in time")
        .expect("the answer is read");
    answer
}

/// The responses in `bytes`, in order: each status and JSON body (`Null` when there is none).
fn responses(mut bytes: &[u8]) -> Vec<(u16, Value)> {
    let mut all = Vec::new();
    while !bytes.is_empty() {
        let end = bytes.windows(4).position(|window| window == b"\r\n\r\n").expect("a complete head") + 4;
        let head = String::from_utf8_lossy(&bytes[..end]).to_lowercase();
        let status = head[9..12].parse().expect("a status code");
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .map_or(0, |value| value.trim().parse().expect("a length"));
        let body = &bytes[end..end + length];
        all.push((status, serde_json::from_slice(body).unwrap_or(Value::Null)));
        bytes = &bytes[end + length..];
    }
    all
}

/// Asserts an error answer: its status and the documented body with `code`.
fn assert_error(answer: &(u16, Value), status: u16, code: &str, what: &str) {
    let (got, body) = answer;
    assert_eq!(*got, status, "{what}: {body}");
    let keys: Vec<&String> = body.as_object().map(|object| object.keys().collect()).unwrap_or_default();
    assert_eq!(keys.len(), 3, "{what}: not exactly {{error, code, status}}: {body}");
    assert_eq!((body["code"].as_str(), body["status"].as_u64()), (Some(code), Some(status as u64)), "{what}: {body}");
    assert!(!body["error"].as_str().unwrap_or_default().is_empty(), "{what}: {body}");
}

/// Requests that no HTTP client library would send still get the JSON error body.
#[tokio::test(flavor = "multi_thread")]
async fn raw_requests_over_tcp_get_the_json_error_body() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(LabOptions::new(program(), dir.path())).await.unwrap();
    let (control, target) = (lab.control_url(), lab.target_url());
    let auth = format!("authorization: Bearer {OPERATOR_TOKEN}\r\n");
    let close = "connection: close\r\n\r\n";
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "raw 0xFF in a job id",
            &control,
            [b"GET /v1/jobs/\xff HTTP/1.1\r\n".as_slice(), auth.as_bytes(), close.as_bytes()].concat(),
            400,
            "invalid_path",
        ),
        (
            "raw 0xFF in a deployment key",
            &target,
            [b"GET /v1/deployments/\xff HTTP/1.1\r\n".as_slice(), close.as_bytes()].concat(),
            400,
            "invalid_path",
        ),
        (
            "raw 0xFF in an unknown path",
            &control,
            [b"GET /v1/\xff HTTP/1.1\r\n".as_slice(), close.as_bytes()].concat(),
            404,
            "no_route",
        ),
        (
            "raw 0xFF in a query",
            &target,
            [b"GET /v1/steps?after=\xff HTTP/1.1\r\n".as_slice(), close.as_bytes()].concat(),
            400,
            "invalid_query",
        ),
        ("not HTTP at all", &control, b"GARBAGE\r\n\r\n".to_vec(), 400, "malformed_request"),
        (
            "not HTTP at all, on the target",
            &target,
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            "HTTP/2.0 request line",
            &control,
            format!("GET /v1/health HTTP/2.0\r\n{close}").into_bytes(),
            400,
            "malformed_request",
        ),
        (
            "a header line without a colon",
            &control,
            format!("GET /v1/health HTTP/1.1\r\nbroken\r\n{close}").into_bytes(),
            400,
            "malformed_request",
        ),
        (
            "two different content lengths",
            &control,
            format!("POST /v1/projects HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n{close}{{}}").into_bytes(),
            400,
            "malformed_request",
        ),
        (
            "a head over 16 KiB",
            &control,
            format!("GET /v1/health HTTP/1.1\r\nx-long: {}\r\n{close}", "a".repeat(17 * 1024)).into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "65 header fields",
            &target,
            format!(
                "GET /v1/health HTTP/1.1\r\n{}{close}",
                (0..65).map(|n| format!("x-{n}: 1\r\n")).collect::<String>()
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
    ];
    for (what, base, request, status, code) in cases {
        let answers = responses(&raw(base, &request).await);
        assert_eq!(answers.len(), 1, "{what}: {answers:?}");
        assert_error(&answers[0], status, code, what);
    }
    // On one connection: a body holding bytes outside ASCII, then a raw 0xFF in the next path.
    let body = "{\"id\": \"p\u{e4}\"}";
    let first = format!(
        "POST /v1/projects HTTP/1.1\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let second = [b"GET /v1/jobs/\xff HTTP/1.1\r\n".as_slice(), auth.as_bytes(), close.as_bytes()].concat();
    let answers = responses(&raw(&control, &[first.as_bytes(), &second].concat()).await);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_error(&answers[0], 400, "invalid_field", "a project id outside ASCII");
    assert_error(&answers[1], 400, "invalid_path", "raw 0xFF after a body");
    lab.shutdown().await;
}

/// `Authorization` is `Bearer` and one space, then the token exactly; whitespace around a
/// header value is not part of it (HTTP), so it is not part of the token either.
#[tokio::test(flavor = "multi_thread")]
async fn the_bearer_scheme_is_matched_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(LabOptions::new(program(), dir.path())).await.unwrap();
    let control = lab.control_url();
    let read = |authorization: String| {
        let control = control.clone();
        async move {
            let request =
                format!("GET /v1/jobs HTTP/1.1\r\nauthorization:{authorization}\r\nconnection: close\r\n\r\n");
            responses(&raw(&control, request.as_bytes()).await).remove(0)
        }
    };
    for accepted in [
        format!(" Bearer {OPERATOR_TOKEN}"),
        format!("Bearer {OPERATOR_TOKEN}"),
        format!(" Bearer {OPERATOR_TOKEN} \t"),
    ] {
        let (status, body) = read(accepted.clone()).await;
        assert_eq!((status, body), (200, json!([])), "`{accepted}` was refused");
    }
    for refused in [
        format!(" bearer {OPERATOR_TOKEN}"),
        format!(" BEARER {OPERATOR_TOKEN}"),
        format!(" Bearer  {OPERATOR_TOKEN}"),
        format!(" Bearer\t{OPERATOR_TOKEN}"),
        format!(" Bearer:{OPERATOR_TOKEN}"),
        format!(" Token {OPERATOR_TOKEN}"),
        format!(" {OPERATOR_TOKEN}"),
        " Bearer".to_string(),
    ] {
        assert_error(&read(refused.clone()).await, 401, "unauthorized", &format!("`{refused}`"));
    }
    lab.shutdown().await;
}

/// Sends a JSON body with the operator token and `content_type` as given.
async fn post(base: &str, path: &str, content_type: &str, body: &Value) -> (u16, Value) {
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{base}{path}"))
        .bearer_auth(OPERATOR_TOKEN)
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(body.to_string())
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

/// The media type is compared without regard to case, and its parameters are ignored.
#[tokio::test(flavor = "multi_thread")]
async fn a_json_content_type_is_accepted_in_any_case_with_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(LabOptions::new(program(), dir.path())).await.unwrap();
    let accepted = [
        "application/json",
        "application/JSON",
        "Application/Json",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "application/json ; profile=x",
    ];
    for (index, content_type) in accepted.iter().enumerate() {
        let (status, body) =
            post(&lab.control_url(), "/v1/projects", content_type, &json!({"id": format!("p{index}")})).await;
        assert_eq!(status, 201, "`{content_type}`: {body}");
    }
    lab.shutdown().await;
}

/// `null` for an optional field is the field absent; for a required one it is `invalid_body`.
#[tokio::test(flavor = "multi_thread")]
async fn null_for_an_optional_field_is_the_field_absent() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = LabOptions::new(program(), dir.path());
    options.lease_ms = 1_000;
    let lab = LocalLab::start(options).await.unwrap();
    let control = lab.control_url();
    let json = "application/json";
    let job = json!({"project": "demo", "id": null, "deployment_key": "k", "spec": {"steps": 1, "step_ms": 0}});
    let (status, submitted) = post(&control, "/v1/jobs", json, &job).await;
    assert_eq!((status, submitted["id"].as_str()), (201, Some("j1")), "a generated id: {submitted}");
    let project = lab.operator.create_project("other").await.unwrap();
    let registration = lab.operator.with_token(&project.registration_token);
    let (status, registered) = registration
        .raw(reqwest::Method::POST, "/v1/runners", Some(&json!({"project": null, "id": "o1"})))
        .await
        .unwrap();
    assert_eq!((status, registered["project"].as_str()), (201, Some("other")), "{registered}");

    let runner = lab.register("r1").await.unwrap();
    let grant =
        runner.claim(&ClaimRequest { runner: "r1".into(), observed_ms: now_ms() }).await.unwrap().grant.unwrap();
    let claim = &grant.claim;
    let report = json!({"job": claim.job, "attempt": claim.attempt, "runner": "r1", "fence": claim.fence,
                        "observed_ms": 0, "outcome": "succeeded", "detail": null});
    let (status, verdict) = runner.raw(reqwest::Method::POST, "/v1/result", Some(&report)).await.unwrap();
    assert_eq!((status, verdict["decision"].as_str()), (200, Some("accepted")), "{verdict}");

    lab.submit("j2", "k2", JobSpec { steps: 1, step_ms: 0 }).await.unwrap();
    let grant =
        runner.claim(&ClaimRequest { runner: "r1".into(), observed_ms: now_ms() }).await.unwrap().grant.unwrap();
    lab.wait_job("j2", WAIT_MAX, |view| view.state == JobState::Uncertain).await.unwrap();
    let reconcile =
        json!({"job": "j2", "attempt": grant.claim.attempt, "finding": "stopped", "outcome": null, "evidence": null});
    let (status, view) = post(&control, "/v1/reconcile", json, &reconcile).await;
    assert_eq!((status, view["state"].as_str()), (200, Some("queued")), "{view}");
    let entry = view["ledger"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((entry["kind"].as_str(), entry.get("reason")), (Some("reconcile"), None), "{entry}");
    lab.shutdown().await;
}

/// `after` and `limit` are decimal integers up to `u64::MAX`; `limit` is clamped.
#[tokio::test(flavor = "multi_thread")]
async fn read_limits_are_clamped_and_positions_may_be_any_u64() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(LabOptions::new(program(), dir.path())).await.unwrap();
    for index in 0..3 {
        lab.submit(&format!("j{index}"), "k", JobSpec { steps: 1, step_ms: 0 }).await.unwrap();
    }
    let operator = &lab.operator;
    let target = Client::new(&lab.target_url(), None, Duration::from_secs(5));
    let step = |fence: u64| StepRequest { capability: signed(fence), step: 0, steps: 1, duration_ms: 0 };
    for fence in 1..=3 {
        target.step(&step(fence)).await.unwrap();
    }
    let count = |(status, page): (u16, Value)| {
        assert_eq!(status, 200, "{page}");
        page.as_array().expect("a page").len()
    };
    let get = |client: &Client, path: &str| {
        let (client, path) = (client.clone(), path.to_string());
        async move { client.raw(reqwest::Method::GET, &path, None::<&()>).await.unwrap() }
    };
    assert_eq!(count(get(operator, "/v1/ledger?limit=0").await), 1, "limit 0 is clamped to 1");
    assert_eq!(count(get(operator, "/v1/ledger?limit=007").await), 3);
    assert_eq!(count(get(operator, &format!("/v1/ledger?limit={}", u64::MAX)).await), 3);
    assert_eq!(count(get(operator, &format!("/v1/ledger?after={}", u64::MAX)).await), 0);
    assert_eq!(count(get(&target, "/v1/steps?limit=0").await), 1, "limit 0 is clamped to 1");
    assert_eq!(count(get(&target, "/v1/steps?after=1&limit=18446744073709551615").await), 2);
    assert_eq!(count(get(&target, &format!("/v1/steps?after={}", u64::MAX)).await), 0);
    lab.shutdown().await;
}

/// A capability for key `prod`, job `j`, signed with the local lab's secret.
fn signed(fence: u64) -> Capability {
    let unsigned = Capability {
        deployment_key: "prod".into(),
        job: "j".into(),
        attempt: format!("j-a{fence}"),
        runner: "r".into(),
        fence,
        expires_ms: now_ms() + 60_000,
        signature: String::new(),
    };
    lab::capability::sign(CAPABILITY_SECRET.as_bytes(), unsigned)
}

/// A refused step changes nothing but the step log: a key only refused steps named is
/// unknown, and a refused step leaves the key's revision and highest fence as they were.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_step_changes_no_deployment() {
    let dir = tempfile::tempdir().unwrap();
    let lab = LocalLab::start(LabOptions::new(program(), dir.path())).await.unwrap();
    let target = Client::new(&lab.target_url(), None, Duration::from_secs(5));
    let deployment = || async { target.raw(reqwest::Method::GET, "/v1/deployments/prod", None::<&()>).await.unwrap() };
    let step = |capability: Capability| StepRequest { capability, step: 0, steps: 1, duration_ms: 0 };

    let forged = Capability { signature: "00".repeat(32), ..signed(9) };
    let refused = target.step(&step(forged)).await.unwrap().record;
    assert_eq!((refused.applied, refused.revision, refused.highest_fence_before), (false, 0, 0));
    assert_error(&deployment().await, 404, "unknown_deployment", "after a refused step");

    let applied = target.step(&step(signed(5))).await.unwrap().record;
    assert_eq!((applied.applied, applied.revision, applied.highest_fence_before), (true, 1, 0));
    let stale = target.step(&step(signed(3))).await.unwrap().record;
    assert_eq!((stale.applied, stale.revision, stale.highest_fence_before), (false, 1, 5));
    let (status, body) = deployment().await;
    assert_eq!((status, body), (200, json!({"key": "prod", "revision": 1, "highest_fence": 5})));
    lab.shutdown().await;
}

/// The target appends to its step log; a new process numbers its records from 0 again.
#[tokio::test(flavor = "multi_thread")]
async fn the_step_log_is_appended_to_across_target_processes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.jsonl");
    std::fs::write(&log, "a line written before\n").unwrap();
    for _ in 0..2 {
        let args = ["target", "--listen=127.0.0.1:0", "--secret=s", "--mode=unfenced"].map(String::from);
        let mut args = args.to_vec();
        args.push(format!("--step-log={}", log.display()));
        let command = launch::command(program(), &args, Some(&dir.path().join("target.log"))).unwrap();
        let mut target = launch::server(command, "target").await.unwrap();
        let client = Client::new(&format!("http://{}", target.addr.unwrap()), None, Duration::from_secs(5));
        client.step(&StepRequest { capability: signed(1), step: 0, steps: 1, duration_ms: 0 }).await.unwrap();
        target.stop(Duration::from_secs(5)).await;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "a line written before");
    for line in &lines[1..] {
        let record: StepRecord = serde_json::from_str(line).unwrap();
        assert_eq!((record.seq, record.applied), (0, true), "{line}");
    }
}

/// Each server prints exactly `{"listening": ADDR}` on stdout once bound, and exits 0 on
/// SIGTERM; a runner prints nothing on stdout and exits 0 on SIGTERM.
#[tokio::test(flavor = "multi_thread")]
async fn servers_announce_their_address_and_every_process_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("--db={}", dir.path().join("control.sqlite").display());
    let control = ["control-plane", "--listen=127.0.0.1:0", &db, "--operator-token=op", "--secret=s"];
    let target = ["target", "--listen=127.0.0.1:0", "--secret=s"];
    for args in [&control[..], &target[..]] {
        let mut command = launch::command(program(), args, Some(&dir.path().join("server.log"))).unwrap();
        let mut child = command.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT_MAX, lines.next_line()).await.unwrap().unwrap().unwrap();
        let announced: Value = serde_json::from_str(&line).unwrap();
        let addr: std::net::SocketAddr = announced["listening"].as_str().unwrap().parse().unwrap();
        assert_eq!((announced.as_object().unwrap().len(), addr.ip().to_string()), (1, "127.0.0.1".into()), "{line}");
        let health = Client::new(&format!("http://{addr}"), None, Duration::from_secs(5)).health().await.unwrap();
        assert_eq!(health, json!({"status": "ok"}));
        // SAFETY: kill(2) on the child we just started.
        assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) }, 0);
        let status = tokio::time::timeout(WAIT_MAX, child.wait()).await.unwrap().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}");
        assert_eq!(lines.next_line().await.unwrap(), None, "{args:?} printed more than its address");
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = format!("--control-url=http://{closed}");
    let runner = ["runner", "--id=r1", "--token=t", &url];
    let mut command = launch::command(program(), &runner, Some(&dir.path().join("runner.log"))).unwrap();
    let mut child = command.spawn().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: kill(2) on the child we just started.
    assert_eq!(unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) }, 0);
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).await.unwrap();
    let status = tokio::time::timeout(WAIT_MAX, child.wait()).await.unwrap().unwrap();
    assert_eq!((status.code(), stdout.as_str()), (Some(0), ""));
}

/// Runs `fencelab-lab ARGS` to its end without the lab's environment variables; its exit code.
async fn exit_code(args: &[&str]) -> Option<i32> {
    let mut command = tokio::process::Command::new(program());
    command.args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).kill_on_drop(true);
    for variable in ["FENCELAB_OPERATOR_TOKEN", "FENCELAB_CAPABILITY_SECRET", "FENCELAB_RUNNER_TOKEN"] {
        command.env_remove(variable);
    }
    let status = tokio::time::timeout(WAIT_MAX, command.status()).await.unwrap().unwrap();
    status.code()
}

/// A missing required flag is a usage error (254); an empty operator token or secret is
/// refused at start (255).
#[tokio::test(flavor = "multi_thread")]
async fn required_flags_and_empty_secrets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("--db={}", dir.path().join("control.sqlite").display());
    let cases: [(&[&str], i32); 7] = [
        (&["control-plane", "--listen=127.0.0.1:0", &db, "--secret=s"], 254),
        (&["control-plane", "--listen=127.0.0.1:0", &db, "--operator-token=op"], 254),
        (&["control-plane", "--listen=127.0.0.1:0", &db, "--operator-token=", "--secret=s"], 255),
        (&["control-plane", "--listen=127.0.0.1:0", &db, "--operator-token=op", "--secret="], 255),
        (&["target", "--listen=127.0.0.1:0"], 254),
        (&["target", "--listen=127.0.0.1:0", "--secret="], 255),
        (&["runner", "--id=r1"], 254),
    ];
    for (args, expected) in cases {
        assert_eq!(exit_code(args).await, Some(expected), "fencelab-lab {}", args.join(" "));
    }
}
