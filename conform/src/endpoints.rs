//! Every endpoint of `docs/protocol.md` answering what it documents: the success status and
//! body of each control-plane and target endpoint, the verdicts of the claim reports (200
//! and 409), the ledger's paging, and `HEAD` on the `GET` routes. The error answers (4xx
//! codes and the error body) are the bad-input table's (`inputs.rs`).

use history::{ClosedBy, Decision, Op, Reason};
use protocol::*;
use serde_json::{json, Value};

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::session::{now_ms, post, report_body, result_body, said, tries, Payload, Request, Session, Try};
use system::Feature;

pub fn defs() -> Vec<Def> {
    vec![
        Def { name: "endpoint/health", needs: &[], run: |s, c| Box::pin(health(s, c)) },
        Def { name: "endpoint/projects", needs: &[], run: |s, c| Box::pin(projects(s, c)) },
        Def { name: "endpoint/runners", needs: &[], run: |s, c| Box::pin(runners(s, c)) },
        Def { name: "endpoint/jobs-submit", needs: &[], run: |s, c| Box::pin(submit(s, c)) },
        Def { name: "endpoint/jobs-read", needs: &[], run: |s, c| Box::pin(jobs_read(s, c)) },
        Def { name: "endpoint/claim", needs: &[], run: |s, c| Box::pin(claim(s, c)) },
        Def { name: "endpoint/heartbeat", needs: &[], run: |s, c| Box::pin(heartbeat(s, c)) },
        Def { name: "endpoint/capability", needs: &[Feature::Capabilities], run: |s, c| Box::pin(capability(s, c)) },
        Def { name: "endpoint/result", needs: &[], run: |s, c| Box::pin(result(s, c)) },
        Def { name: "endpoint/reconcile", needs: &[Feature::Reconcile], run: |s, c| Box::pin(reconcile(s, c)) },
        Def { name: "endpoint/ledger", needs: &[Feature::Ledger], run: |s, c| Box::pin(ledger(s, c)) },
        Def {
            name: "target/steps",
            needs: &[Feature::Target, Feature::Capabilities],
            run: |s, c| Box::pin(target_steps(s, c)),
        },
    ]
}

/// Generated tokens are 48 lowercase hex characters.
fn is_token(value: &Value) -> bool {
    value.as_str().is_some_and(|token| {
        token.len() == 48 && token.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value.as_object().map(|object| object.keys().cloned().collect()).unwrap_or_default();
    keys.sort();
    keys
}

/// Optional fields are omitted, never `null` (the claim response's `grant` aside).
fn nulls(value: &Value, place: &str, out: &mut Vec<String>) {
    match value {
        Value::Null => out.push(place.to_string()),
        Value::Object(object) => object.iter().for_each(|(key, value)| nulls(value, &format!("{place}.{key}"), out)),
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(index, value)| nulls(value, &format!("{place}[{index}]"), out))
        }
        _ => {}
    }
}

fn no_nulls(value: &Value, what: &str) -> Result<(), Finding> {
    let mut found = Vec::new();
    nulls(value, "", &mut found);
    ensure(found.is_empty(), || format!("{what} holds null at {} (optional fields are omitted)", found.join(", ")))
}

/// A `HEAD` on a `GET` route is answered 200 with no body.
async fn head(s: &Session, base: &str, path: &str, token: Option<&str>) -> Result<(), Finding> {
    let request = Request {
        method: "HEAD",
        url: format!("{base}{path}"),
        authorization: token.map(|token| format!("Bearer {token}")),
        content_type: None,
        body: Payload::Empty,
    };
    let answer = s.send(&request).await.map_err(|error| Finding::Fail(format!("HEAD {path}: {error}")))?;
    ensure(answer.status == 200 && answer.bytes.is_empty(), || {
        format!("HEAD {path} answered {} with {} bytes, not 200 with none", answer.status, answer.bytes.len())
    })
}

async fn health(s: &Session, _case: Case) -> CaseOutcome {
    let mut servers = vec![("control plane", s.control.clone())];
    servers.extend(s.target.clone().map(|target| ("target", target)));
    for (name, base) in &servers {
        let answer = s.get(base, "/v1/health", None).await?;
        ensure(answer.status == 200 && answer.json() == Some(json!({"status": "ok"})), || {
            format!("the {name}'s GET /v1/health answered {} {}", answer.status, answer.text())
        })?;
        head(s, base, "/v1/health", None).await?;
    }
    let names: Vec<&str> = servers.iter().map(|(name, _)| *name).collect();
    Ok(format!("GET /v1/health answers 200 {{\"status\": \"ok\"}} and HEAD 200 on the {}", names.join(" and the ")))
}

