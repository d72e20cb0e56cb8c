//! The target's fence rule per mode (`docs/protocol.md`, the target): fenced refuses a lower
//! fence once a higher one was applied and takes an equal one; idempotent refuses a repeated
//! `(job, step)` and compares no fence; both refuse an expired capability; unfenced applies
//! everything. Each mode runs on a
//! target of its own, started for the session, so these cases need a system whose target
//! command takes `{target_mode}`.

use history::Reason;
use protocol::*;

use super::case::{ensure, Case, CaseOutcome, Def, Finding};
use super::endpoints::{fresh_capability, step};
use super::session::{now_ms, tries, Session, Try};
use system::Feature;

pub fn defs() -> Vec<Def> {
    let needs = &[Feature::Target, Feature::Capabilities];
    vec![
        Def { name: "target/fenced", needs, run: |s, c| Box::pin(fenced(s, c)) },
        Def { name: "target/idempotent", needs, run: |s, c| Box::pin(idempotent(s, c)) },
        Def { name: "target/unfenced", needs, run: |s, c| Box::pin(unfenced(s, c)) },
    ]
}

/// Two capabilities for one deployment key: `low` from an attempt that committed its result
/// first, `high` (a higher fence) from the next job's attempt on the same key.
struct Pair {
    key: String,
    low: Capability,
    high: Capability,
}

/// Two capabilities on one key from claims of two runners, the lower fence's job done
/// first (a target must compare fences per key, whoever presents them); then step 0 of
/// `high`, which must be applied, and step 0 of `low`, which must be `low_reason` (`None`:
/// applied). A try in which either capability expired on the way to the target (its expiry
/// has passed on this machine's clock too) is late, and another pair is tried.
async fn pair(
    s: &Session,
    case: &Case,
    base: &str,
    low_reason: Option<Reason>,
    what_low: &str,
) -> Result<(Pair, StepRecord), Finding> {
    let team = s.team(case, 2).await?;
    let (runner, other) = (&team.runners[0], &team.runners[1]);
    tries(|n| {
        let team = &team;
        async move {
            let key = case.id(&format!("k{n}"));
            let (low_grant, low) =
                match fresh_capability(s, runner, &team.project, &case.id(&format!("low{n}")), &key).await? {
                    Try::Done(both) => both,
                    Try::Late(why) => return Ok(Try::Late(why)),
                };
            let done = runner.result(&low_grant.claim, Outcome::Succeeded, now_ms()).await?;
            if done.decision != history::Decision::Accepted {
                return Ok(Try::Late(format!(
                    "{}'s result was {:?}, so the key stays held",
                    low_grant.claim.attempt, done.reason
                )));
            }
            let (_, high) = match fresh_capability(s, other, &team.project, &case.id(&format!("high{n}")), &key).await?
            {
                Try::Done(both) => both,
                Try::Late(why) => return Ok(Try::Late(why)),
            };
            ensure(high.fence > low.fence, || {
                format!("the later claim on {key} has fence {}, not above {}", high.fence, low.fence)
            })?;
            if let Try::Late(why) = posted(s, base, &high, 0, None, "the higher fence first").await? {
                return Ok(Try::Late(why));
            }
            let record = match posted(s, base, &low, 0, low_reason, what_low).await? {
                Try::Done(record) => record,
                Try::Late(why) => return Ok(Try::Late(why)),
            };
            Ok(Try::Done((Pair { key, low, high }, record)))
        }
    })
    .await
}

/// The target in `mode`, or a skip naming why there is none.
fn target(s: &Session, mode: &str) -> Result<String, Finding> {
    s.target_in(mode).ok_or_else(|| {
        Finding::Skip(format!(
            "the system's target mode cannot be chosen (its command has no `{{target_mode}}`), so no target runs in `{mode}` mode"
        ))
    })
}

/// `capability` with its fence changed and its signature kept: a forgery.
fn forged(capability: &Capability) -> Capability {
    Capability { fence: capability.fence + 1_000, ..capability.clone() }
}

/// Posts step `index` with `capability`; it must be applied (`None`) or refused with `reason`.
async fn expect(
    s: &Session,
    base: &str,
    capability: &Capability,
    index: u32,
    reason: Option<Reason>,
    what: &str,
) -> Result<StepRecord, Finding> {
    let (status, record) = step(s, base, capability, index, 4).await?;
    judged(capability, index, status, record, reason, what)
}

/// As [`expect`], except that an `expired` refusal of a capability whose expiry has passed
/// on this machine's clock too, where another answer was expected, is late: the step took
/// longer than the lease, which says nothing of the target.
async fn posted(
    s: &Session,
    base: &str,
    capability: &Capability,
    index: u32,
    reason: Option<Reason>,
    what: &str,
) -> Result<Try<StepRecord>, Finding> {
    let (status, record) = step(s, base, capability, index, 4).await?;
    let expired = status == 409 && !record.applied && record.reason == Some(Reason::Expired);
    if expired && reason != Some(Reason::Expired) && now_ms() >= capability.expires_ms {
        return Ok(Try::Late(format!(
            "{}'s capability (fence {}) expired before step {index} reached the target",
            capability.attempt, capability.fence
        )));
    }
    judged(capability, index, status, record, reason, what).map(Try::Done)
}