async fn projects(s: &Session, case: Case) -> CaseOutcome {
    let answer = s.send(&post(&s.control, "/v1/projects", Some(&s.operator_token), json!({"id": case.tag}))).await?;
    let body = answer.json().unwrap_or_default();
    ensure(answer.status == 201, || {
        format!("POST /v1/projects answered {} {}, not 201", answer.status, answer.text())
    })?;
    ensure(keys(&body) == ["id", "registration_token"] && body["id"] == case.tag.as_str(), || {
        format!("POST /v1/projects answered {body}, not {{\"id\": \"{}\", \"registration_token\"}}", case.tag)
    })?;
    ensure(is_token(&body["registration_token"]), || {
        format!("the registration token {} is not 48 lowercase hex characters", body["registration_token"])
    })?;
    Ok(format!("POST /v1/projects answers 201 {{\"id\", \"registration_token\"}} (48 hex) for project {}", case.tag))
}

/// Registers runner `body` with `token`; checks the 201 answer names `project` and gives a
/// runner token that claims.
async fn register(s: &Session, token: &str, body: Value, project: &str, how: &str) -> Result<(), Finding> {
    let answer = s.send(&post(&s.control, "/v1/runners", Some(token), body.clone())).await?;
    let got = answer.json().unwrap_or_default();
    ensure(answer.status == 201, || {
        format!("{how}: POST /v1/runners {body} answered {} {}", answer.status, answer.text())
    })?;
    ensure(keys(&got) == ["id", "project", "token"] && got["id"] == body["id"] && got["project"] == project, || {
        format!(
            "{how}: POST /v1/runners answered {got}, not {{\"id\": {}, \"project\": \"{project}\", \"token\"}}",
            body["id"]
        )
    })?;
    ensure(is_token(&got["token"]), || {
        format!("{how}: the runner token {} is not 48 lowercase hex characters", got["token"])
    })?;
    let runner = got["id"].as_str().unwrap_or_default();
    let claim = s
        .send(&post(&s.control, "/v1/claim", got["token"].as_str(), json!({"runner": runner, "observed_ms": now_ms()})))
        .await?;
    ensure(claim.status == 200 && claim.json() == Some(json!({"grant": null})), || {
        format!(
            "{how}: the new runner's claim in an empty project answered {} {}, not 200 {{\"grant\": null}}",
            claim.status,
            claim.text()
        )
    })
}

async fn runners(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 0).await?;
    let project = team.project.as_str();
    register(s, &s.operator_token, json!({"project": project, "id": case.id("r1")}), project, "the operator").await?;
    register(
        s,
        &team.registration_token,
        json!({"id": case.id("r2")}),
        project,
        "a registration token without a project",
    )
    .await?;
    register(
        s,
        &team.registration_token,
        json!({"project": project, "id": case.id("r3")}),
        project,
        "a registration token naming its project",
    )
    .await?;
    Ok("POST /v1/runners answers 201 {id, project, token} for the operator and for a registration token with or without its project; each token claims ({\"grant\": null})".into())
}

async fn submit(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 0).await?;
    let given = json!({"project": team.project, "id": case.id("j1"), "deployment_key": case.id("k1"), "spec": {"steps": 3, "step_ms": 20}});
    let answer = s.send(&post(&s.control, "/v1/jobs", Some(&s.operator_token), given.clone())).await?;
    ensure(answer.status == 201 && answer.json() == Some(json!({"id": case.id("j1")})), || {
        format!(
            "POST /v1/jobs with an id answered {} {}, not 201 {{\"id\": \"{}\"}}",
            answer.status,
            answer.text(),
            case.id("j1")
        )
    })?;
    let generated =
        json!({"project": team.project, "deployment_key": case.id("k2"), "spec": {"steps": 1, "step_ms": 0}});
    let answer = s.send(&post(&s.control, "/v1/jobs", Some(&s.operator_token), generated)).await?;
    let id = answer.json().and_then(|body| body["id"].as_str().map(str::to_string)).unwrap_or_default();
    let numbered = id.strip_prefix('j').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    ensure(answer.status == 201 && numbered, || {
        format!(
            "POST /v1/jobs without an id answered {} {}, not 201 {{\"id\": \"j<n>\"}}",
            answer.status,
            answer.text()
        )
    })?;
    for (job, key, steps, step_ms) in [(case.id("j1"), case.id("k1"), 3, 20), (id.clone(), case.id("k2"), 1, 0)] {
        let read = s.get(&s.control, &format!("/v1/jobs/{job}"), Some(&s.operator_token)).await?;
        let body = read.json().unwrap_or_default();
        no_nulls(&body, &format!("GET /v1/jobs/{job}"))?;
        let view: JobView = serde_json::from_value(body.clone())
            .map_err(|error| Finding::Fail(format!("GET /v1/jobs/{job} is not a JobView ({error}): {body}")))?;
        let expected = JobView {
            id: job.clone(),
            project: team.project.clone(),
            deployment_key: key,
            spec: JobSpec { steps, step_ms },
            state: JobState::Queued,
            current_attempt: None,
            outcome: None,
            attempts: vec![],
            ledger: view.ledger.clone(),
        };
        ensure(view == expected, || format!("a new job reads {body}, not queued with no attempt and no outcome"))?;
        if s.provides.ledger {
            let kinds: Vec<Op> = view.ledger.iter().map(|entry| entry.kind).collect();
            ensure(kinds == [Op::Submit], || format!("job {job}'s ledger holds {kinds:?}, not one submit entry"))?;
        }
    }
    let entry = if s.provides.ledger { ", one submit entry" } else { "" };
    Ok(format!("POST /v1/jobs answers 201 with the given id and with a generated one ({id}); the job reads queued, no attempt, no outcome{entry}"))
}

async fn jobs_read(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let ids: Vec<String> = (1..=3).map(|n| case.id(&format!("j{n}"))).collect();
    for (n, id) in ids.iter().enumerate() {
        s.submit(&team.project, id, &case.id(&format!("k{n}")), 1).await?;
    }
    let list = s.get(&s.control, "/v1/jobs", Some(&s.operator_token)).await?;
    let body = list.json().unwrap_or_default();
    let views: Vec<JobView> = serde_json::from_value(body.clone())
        .map_err(|error| Finding::Fail(format!("GET /v1/jobs is not a list of JobView: {error}")))?;
    let ours: Vec<&JobView> = views.iter().filter(|view| view.project == team.project).collect();
    let order: Vec<&str> = ours.iter().map(|view| view.id.as_str()).collect();
    ensure(order == ids, || {
        format!("GET /v1/jobs lists this project's jobs as {order:?}, not in submission order {ids:?}")
    })?;
    ensure(ours.iter().all(|view| view.attempts.is_empty() && view.ledger.is_empty()), || {
        "GET /v1/jobs lists jobs with attempts or ledger entries (they are empty arrays there)".into()
    })?;
    let grant = team.runners[0].claim_some().await?;
    let view = s.view(&ids[0]).await?;
    let attempt = view.attempts.first().cloned();
    let expected_id = format!("{}-a1", ids[0]);
    ensure(view.attempts.len() == 1 && view.current_attempt.as_deref() == Some(expected_id.as_str()), || {
        format!(
            "after one claim job {} reads attempts {:?} and current {:?}",
            ids[0], view.attempts, view.current_attempt
        )
    })?;
    let attempt = attempt.expect("one attempt");
    let shape = attempt.id == expected_id
        && attempt.job == ids[0]
        && attempt.runner == team.runners[0].id
        && attempt.fence == grant.claim.fence
        && attempt.current
        && attempt.closed_by.is_none()
        && matches!(attempt.state, AttemptState::Running | AttemptState::Uncertain)
        && attempt.lease_end_ms() == attempt.claimed_ms + s.lease_ms as i64
        && attempt.lease_end_ms() == grant.lease_expires_ms;
    ensure(shape, || {
        format!("the claimed attempt reads {attempt:?}, not {expected_id} of the claim, current, with lease = claimed_ms + {} ms", s.lease_ms)
    })?;
    head(s, &s.control, "/v1/jobs", Some(&s.operator_token)).await?;
    head(s, &s.control, &format!("/v1/jobs/{}", ids[0]), Some(&s.operator_token)).await?;
    Ok(format!(
        "GET /v1/jobs lists {} jobs in submission order with empty attempts and ledger; GET /v1/jobs/{{id}} shows {expected_id} (fence {}, lease = claimed_ms + {} ms); HEAD answers both",
        ids.len(),
        attempt.fence,
        s.lease_ms
    ))
}

async fn claim(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 2).await?;
    let (r1, r2) = (&team.runners[0], &team.runners[1]);
    let (status, body) = r1.post("/v1/claim", &json!({"runner": r1.id, "observed_ms": now_ms()})).await?;
    ensure(status == 200 && body == json!({"grant": null}), || {
        format!("a claim with nothing queued answered {status} {body}, not 200 {{\"grant\": null}}")
    })?;
    let (j1, j2, j3) = (case.id("j1"), case.id("j2"), case.id("j3"));
    s.submit(&team.project, &j1, &case.id("k1"), 2).await?;
    s.submit(&team.project, &j2, &case.id("k1"), 2).await?;
    s.submit(&team.project, &j3, &case.id("k2"), 2).await?;
    let (status, body) = r1.post("/v1/claim", &json!({"runner": r1.id, "observed_ms": now_ms()})).await?;
    ensure(status == 200, || format!("a claim answered {status} {body}"))?;
    no_nulls(&body, "the claim answer")?;
    let first: ClaimResponse = serde_json::from_value(body.clone())
        .map_err(|error| Finding::Fail(format!("a claim answered {body}: {error}")))?;
    let first =
        first.grant.ok_or_else(|| Finding::Fail("r1's claim was granted nothing with three jobs queued".into()))?;
    let attempt = s.view(&j1).await?.attempts.first().cloned();
    let expected = Grant {
        claim: ClaimRef {
            job: j1.clone(),
            attempt: format!("{j1}-a1"),
            runner: r1.id.clone(),
            fence: first.claim.fence,
        },
        project: team.project.clone(),
        deployment_key: case.id("k1"),
        spec: JobSpec { steps: 2, step_ms: 0 },
        lease_ms: s.lease_ms,
        lease_expires_ms: attempt.as_ref().map_or(0, |attempt| attempt.claimed_ms + s.lease_ms as i64),
    };
    ensure(first == expected, || {
        format!("the first claim was granted {first:?}, not {expected:?} (the oldest job, its lease from the server's claim time)")
    })?;
    let second = r2.claim_some().await?;
    ensure(second.claim.job == j3, || {
        format!("r2 was granted {} while {j2}'s key was held by {j1}: the oldest claimable is {j3}", second.claim.job)
    })?;
    ensure(second.claim.fence > first.claim.fence, || {
        format!("the later claim has fence {}, not above {}", second.claim.fence, first.claim.fence)
    })?;
    let third = r2.claim().await?;
    ensure(third.is_none(), || format!("r2 was granted {third:?} although {j2}'s key is held"))?;
    Ok(format!(
        "200 {{\"grant\": null}} with nothing queued; the oldest job first ({}, fence {}, lease {} ms from the server's claim time); {j2} skipped while its key is held; {} granted fence {}",
        first.claim.attempt, first.claim.fence, s.lease_ms, second.claim.attempt, second.claim.fence
    ))
}