/// Whether a step's answer is the one expected: applied (`None`) or refused with `reason`.
fn judged(
    capability: &Capability,
    index: u32,
    status: u16,
    record: StepRecord,
    reason: Option<Reason>,
    what: &str,
) -> Result<StepRecord, Finding> {
    let holds = match reason {
        None => status == 200 && record.applied && record.reason.is_none(),
        Some(reason) => status == 409 && !record.applied && record.reason == Some(reason),
    };
    ensure(holds, || {
        let want = reason.map_or("200 applied".to_string(), |reason| format!("409 refused ({reason})"));
        format!(
            "{what}: step {index} (fence {}) answered {status} applied={} reason={:?}, not {want}",
            capability.fence, record.applied, record.reason
        )
    })?;
    Ok(record)
}

/// How long after its expiry an expired capability is shown to the target.
const PAST_EXPIRY_MS: i64 = 2;

/// Longest wait for a capability to expire before the target is shown it (it expires with
/// its attempt's lease).
const EXPIRY_WAIT_MAX_MS: i64 = 10_000;

/// Waits for `capability` to expire, then posts step `index` with it: refused `expired`.
/// Sent [`PAST_EXPIRY_MS`] after the expiry on the wall clock the target shares, so that it
/// lands in the expiry's own second nearly always: a target that judged expiry in whole
/// seconds would take it. A capability that lives longer than [`EXPIRY_WAIT_MAX_MS`] is
/// not waited for (say so).
async fn expired(s: &Session, base: &str, capability: &Capability, index: u32) -> Result<String, Finding> {
    let wait_ms = capability.expires_ms + PAST_EXPIRY_MS - now_ms();
    if wait_ms > EXPIRY_WAIT_MAX_MS {
        return Ok(format!("the capability lives {wait_ms} ms more: its expiry was not tried"));
    }
    protocol::clock::sleep_until_wall_ms(capability.expires_ms + PAST_EXPIRY_MS).await;
    expect(s, base, capability, index, Some(Reason::Expired), "a capability past its expiry").await?;
    Ok("an expired capability refused (expired)".to_string())
}

async fn deployment(s: &Session, base: &str, key: &str) -> Result<(u64, u64), Finding> {
    let answer = s.get(base, &format!("/v1/deployments/{key}"), None).await?;
    let body = answer.json().unwrap_or_default();
    Ok((body["revision"].as_u64().unwrap_or(0), body["highest_fence"].as_u64().unwrap_or(0)))
}

async fn fenced(s: &Session, case: Case) -> CaseOutcome {
    let base = target(s, "fenced")?;
    let (Pair { key, low, high }, stale) =
        pair(s, &case, &base, Some(Reason::StaleFence), "a lower fence after a higher one").await?;
    ensure(stale.highest_fence_before == high.fence && stale.revision == 1, || {
        format!(
            "the stale step's record says highest fence {} and revision {}, not {} and 1",
            stale.highest_fence_before, stale.revision, high.fence
        )
    })?;
    expect(s, &base, &high, 1, None, "an equal fence (the attempt's own next step)").await?;
    expect(s, &base, &forged(&high), 2, Some(Reason::BadSignature), "a capability whose fence was changed").await?;
    let expiry = expired(s, &base, &high, 3).await?;
    let (revision, highest) = deployment(s, &base, &key).await?;
    ensure((revision, highest) == (2, high.fence), || {
        format!(
            "deployment {key} reads revision {revision}, highest fence {highest}; two steps of fence {} were applied",
            high.fence
        )
    })?;
    Ok(format!(
        "fenced: fence {} applied; fence {} then refused (stale_fence); fence {} again applied; a forged capability refused (bad_signature); {expiry}; {key} at revision 2",
        high.fence, low.fence, high.fence
    ))
}

async fn idempotent(s: &Session, case: Case) -> CaseOutcome {
    let base = target(s, "idempotent")?;
    let (Pair { key, low, high }, _) =
        pair(s, &case, &base, None, "a lower fence of another job (fences are not compared)").await?;
    expect(s, &base, &high, 0, Some(Reason::Duplicate), "the same job's step again").await?;
    expect(s, &base, &forged(&high), 1, Some(Reason::BadSignature), "a capability whose fence was changed").await?;
    let expiry = expired(s, &base, &high, 2).await?;
    let (revision, _) = deployment(s, &base, &key).await?;
    ensure(revision == 2, || format!("deployment {key} reads revision {revision}; two steps were applied"))?;
    Ok(format!(
        "idempotent: step 0 of fence {} and of fence {} applied; step 0 of fence {} again refused (duplicate); a forged capability refused (bad_signature); {expiry}",
        high.fence, low.fence, high.fence
    ))
}

async fn unfenced(s: &Session, case: Case) -> CaseOutcome {
    let base = target(s, "unfenced")?;
    let (Pair { key, low, high }, _) = pair(s, &case, &base, None, "a lower fence").await?;
    expect(s, &base, &high, 0, None, "a repeated step").await?;
    expect(s, &base, &forged(&high), 1, None, "a forged capability").await?;
    let (revision, _) = deployment(s, &base, &key).await?;
    ensure(revision == 4, || format!("deployment {key} reads revision {revision}; four steps were applied"))?;
    Ok(format!(
        "unfenced: every step applied (fences {} and {}, a repeat, a forgery); {key} at revision 4",
        high.fence, low.fence
    ))
}