/// Keys a verdict may have.
fn verdict_shape(body: &Value, what: &str) -> Result<(), Finding> {
    no_nulls(body, what)?;
    let allowed = ["capability", "decision", "lease_expires_ms", "ledger_seq", "reason"];
    let extra: Vec<String> = keys(body).into_iter().filter(|key| !allowed.contains(&key.as_str())).collect();
    ensure(extra.is_empty(), || format!("{what} has fields {extra:?} a verdict has not: {body}"))
}

async fn heartbeat(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    tries(|number| {
        let (case, team) = (&case, &team);
        async move {
            let job = case.id(&format!("j{number}"));
            s.submit(&team.project, &job, &case.id(&format!("k{number}")), 1).await?;
            let grant = runner.claim_some().await?;
            let (status, body) = runner.post("/v1/heartbeat", &report_body(&grant.claim, now_ms())).await?;
            verdict_shape(&body, "a heartbeat verdict")?;
            let accepted: Ruling = serde_json::from_value(body.clone())
                .map_err(|error| Finding::Fail(format!("a heartbeat answered {status} {body}: {error}")))?;
            if accepted.decision == Decision::Rejected && accepted.reason == Some(Reason::Expired) {
                return Ok(Try::Late(format!("{job}'s first heartbeat was refused as expired")));
            }
            let lease = accepted.lease_expires_ms.unwrap_or(0);
            ensure(status == 200 && accepted.decision == Decision::Accepted && accepted.reason.is_none() && lease >= grant.lease_expires_ms, || {
                format!("a heartbeat on a live claim answered {status} {body}, not 200 accepted with a lease at or after {}", grant.lease_expires_ms)
            })?;
            if s.provides.ledger {
                let entry = s.entry(&job, accepted.ledger_seq).await?;
                ensure(entry.kind == Op::Heartbeat && lease == entry.received_ms + s.lease_ms as i64, || {
                    format!("the accepted heartbeat (ledger {}) received at {} set the lease to {lease}, not receipt + {} ms", entry.seq, entry.received_ms, s.lease_ms)
                })?;
            }
            let view = s.view(&job).await?;
            let now_lease = view.attempts.first().map_or(0, |attempt| attempt.lease_end_ms());
            ensure(now_lease == lease, || format!("the attempt's lease reads {now_lease} after a heartbeat answered {lease}"))?;
            let mut unknown = grant.claim.clone();
            unknown.attempt = format!("{job}-a9");
            let (status, body) = runner.post("/v1/heartbeat", &report_body(&unknown, now_ms())).await?;
            verdict_shape(&body, "a refused heartbeat's verdict")?;
            let refused: Option<Ruling> = serde_json::from_value(body.clone()).ok();
            let expected = refused.as_ref().is_some_and(|r| r.decision == Decision::Rejected && r.reason == Some(Reason::Unknown) && r.ledger_seq > 0);
            ensure(status == 409 && expected, || format!("a heartbeat naming attempt {} that does not exist answered {status} {body}, not 409 rejected `unknown`", unknown.attempt))?;
            Ok(Try::Done(format!(
                "200 accepted with the new lease {lease} (receipt + {} ms, ledger {}); 409 rejected `unknown` for an attempt that does not exist",
                s.lease_ms, accepted.ledger_seq
            )))
        }
    })
    .await
}

async fn capability(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    tries(|number| {
        let (case, team) = (&case, &team);
        async move {
            let (job, key) = (case.id(&format!("j{number}")), case.id(&format!("k{number}")));
            s.submit(&team.project, &job, &key, 1).await?;
            let grant = runner.claim_some().await?;
            let (status, body) = runner.post("/v1/capability", &report_body(&grant.claim, now_ms())).await?;
            verdict_shape(&body, "a capability verdict")?;
            let granted: Ruling = serde_json::from_value(body.clone()).map_err(|error| Finding::Fail(format!("a capability answered {status} {body}: {error}")))?;
            if granted.decision == Decision::Rejected && granted.reason == Some(Reason::Expired) {
                return Ok(Try::Late(format!("{job}'s capability was refused as expired")));
            }
            let token = granted.capability.clone().ok_or_else(|| Finding::Fail(format!("a capability for a live claim answered {status} {body}, with no capability")))?;
            let claim = &grant.claim;
            let fields = (token.deployment_key.as_str(), token.job.as_str(), token.attempt.as_str(), token.runner.as_str(), token.fence);
            let signed = token.signature.len() == 64 && token.signature.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            ensure(status == 200 && granted.decision == Decision::Accepted && fields == (key.as_str(), claim.job.as_str(), claim.attempt.as_str(), claim.runner.as_str(), claim.fence) && signed, || {
                format!("a capability for a live claim answered {status} {body}, not 200 accepted with the claim's key, job, attempt, runner, fence and a 64-hex signature")
            })?;
            ensure(granted.lease_expires_ms == Some(grant.lease_expires_ms), || {
                format!("the capability's verdict says the lease ends at {:?}, not at the attempt's {}", granted.lease_expires_ms, grant.lease_expires_ms)
            })?;
            ensure(token.expires_ms <= grant.lease_expires_ms, || {
                format!("the capability expires at {}, after the lease it was granted under ends ({}): it would let a runner that lost its authority mutate the target", token.expires_ms, grant.lease_expires_ms)
            })?;
            let view = s.view(&job).await?;
            let lease = view.attempts.first().map_or(0, |attempt| attempt.lease_end_ms());
            ensure(lease == grant.lease_expires_ms, || format!("the attempt's lease moved from {} to {lease} on a capability: a capability renews nothing", grant.lease_expires_ms))?;
            let mut other = claim.clone();
            other.fence += 1_000_000;
            let (status, body) = runner.post("/v1/capability", &report_body(&other, now_ms())).await?;
            let refused: Option<Ruling> = serde_json::from_value(body.clone()).ok();
            let expected = refused.is_some_and(|r| r.decision == Decision::Rejected && r.reason == Some(Reason::NotCurrent) && r.capability.is_none());
            ensure(status == 409 && expected, || format!("a capability naming another fence answered {status} {body}, not 409 rejected `not_current`"))?;
            Ok(Try::Done(format!(
                "200 accepted with a capability of the claim (fence {}, expires {}), the lease untouched at {}; 409 rejected `not_current` for another fence",
                token.fence, token.expires_ms, grant.lease_expires_ms
            )))
        }
    })
    .await
}

async fn result(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 2).await?;
    let (r1, r2) = (&team.runners[0], &team.runners[1]);
    tries(|number| {
        let (case, team) = (&case, &team);
        async move {
            let key = case.id(&format!("k{number}"));
            let (first, second) = (case.id(&format!("j{number}a")), case.id(&format!("j{number}b")));
            s.submit(&team.project, &first, &key, 1).await?;
            s.submit(&team.project, &second, &key, 1).await?;
            let grant = r1.claim_some().await?;
            let (status, body) = r1.post("/v1/result", &result_body(&grant.claim, Outcome::Succeeded, now_ms())).await?;
            verdict_shape(&body, "a result verdict")?;
            let verdict: Ruling = serde_json::from_value(body.clone()).map_err(|error| Finding::Fail(format!("a result answered {status} {body}: {error}")))?;
            if verdict.decision == Decision::Rejected && verdict.reason == Some(Reason::Expired) {
                return Ok(Try::Late(format!("{first}'s result was refused as expired")));
            }
            let plain = verdict.lease_expires_ms.is_none() && verdict.capability.is_none() && verdict.reason.is_none();
            ensure(status == 200 && verdict.decision == Decision::Accepted && plain, || format!("a result of a live claim answered {status} {body}, not 200 accepted"))?;
            let view = s.view(&first).await?;
            let attempt = view.attempts.first();
            let closed = attempt.is_some_and(|a| a.state == AttemptState::Succeeded && a.closed_by == Some(ClosedBy::Result) && a.current);
            ensure(view.state == JobState::Succeeded && view.outcome == Some(Outcome::Succeeded) && closed, || {
                format!("after an accepted success job {first} reads {:?} (outcome {:?}), attempt {attempt:?}", view.state, view.outcome)
            })?;
            let after = r1.heartbeat(&grant.claim, now_ms()).await?;
            ensure(after.decision == Decision::Rejected && after.reason == Some(Reason::NotCurrent), || {
                format!("a heartbeat after {}'s result committed was {}, not rejected (not_current)", grant.claim.attempt, said(&after))
            })?;
            let next = r2.claim_some().await.map_err(|_| Finding::Fail(format!("{second} was not granted after {first} succeeded: the result releases the key")))?;
            ensure(next.claim.job == second, || format!("r2 was granted {} instead of {second}", next.claim.job))?;
            let (status, body) = r2.post("/v1/result", &result_body(&next.claim, Outcome::Failed, now_ms())).await?;
            let failed: Option<Ruling> = serde_json::from_value(body.clone()).ok();
            if failed.as_ref().is_some_and(|r| r.reason == Some(Reason::Expired)) {
                return Ok(Try::Late(format!("{second}'s result was refused as expired")));
            }
            ensure(status == 200 && failed.is_some_and(|r| r.decision == Decision::Accepted), || format!("a failure of a live claim answered {status} {body}, not 200 accepted"))?;
            let view = s.view(&second).await?;
            ensure(view.state == JobState::Failed && view.outcome == Some(Outcome::Failed), || {
                format!("after an accepted failure job {second} reads {:?} (outcome {:?})", view.state, view.outcome)
            })?;
            Ok(Try::Done(format!(
                "200 accepted: {first} succeeded (attempt closed by result; a later heartbeat 409 `not_current`) and its key was released to {second}, whose failure made it failed"
            )))
        }
    })
    .await
}

/// Reconciles as the operator; the status and the JSON answered.
async fn reconcile_raw(s: &Session, body: Value, attempt: &str) -> Result<(u16, Value), Finding> {
    let request: ReconcileRequest =
        serde_json::from_value(body.clone()).map_err(|error| Finding::Fail(format!("{body}: {error}")))?;
    match s.reconcile(&request).await {
        Ok(view) => Ok((200, serde_json::to_value(view).unwrap_or_default())),
        Err(ClientError::Refused(error)) => Ok((error.status, json!({"code": error.code}))),
        Err(error) => Err(Finding::Fail(format!("reconcile of {attempt}: {error}"))),
    }
}

async fn reconcile(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let jobs: Vec<String> = ["stopped", "completed", "running"].iter().map(|name| case.id(name)).collect();
    for job in &jobs {
        s.submit(&team.project, job, &format!("{job}.key"), 1).await?;
    }
    let mut fences = Vec::new();
    for _ in &jobs {
        fences.push(runner.claim_some().await?.claim.fence);
    }
    for job in &jobs {
        let view = s.wait_lapsed(job).await?;
        ensure(view.state == JobState::Uncertain, || {
            format!("job {job} became {:?} when its lease lapsed, not uncertain", view.state)
        })?;
    }
    let attempt = |job: &String| format!("{job}-a1");
    let (status, body) = reconcile_raw(
        s,
        json!({"job": jobs[0], "attempt": attempt(&jobs[0]), "finding": "stopped", "evidence": "conform: stopped"}),
        &attempt(&jobs[0]),
    )
    .await?;
    let view: Option<JobView> = serde_json::from_value(body.clone()).ok();
    let stopped = view.as_ref().is_some_and(|view| {
        view.state == JobState::Queued
            && view.current_attempt.as_deref() == Some(attempt(&jobs[0]).as_str())
            && view
                .attempts
                .first()
                .is_some_and(|a| a.state == AttemptState::Failed && a.closed_by == Some(ClosedBy::ObservedStopped))
    });
    ensure(status == 200 && stopped, || {
        format!("reconcile `stopped` answered {status} {body}, not 200 with the job queued and its attempt failed, closed by observed-stopped")
    })?;
    let body = json!({"job": jobs[1], "attempt": attempt(&jobs[1]), "finding": "completed", "outcome": "succeeded"});
    let (status, body) = reconcile_raw(s, body, &attempt(&jobs[1])).await?;
    let view: Option<JobView> = serde_json::from_value(body.clone()).ok();
    let completed = view.as_ref().is_some_and(|view| {
        view.state == JobState::Succeeded
            && view.outcome == Some(Outcome::Succeeded)
            && view.attempts.first().is_some_and(|a| {
                a.state == AttemptState::Succeeded && a.closed_by == Some(ClosedBy::ReconciledCompleted)
            })
    });
    ensure(status == 200 && completed, || {
        format!("reconcile `completed` answered {status} {body}, not 200 with the job succeeded, closed by reconciled-completed")
    })?;
    let (status, body) = reconcile_raw(
        s,
        json!({"job": jobs[2], "attempt": attempt(&jobs[2]), "finding": "still-running"}),
        &attempt(&jobs[2]),
    )
    .await?;
    let view: Option<JobView> = serde_json::from_value(body.clone()).ok();
    let still = view.as_ref().is_some_and(|view| {
        view.state == JobState::Uncertain
            && view.attempts.first().is_some_and(|a| a.state == AttemptState::Uncertain && a.closed_by.is_none())
    });
    ensure(status == 200 && still, || {
        format!("reconcile `still-running` answered {status} {body}, not 200 with the job and its attempt uncertain")
    })?;
    let blocked = case.id("behind-running");
    s.submit(&team.project, &blocked, &format!("{}.key", jobs[2]), 1).await?;
    let again = runner.claim_some().await?;
    let fence_max = fences.iter().copied().max().unwrap_or(0);
    ensure(again.claim.attempt == format!("{}-a2", jobs[0]) && again.claim.fence > fence_max, || {
        format!(
            "after `stopped` the next claim was granted {} (fence {}), not {}-a2 above fence {fence_max}",
            again.claim.attempt, again.claim.fence, jobs[0]
        )
    })?;
    let none = runner.claim().await?;
    ensure(none.is_none(), || format!("{blocked} was granted ({none:?}) while `still-running` holds its key"))?;
    Ok(format!(
        "200 JobView for each finding: `stopped` requeued {} (then claimed as -a2, fence {}), `completed` made {} succeeded, `still-running` kept {} uncertain and its key held",
        jobs[0], again.claim.fence, jobs[1], jobs[2]
    ))
}

async fn ledger(s: &Session, case: Case) -> CaseOutcome {
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let job = case.id("j1");
    s.submit(&team.project, &job, &case.id("k1"), 1).await?;
    let grant = runner.claim_some().await?;
    runner.heartbeat(&grant.claim, now_ms()).await?;
    runner.result(&grant.claim, Outcome::Succeeded, now_ms()).await?;
    let token = Some(s.operator_token.as_str());
    let page = s.get(&s.control, "/v1/ledger?after=0&limit=10000", token).await?;
    let body = page.json().unwrap_or_default();
    no_nulls(&body, "GET /v1/ledger")?;
    let entries: Vec<LedgerEntry> = serde_json::from_value(body)
        .map_err(|error| Finding::Fail(format!("GET /v1/ledger is not a list of entries: {error}")))?;
    let gapless = entries.iter().enumerate().all(|(index, entry)| entry.seq == index as u64 + 1);
    ensure(page.status == 200 && gapless && !entries.is_empty(), || {
        format!("GET /v1/ledger answered {} with sequence numbers not 1, 2, 3, …", page.status)
    })?;
    let view = s.view(&job).await?;
    let ours: Vec<&LedgerEntry> = entries.iter().filter(|entry| entry.job == job).collect();
    let viewed: Vec<&LedgerEntry> = view.ledger.iter().filter(|entry| entry.seq <= entries.len() as u64).collect();
    ensure(ours == viewed, || {
        format!(
            "GET /v1/jobs/{job} holds ledger entries {:?}, not the ledger's entries of the job in order {:?}",
            seqs(&viewed),
            seqs(&ours)
        )
    })?;
    let kinds: Vec<Op> = ours.iter().map(|entry| entry.kind).collect();
    ensure(kinds.starts_with(&[Op::Submit, Op::Claim]) && kinds.contains(&Op::Result), || {
        format!("job {job}'s ledger holds {kinds:?}: a submit, a claim, …, a result expected")
    })?;
    let first = ours[0].seq;
    let one = s.get(&s.control, &format!("/v1/ledger?after={}&limit=1", first - 1), token).await?;
    let one: Vec<LedgerEntry> = serde_json::from_value(one.json().unwrap_or_default()).unwrap_or_default();
    ensure(one.len() == 1 && one[0].seq == first, || {
        format!(
            "GET /v1/ledger?after={}&limit=1 answered {:?}, not entry {first} (`after` is exclusive)",
            first - 1,
            seqs(&one.iter().collect::<Vec<_>>())
        )
    })?;
    let clamped = s.get(&s.control, &format!("/v1/ledger?after={}&limit=0", first - 1), token).await?;
    let clamped: Vec<LedgerEntry> = serde_json::from_value(clamped.json().unwrap_or_default()).unwrap_or_default();
    ensure(clamped.len() == 1, || {
        format!("GET /v1/ledger?limit=0 answered {} entries, not 1 (the limit is clamped to 1..=10000)", clamped.len())
    })?;
    let beyond = s.get(&s.control, &format!("/v1/ledger?after={}", u64::MAX), token).await?;
    ensure(beyond.status == 200 && beyond.json() == Some(json!([])), || {
        format!("GET /v1/ledger?after=u64::MAX answered {} {}, not 200 []", beyond.status, beyond.text())
    })?;
    head(s, &s.control, "/v1/ledger", token).await?;
    Ok(format!(
        "GET /v1/ledger: seq 1..{} gapless, `after` exclusive, limit 0 clamped to 1, after=u64::MAX an empty page, HEAD 200; job {job}'s view holds its {} entries in order",
        entries.len(),
        ours.len()
    ))
}

fn seqs(entries: &[&LedgerEntry]) -> Vec<u64> {
    entries.iter().map(|entry| entry.seq).collect()
}

/// POSTs a step to `base`; the status and the record, or a failure.
pub async fn step(
    s: &Session,
    base: &str,
    capability: &Capability,
    step: u32,
    steps: u32,
) -> Result<(u16, StepRecord), Finding> {
    let body = json!({"capability": capability, "step": step, "steps": steps, "duration_ms": 0});
    let answer = s
        .send(&post(base, "/v1/steps", None, body))
        .await
        .map_err(|error| Finding::Fail(format!("POST /v1/steps: {error}")))?;
    let value = answer.json().unwrap_or_default();
    no_nulls(&value, "a step answer")?;
    let response: StepResponse = serde_json::from_value(value.clone()).map_err(|_| {
        Finding::Fail(format!(
            "POST /v1/steps answered {} {}, not {{\"record\": StepRecord}}",
            answer.status,
            answer.text()
        ))
    })?;
    ensure(keys(&value) == ["record"], || format!("POST /v1/steps answered {value}, not {{\"record\"}} alone"))?;
    Ok((answer.status, response.record))
}

/// Redeems a capability for a fresh claim of `job` on `key` (a try: late when the lease ended).
pub async fn fresh_capability(
    s: &Session,
    runner: &super::session::Runner,
    project: &str,
    job: &str,
    key: &str,
) -> Result<Try<(Grant, Capability)>, Finding> {
    s.submit(project, job, key, 2).await?;
    let grant = runner.claim_some().await?;
    let ruling = runner.capability(&grant.claim, now_ms()).await?;
    match ruling.capability {
        Some(capability) => Ok(Try::Done((grant, capability))),
        None if ruling.reason == Some(Reason::Expired) => {
            Ok(Try::Late(format!("{job}'s capability was refused as expired")))
        }
        None => Err(Finding::Fail(format!("a capability for a live claim of {job} was {}", said(&ruling)))),
    }
}

async fn target_steps(s: &Session, case: Case) -> CaseOutcome {
    let base = s.target.clone().ok_or_else(|| Finding::Skip("the system has no target".into()))?;
    let team = s.team(&case, 1).await?;
    let runner = &team.runners[0];
    let (grant, token) = tries(|number| {
        let (case, team) = (&case, &team);
        async move {
            fresh_capability(s, runner, &team.project, &case.id(&format!("j{number}")), &case.id(&format!("k{number}")))
                .await
        }
    })
    .await?;
    let key = grant.deployment_key.clone();
    let (status, first) = step(s, &base, &token, 0, 2).await?;
    let claim = &grant.claim;
    let expected = (
        key.as_str(),
        claim.job.as_str(),
        claim.attempt.as_str(),
        claim.runner.as_str(),
        claim.fence,
        0,
        2,
        true,
        None,
        1,
        0,
    );
    let got = (
        first.deployment_key.as_str(),
        first.job.as_str(),
        first.attempt.as_str(),
        first.runner.as_str(),
        first.fence,
        first.step,
        first.steps,
        first.applied,
        first.reason,
        first.revision,
        first.highest_fence_before,
    );
    ensure(status == 200 && got == expected, || {
        format!("the first step on a new key answered {status} {first:?}, not 200 applied at revision 1")
    })?;
    let (status, second) = step(s, &base, &token, 1, 2).await?;
    ensure(
        status == 200
            && second.applied
            && second.revision == 2
            && second.highest_fence_before == claim.fence
            && second.seq > first.seq,
        || {
            format!("the second step answered {status} {second:?}, not 200 applied at revision 2 with the highest fence before {}", claim.fence)
        },
    )?;
    let deployment = s.get(&base, &format!("/v1/deployments/{key}"), None).await?;
    ensure(
        deployment.status == 200
            && deployment.json() == Some(json!({"key": key, "revision": 2, "highest_fence": claim.fence})),
        || {
            format!(
                "GET /v1/deployments/{key} answered {} {}, not {{key, revision 2, highest_fence {}}}",
                deployment.status,
                deployment.text(),
                claim.fence
            )
        },
    )?;
    let read = s.get(&base, &format!("/v1/steps?after={}&limit=2", first.seq), None).await?;
    let records: Vec<StepRecord> = serde_json::from_value(read.json().unwrap_or_default()).unwrap_or_default();
    ensure(read.status == 200 && records.first() == Some(&first) && records.len() <= 2, || {
        format!("GET /v1/steps?after={}&limit=2 answered {} {:?}, not the records from seq {} (`after` counts records skipped)", first.seq, read.status, records.iter().map(|r| r.seq).collect::<Vec<_>>(), first.seq)
    })?;
    let clamped = s.get(&base, &format!("/v1/steps?after={}&limit=0", first.seq), None).await?;
    let clamped: Vec<StepRecord> = serde_json::from_value(clamped.json().unwrap_or_default()).unwrap_or_default();
    ensure(clamped.len() == 1, || {
        format!("GET /v1/steps?limit=0 answered {} records, not 1 (the limit is clamped to 1..=100000)", clamped.len())
    })?;
    let beyond = s.get(&base, &format!("/v1/steps?after={}", u64::MAX), None).await?;
    ensure(beyond.status == 200 && beyond.json() == Some(json!([])), || {
        format!("GET /v1/steps?after=u64::MAX answered {} {}, not []", beyond.status, beyond.text())
    })?;
    head(s, &base, "/v1/steps", None).await?;
    head(s, &base, &format!("/v1/deployments/{key}"), None).await?;
    Ok(format!(
        "POST /v1/steps applied steps 0 and 1 of {} (revisions 1, 2); GET /v1/deployments/{key} and GET /v1/steps (after = records skipped) read them back; HEAD answers",
        claim.attempt
    ))
}
