#!/usr/bin/env python3
"""The control plane of the Python lab: projects, runners, jobs, attempts, leases, ledger.

HTTP/JSON over a SQLite file. Every rule (claim, heartbeat, capability, result, expiry,
reconcile) is one ``BEGIN IMMEDIATE`` transaction that first expires lapsed leases with the
request's own receipt time, then decides. Acceptance of a report is one conditional UPDATE
whose WHERE clause names the job, project, attempt, runner, fence, the job's current
attempt, the state and the lease; zero rows updated is a refusal, never a retry.

Leases are judged on this server's clock only. The runner's ``observed_ms`` is stored in
the ledger and nothing else (unless the planted bug ``trust-runner-clock`` is on).

    python3 control_plane.py --listen 127.0.0.1:7400 --db control.sqlite \\
        --operator-token op-secret --secret cap-secret --lease-ms 2000
"""

from __future__ import annotations

import argparse
import hmac
import os
import queue
import secrets
import sqlite3
import sys
import threading

from common import (
    ArgParser,
    I64, I64_MAX, STR, U32, U32_MAX, U64, U64_MAX, ApiError, JsonHandler, Route, check_shape,
    bugs_from_env, decode_path_segment, is_id, mono_ns, parse_query, serve, sign_capability, wall_ms,
)

BUGS = {
    "accept-stale-result": "result acceptance no longer checks that the attempt is current, "
                           "running and unexpired (job, attempt, runner, fence still checked)",
    "trust-runner-clock": "lease validity of reports is judged on the runner's observed_ms "
                          "instead of this server's clock (an uncertain attempt whose lease "
                          "the runner's clock says is live is taken as running)",
}

OUTCOMES = frozenset({"succeeded", "failed"})
FINDINGS = frozenset({"stopped", "completed", "still-running"})

# Request shapes: {field: (kind, required)}
CREATE_PROJECT = {"id": (STR, True)}
REGISTER_RUNNER = {"project": (STR, False), "id": (STR, True)}
SUBMIT_JOB = {
    "project": (STR, True), "id": (STR, False), "deployment_key": (STR, True),
    "spec": ({"steps": (U32, True), "step_ms": (U64, True)}, True),
}
CLAIM = {"runner": (STR, True), "observed_ms": (I64, True)}
REPORT = {"job": (STR, True), "attempt": (STR, True), "runner": (STR, True),
          "fence": (U64, True), "observed_ms": (I64, True)}
RESULT = dict(REPORT, outcome=(OUTCOMES, True), detail=(STR, False))
RECONCILE = {"job": (STR, True), "attempt": (STR, True), "finding": (FINDINGS, True),
             "outcome": (OUTCOMES, False), "evidence": (STR, False)}

SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS projects (
    id TEXT PRIMARY KEY, registration_token TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS runners (
    id TEXT PRIMARY KEY, project TEXT NOT NULL REFERENCES projects(id),
    token TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, ord INTEGER NOT NULL UNIQUE, project TEXT NOT NULL,
    deployment_key TEXT NOT NULL, steps INTEGER NOT NULL, step_ms INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued','running','uncertain','succeeded','failed')),
    current_attempt TEXT, outcome TEXT CHECK (outcome IN ('succeeded','failed')),
    attempt_count INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, project, ord);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs(deployment_key, state);
CREATE TABLE IF NOT EXISTS attempts (
    id TEXT PRIMARY KEY, job TEXT NOT NULL REFERENCES jobs(id), project TEXT NOT NULL,
    runner TEXT NOT NULL, fence INTEGER NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('running','uncertain','succeeded','failed')),
    lease_expires_ms INTEGER NOT NULL, claimed_ms INTEGER NOT NULL,
    closed_by TEXT CHECK (closed_by IN ('result','observed-stopped','reconciled-completed')));
CREATE INDEX IF NOT EXISTS attempts_running ON attempts(state, lease_expires_ms);
CREATE INDEX IF NOT EXISTS attempts_job ON attempts(job, fence);
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, project TEXT NOT NULL, job TEXT NOT NULL,
    attempt TEXT, runner TEXT, fence INTEGER, deployment_key TEXT NOT NULL, decision TEXT,
    reason TEXT, recorded_as TEXT, outcome TEXT, received_ms INTEGER NOT NULL,
    observed_ms INTEGER, mono_ns INTEGER NOT NULL, lease_expires_ms INTEGER);
CREATE INDEX IF NOT EXISTS ledger_job ON ledger(job, seq);
"""

LEDGER_FIELDS = ("seq", "kind", "project", "job", "attempt", "runner", "fence",
                 "deployment_key", "decision", "reason", "recorded_as", "outcome",
                 "received_ms", "observed_ms", "mono_ns", "lease_expires_ms")


def forbidden(what: str) -> ApiError:
    return ApiError(403, "forbidden", f"this token may not {what}")


# ====================================================================== the store


class Store:
    """A small pool of SQLite connections to one file. ``tx()`` is a BEGIN IMMEDIATE
    transaction: SQLite admits one writer at a time, so every rule sees every earlier
    commit and nothing changes under it until it commits."""

    def __init__(self, path: str, size: int = 8):
        self.path = path
        conn = self._connect()
        conn.executescript(SCHEMA)
        conn.close()
        self.pool: queue.Queue = queue.Queue()
        for _ in range(size):
            self.pool.put(self._connect())

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    class _Tx:
        def __init__(self, store, immediate):
            self.store, self.immediate = store, immediate

        def __enter__(self):
            try:
                self.conn = self.store.pool.get(timeout=10)
            except queue.Empty:
                raise ApiError(500, "internal", "no free database connection within 10 s")
            try:
                self.conn.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
            except sqlite3.Error as err:
                self.store.pool.put(self.conn)
                raise ApiError(500, "internal", f"store: {err}")
            return self.conn

        def __exit__(self, exc_type, exc, tb):
            try:
                if exc_type is None:
                    self.conn.execute("COMMIT")
                else:
                    self.conn.execute("ROLLBACK")
            except sqlite3.Error as err:
                try:
                    self.conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                if exc_type is None:
                    raise ApiError(500, "internal", f"store: commit failed: {err}")
            finally:
                self.store.pool.put(self.conn)
            if isinstance(exc, sqlite3.Error):
                raise ApiError(500, "internal", f"store: {exc}") from exc
            return False

    def tx(self):
        return Store._Tx(self, True)

    def read(self):
        return Store._Tx(self, False)

    def close(self):
        while True:
            try:
                self.pool.get_nowait().close()
            except queue.Empty:
                return


# ====================================================================== the rules


class Rules:
    def __init__(self, store: Store, operator_token: str, secret: str, lease_ms: int,
                 capability_ttl_ms: int, bugs: set[str]):
        self.store = store
        self.operator_token = operator_token
        self.secret = secret
        self.lease_ms = lease_ms
        self.capability_ttl_ms = capability_ttl_ms
        self.bugs = bugs

    # -- tokens -------------------------------------------------------------------------

    def authenticate(self, header: str | None) -> dict:
        """Bearer token → {"kind": operator|runner|registration, ...}; else 401."""
        if header is None or not header.startswith("Bearer "):
            raise ApiError(401, "unauthorized", "an `Authorization: Bearer <token>` header is required")
        token = header[len("Bearer "):].rstrip(" \t")  # trailing whitespace is not the value
        if token == "":
            raise ApiError(401, "unauthorized", "the bearer token is empty")
        if hmac.compare_digest(token.encode("utf-8", "surrogateescape"),
                               self.operator_token.encode("utf-8")):
            return {"kind": "operator"}
        with self.store.read() as db:
            row = db.execute("SELECT id, project FROM runners WHERE token = ?", (token,)).fetchone()
            if row:
                return {"kind": "runner", "runner": row["id"], "project": row["project"]}
            row = db.execute("SELECT id FROM projects WHERE registration_token = ?",
                             (token,)).fetchone()
            if row:
                return {"kind": "registration", "project": row["id"]}
        raise ApiError(401, "unauthorized", "nobody holds this token")

    # -- ledger -------------------------------------------------------------------------

    @staticmethod
    def append(db, **entry) -> int:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM ledger").fetchone()[0]
        entry["seq"] = seq
        entry.setdefault("mono_ns", mono_ns())
        cols = [f for f in LEDGER_FIELDS if entry.get(f) is not None]
        db.execute(f"INSERT INTO ledger ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                   [entry[c] for c in cols])
        return seq

    @staticmethod
    def next_counter(db, name: str) -> int:
        db.execute("INSERT INTO counters (name, value) VALUES (?, 1) "
                   "ON CONFLICT(name) DO UPDATE SET value = value + 1", (name,))
        return db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()[0]

    # -- expiry ---------------------------------------------------------------------------

    def expire(self, db, now: int) -> int:
        """Every running attempt whose lease ended at or before ``now`` becomes uncertain,
        and its job too when it is the current attempt of a running job. Never requeued."""
        lapsed = db.execute(
            "SELECT a.id, a.job, a.runner, a.fence, a.lease_expires_ms, j.project, "
            "j.deployment_key FROM attempts a JOIN jobs j ON j.id = a.job "
            "WHERE a.state = 'running' AND a.lease_expires_ms <= ? ORDER BY a.fence", (now,)
        ).fetchall()
        for a in lapsed:
            db.execute("UPDATE attempts SET state = 'uncertain' WHERE id = ? AND state = 'running'",
                       (a["id"],))
            db.execute("UPDATE jobs SET state = 'uncertain' WHERE id = ? AND state = 'running' "
                       "AND current_attempt = ?", (a["job"], a["id"]))
            self.append(db, kind="expire", project=a["project"], job=a["job"], attempt=a["id"],
                        runner=a["runner"], fence=a["fence"], deployment_key=a["deployment_key"],
                        recorded_as="uncertain", received_ms=now,
                        lease_expires_ms=a["lease_expires_ms"])
        return len(lapsed)

    def sweep(self):
        with self.store.tx() as db:
            self.expire(db, wall_ms())

    # -- projects, runners, jobs ------------------------------------------------------------

    def create_project(self, who: dict, body) -> tuple[int, dict]:
        req = check_shape(body, CREATE_PROJECT)
        if who["kind"] != "operator":
            raise forbidden("create projects (operator only)")
        if not is_id(req["id"]):
            raise ApiError(400, "invalid_field", "`id` is not an id (1 to 128 of [A-Za-z0-9-_.:])")
        token = secrets.token_hex(24)
        with self.store.tx() as db:
            if db.execute("SELECT 1 FROM projects WHERE id = ?", (req["id"],)).fetchone():
                raise ApiError(409, "exists", f"project {req['id']} exists")
            db.execute("INSERT INTO projects (id, registration_token) VALUES (?, ?)",
                       (req["id"], token))
        return 201, {"id": req["id"], "registration_token": token}

    def register_runner(self, who: dict, body) -> tuple[int, dict]:
        req = check_shape(body, REGISTER_RUNNER)
        if not is_id(req["id"]):
            raise ApiError(400, "invalid_field", "`id` is not an id (1 to 128 of [A-Za-z0-9-_.:])")
        if who["kind"] == "operator":
            if "project" not in req:
                raise ApiError(400, "missing_field", "the operator must name the `project`")
            project = req["project"]
        elif who["kind"] == "registration":
            project = req.get("project", who["project"])
            if project != who["project"]:
                raise forbidden("register runners in another project")
        else:
            raise forbidden("register runners (operator or registration token only)")
        token = secrets.token_hex(24)
        with self.store.tx() as db:
            if not db.execute("SELECT 1 FROM projects WHERE id = ?", (project,)).fetchone():
                raise ApiError(404, "unknown_project", f"no project {project}")
            if db.execute("SELECT 1 FROM runners WHERE id = ?", (req["id"],)).fetchone():
                raise ApiError(409, "exists", f"runner {req['id']} exists")
            db.execute("INSERT INTO runners (id, project, token) VALUES (?, ?, ?)",
                       (req["id"], project, token))
        return 201, {"id": req["id"], "project": project, "token": token}

    def submit(self, who: dict, body) -> tuple[int, dict]:
        req = check_shape(body, SUBMIT_JOB)
        if who["kind"] != "operator":
            raise forbidden("submit jobs (operator only)")
        for field in ("project", "deployment_key", "id"):
            if field in req and not is_id(req[field]):
                raise ApiError(400, "invalid_field", f"`{field}` is not an id")
        spec = req["spec"]
        if not 1 <= spec["steps"] <= 1000:
            raise ApiError(400, "invalid_field", "`spec.steps` must be 1 ..= 1000")
        if not 0 <= spec["step_ms"] <= 600_000:
            raise ApiError(400, "invalid_field", "`spec.step_ms` must be 0 ..= 600000")
        now = wall_ms()
        with self.store.tx() as db:
            if not db.execute("SELECT 1 FROM projects WHERE id = ?", (req["project"],)).fetchone():
                raise ApiError(404, "unknown_project", f"no project {req['project']}")
            job_id = req.get("id")
            if job_id is None:
                # j<n> from a durable counter; skip numbers an explicit id already took
                while True:
                    job_id = f"j{self.next_counter(db, 'job_id')}"
                    if not db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                        break
            elif db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise ApiError(409, "exists", f"job {job_id} exists")
            ord_ = self.next_counter(db, "job_order")
            db.execute("INSERT INTO jobs (id, ord, project, deployment_key, steps, step_ms, state) "
                       "VALUES (?, ?, ?, ?, ?, ?, 'queued')",
                       (job_id, ord_, req["project"], req["deployment_key"], spec["steps"],
                        spec["step_ms"]))
            self.append(db, kind="submit", project=req["project"], job=job_id,
                        deployment_key=req["deployment_key"], received_ms=now)
        return 201, {"id": job_id}

    # -- claim ------------------------------------------------------------------------------

    def claim(self, who: dict, body) -> tuple[int, dict]:
        req = check_shape(body, CLAIM)
        runner = self._acting_runner(who, req["runner"])
        now = wall_ms()
        with self.store.tx() as db:
            self.expire(db, now)
            job = db.execute(
                "SELECT * FROM jobs j WHERE j.project = ? AND j.state = 'queued' AND NOT EXISTS ("
                " SELECT 1 FROM jobs h WHERE h.deployment_key = j.deployment_key"
                " AND h.state IN ('running','uncertain')) ORDER BY j.ord LIMIT 1",
                (who["project"],)).fetchone()
            if job is None:
                return 200, {"grant": None}
            fence = self.next_counter(db, "fence")
            n = job["attempt_count"] + 1
            attempt = f"{job['id']}-a{n}"
            lease = now + self.lease_ms
            db.execute("INSERT INTO attempts (id, job, project, runner, fence, state, "
                       "lease_expires_ms, claimed_ms) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                       (attempt, job["id"], job["project"], runner, fence, lease, now))
            db.execute("UPDATE jobs SET state = 'running', current_attempt = ?, attempt_count = ? "
                       "WHERE id = ? AND state = 'queued'", (attempt, n, job["id"]))
            self.append(db, kind="claim", project=job["project"], job=job["id"], attempt=attempt,
                        runner=runner, fence=fence, deployment_key=job["deployment_key"],
                        decision="accepted", received_ms=now, observed_ms=req["observed_ms"],
                        lease_expires_ms=lease)
        return 200, {"grant": {
            "claim": {"job": job["id"], "attempt": attempt, "runner": runner, "fence": fence},
            "project": job["project"], "deployment_key": job["deployment_key"],
            "spec": {"steps": job["steps"], "step_ms": job["step_ms"]},
            "lease_ms": self.lease_ms, "lease_expires_ms": lease}}

    def _acting_runner(self, who: dict, named: str) -> str:
        if who["kind"] != "runner":
            raise forbidden("act as a runner (runner token only)")
        if named != who["runner"]:
            raise ApiError(403, "runner_mismatch", "the body names another runner than the token's")
        return named

    # -- reports: heartbeat, capability, result --------------------------------------------------

    def _report_prelude(self, who: dict, body, shape):
        req = check_shape(body, shape)
        self._acting_runner(who, req["runner"])
        if req["fence"] > I64_MAX:
            raise ApiError(400, "invalid_field", "`fence` is above i64::MAX")
        return req

    def _job_of_report(self, db, who, req):
        job = db.execute("SELECT * FROM jobs WHERE id = ? AND project = ?",
                         (req["job"], who["project"])).fetchone()
        if job is None:
            raise ApiError(404, "unknown_job", f"no job {req['job']} in project {who['project']}")
        return job

    def _lease_now(self, now: int, req) -> int:
        """The instant leases are judged at: the receipt time (or, planted, the runner's)."""
        return req["observed_ms"] if "trust-runner-clock" in self.bugs else now

    def _guard(self) -> str:
        """The predicates every acceptance carries, as one WHERE clause."""
        state = "state = 'running'"
        if "trust-runner-clock" in self.bugs:  # planted: the runner's clock says it is live
            state = "state IN ('running','uncertain')"
        return (" WHERE id = :attempt AND job = :job AND project = :project AND runner = :runner"
                " AND fence = :fence"
                " AND id = (SELECT current_attempt FROM jobs WHERE id = :job)"
                f" AND {state} AND lease_expires_ms > :lease_now")

    def standing(self, db, who, req, now: int) -> str:
        """Why a claim does not stand: the first reason that holds, in the documented order."""
        a = db.execute("SELECT * FROM attempts WHERE id = ?", (req["attempt"],)).fetchone()
        if a is None:
            return "unknown"
        if (a["job"] != req["job"] or a["runner"] != req["runner"] or a["fence"] != req["fence"]
                or a["project"] != who["project"]):
            return "not_current"
        cur = db.execute("SELECT current_attempt FROM jobs WHERE id = ?", (a["job"],)).fetchone()
        if cur is None or cur["current_attempt"] != a["id"]:
            return "superseded"
        if a["state"] == "uncertain" or (a["state"] == "running" and a["lease_expires_ms"] <= now):
            return "expired"
        if a["state"] != "running":
            return "not_current"
        # Reached only when the guard judged the lease on another clock (the planted
        # trust-runner-clock): every documented condition holds on the server's clock.
        return "not_current"

    def _params(self, who, req, now):
        return {"attempt": req["attempt"], "job": req["job"], "project": who["project"],
                "runner": req["runner"], "fence": req["fence"], "now": now,
                "lease_now": self._lease_now(now, req), "lease_ms": self.lease_ms}

    def _report_entry(self, kind, who, job, req, now, **more):
        return dict(kind=kind, project=who["project"], job=req["job"], attempt=req["attempt"],
                    runner=req["runner"], fence=req["fence"],
                    deployment_key=job["deployment_key"], received_ms=now,
                    observed_ms=req["observed_ms"], **more)

    def heartbeat(self, who: dict, body) -> tuple[int, dict]:
        req = self._report_prelude(who, body, REPORT)
        now = wall_ms()
        with self.store.tx() as db:
            job = self._job_of_report(db, who, req)
            self.expire(db, now)
            p = self._params(who, req, now)
            updated = db.execute("UPDATE attempts SET state = 'running', "
                                 "lease_expires_ms = :now + :lease_ms" + self._guard(), p).rowcount
            if updated == 1:
                lease = now + self.lease_ms
                if "trust-runner-clock" in self.bugs:  # the job follows its revived attempt
                    db.execute("UPDATE jobs SET state = 'running' WHERE id = ? AND state = 'uncertain'",
                               (req["job"],))
                seq = self.append(db, **self._report_entry("heartbeat", who, job, req, now,
                                                           decision="accepted",
                                                           lease_expires_ms=lease))
                return 200, {"decision": "accepted", "ledger_seq": seq, "lease_expires_ms": lease}
            reason = self.standing(db, who, req, now)
            seq = self.append(db, **self._report_entry("heartbeat", who, job, req, now,
                                                       decision="rejected", reason=reason))
            return 409, {"decision": "rejected", "reason": reason, "ledger_seq": seq}

    def capability(self, who: dict, body) -> tuple[int, dict]:
        req = self._report_prelude(who, body, REPORT)
        now = wall_ms()
        with self.store.tx() as db:
            job = self._job_of_report(db, who, req)
            self.expire(db, now)
            p = self._params(who, req, now)
            # The same guard as a heartbeat, as an update that changes no value.
            updated = db.execute("UPDATE attempts SET state = state" + self._guard(), p).rowcount
            if updated == 1:
                lease = db.execute("SELECT lease_expires_ms FROM attempts WHERE id = ?",
                                   (req["attempt"],)).fetchone()[0]
                cap = {"deployment_key": job["deployment_key"], "job": req["job"],
                       "attempt": req["attempt"], "runner": req["runner"], "fence": req["fence"],
                       "expires_ms": min(now + self.capability_ttl_ms, lease)}
                cap["signature"] = sign_capability(self.secret, cap)
                seq = self.append(db, **self._report_entry("capability", who, job, req, now,
                                                           decision="accepted",
                                                           lease_expires_ms=lease))
                return 200, {"decision": "accepted", "ledger_seq": seq,
                             "lease_expires_ms": lease, "capability": cap}
            reason = self.standing(db, who, req, now)
            seq = self.append(db, **self._report_entry("capability", who, job, req, now,
                                                       decision="rejected", reason=reason))
            return 409, {"decision": "rejected", "reason": reason, "ledger_seq": seq}

    def result(self, who: dict, body) -> tuple[int, dict]:
        req = self._report_prelude(who, body, RESULT)
        outcome = req["outcome"]
        now = wall_ms()
        with self.store.tx() as db:
            job = self._job_of_report(db, who, req)
            self.expire(db, now)
            # 1. the attempt already committed a result: duplicate or conflict
            done = db.execute("SELECT state FROM attempts WHERE id = ? AND job = ? AND runner = ? "
                              "AND fence = ? AND closed_by = 'result'",
                              (req["attempt"], req["job"], req["runner"], req["fence"])).fetchone()
            if done is not None:
                if done["state"] == outcome:
                    seq = self.append(db, **self._report_entry("result", who, job, req, now,
                                                               decision="duplicate",
                                                               outcome=outcome))
                    return 200, {"decision": "duplicate", "ledger_seq": seq}
                seq = self.append(db, **self._report_entry("result", who, job, req, now,
                                                           decision="conflict", reason="conflict",
                                                           recorded_as="conflict",
                                                           outcome=outcome))
                return 409, {"decision": "conflict", "reason": "conflict", "ledger_seq": seq}
            # 2. one conditional update over every predicate of the heartbeat
            p = self._params(who, req, now)
            p["outcome"] = outcome
            guard = self._guard()
            if "accept-stale-result" in self.bugs:  # planted: currency, state, lease unchecked
                guard = (" WHERE id = :attempt AND job = :job AND project = :project"
                         " AND runner = :runner AND fence = :fence")
            updated = db.execute("UPDATE attempts SET state = :outcome, closed_by = 'result'"
                                 + guard, p).rowcount
            if updated == 1:
                db.execute("UPDATE jobs SET state = ?, outcome = ? WHERE id = ?",
                           (outcome, outcome, req["job"]))
                seq = self.append(db, **self._report_entry("result", who, job, req, now,
                                                           decision="accepted", outcome=outcome))
                return 200, {"decision": "accepted", "ledger_seq": seq}
            # 3. refused, and kept as a late observation
            reason = self.standing(db, who, req, now)
            seq = self.append(db, **self._report_entry("result", who, job, req, now,
                                                       decision="rejected", reason=reason,
                                                       recorded_as="late_observation",
                                                       outcome=outcome))
            return 409, {"decision": "rejected", "reason": reason, "ledger_seq": seq}

    # -- reconcile --------------------------------------------------------------------------------

    def reconcile(self, who: dict, body) -> tuple[int, dict]:
        req = check_shape(body, RECONCILE)
        if who["kind"] != "operator":
            raise forbidden("reconcile (operator only)")
        finding = req["finding"]
        if finding == "completed" and "outcome" not in req:
            raise ApiError(400, "missing_field", "`completed` needs an `outcome`")
        if finding != "completed" and "outcome" in req:
            raise ApiError(400, "invalid_field", f"`outcome` is not allowed with `{finding}`")
        now = wall_ms()
        with self.store.tx() as db:
            self.expire(db, now)
            job = db.execute("SELECT * FROM jobs WHERE id = ?", (req["job"],)).fetchone()
            if job is None:
                raise ApiError(404, "unknown_job", f"no job {req['job']}")
            a = db.execute("SELECT * FROM attempts WHERE id = ? AND job = ?",
                           (req["attempt"], req["job"])).fetchone()
            if a is None:
                raise ApiError(404, "unknown_attempt", f"no attempt {req['attempt']} of job {req['job']}")
            if job["current_attempt"] != a["id"] or a["state"] != "uncertain":
                raise ApiError(409, "not_uncertain",
                               f"{a['id']} is not the uncertain current attempt of {job['id']}")
            recorded_as = None
            if finding == "stopped":
                db.execute("UPDATE attempts SET state = 'failed', closed_by = 'observed-stopped' "
                           "WHERE id = ?", (a["id"],))
                db.execute("UPDATE jobs SET state = 'queued' WHERE id = ?", (job["id"],))
            elif finding == "completed":
                recorded_as = req["outcome"]
                db.execute("UPDATE attempts SET state = ?, closed_by = 'reconciled-completed' "
                           "WHERE id = ?", (recorded_as, a["id"]))
                db.execute("UPDATE jobs SET state = ?, outcome = ? WHERE id = ?",
                           (recorded_as, recorded_as, job["id"]))
            self.append(db, kind="reconcile", project=job["project"], job=job["id"],
                        attempt=a["id"], runner=a["runner"], fence=a["fence"],
                        deployment_key=job["deployment_key"], reason=req.get("evidence"),
                        recorded_as=recorded_as, outcome=finding, received_ms=now,
                        lease_expires_ms=a["lease_expires_ms"])
            view = self._job_view(db, job["id"], full=True)
        return 200, view

    # -- reads ------------------------------------------------------------------------------------

    @staticmethod
    def _ledger_view(row) -> dict:
        return {f: row[f] for f in LEDGER_FIELDS if row[f] is not None}

    def _job_view(self, db, job_id: str, full: bool, row=None) -> dict:
        j = row or db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        view = {"id": j["id"], "project": j["project"], "deployment_key": j["deployment_key"],
                "spec": {"steps": j["steps"], "step_ms": j["step_ms"]}, "state": j["state"]}
        if j["current_attempt"] is not None:
            view["current_attempt"] = j["current_attempt"]
        if j["outcome"] is not None:
            view["outcome"] = j["outcome"]
        view["attempts"], view["ledger"] = [], []
        if full:
            for a in db.execute("SELECT * FROM attempts WHERE job = ? ORDER BY fence", (job_id,)):
                av = {"id": a["id"], "job": a["job"], "runner": a["runner"], "fence": a["fence"],
                      "state": a["state"], "current": a["id"] == j["current_attempt"],
                      "lease_expires_ms": a["lease_expires_ms"], "claimed_ms": a["claimed_ms"]}
                if a["closed_by"] is not None:
                    av["closed_by"] = a["closed_by"]
                view["attempts"].append(av)
            view["ledger"] = [self._ledger_view(r) for r in
                              db.execute("SELECT * FROM ledger WHERE job = ? ORDER BY seq", (job_id,))]
        return view

    def jobs(self, who) -> tuple[int, list]:
        if who["kind"] != "operator":
            raise forbidden("read jobs (operator only)")
        with self.store.read() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY ord").fetchall()
            return 200, [self._job_view(db, r["id"], False, r) for r in rows]

    def job(self, who, job_id: str) -> tuple[int, dict]:
        if who["kind"] != "operator":
            raise forbidden("read jobs (operator only)")
        with self.store.read() as db:
            if not db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise ApiError(404, "unknown_job", f"no job {job_id}")
            return 200, self._job_view(db, job_id, True)

    def ledger(self, who, after: int, limit: int) -> tuple[int, list]:
        if who["kind"] != "operator":
            raise forbidden("read the ledger (operator only)")
        if after > I64_MAX:
            return 200, []
        with self.store.read() as db:
            rows = db.execute("SELECT * FROM ledger WHERE seq > ? ORDER BY seq LIMIT ?",
                              (after, limit)).fetchall()
        return 200, [self._ledger_view(r) for r in rows]


# ====================================================================== HTTP


class ControlHandler(JsonHandler):
    rules: Rules  # set in main()

    def _who(self):
        return self.rules.authenticate(self.headers.get("Authorization"))

    def _health(self, params):
        return 200, {"status": "ok"}

    def _jobs(self, params):
        return self.rules.jobs(self._who())

    def _job(self, params):
        job_id = decode_path_segment(params["id"])
        return self.rules.job(self._who(), job_id)

    def _ledger(self, params):
        q = parse_query(self.query, {"after": U64_MAX, "limit": U64_MAX})
        who = self._who()
        limit = min(max(q.get("limit", 1000), 1), 10_000)
        return self.rules.ledger(who, q.get("after", 0), limit)


def build_routes(rules: Rules) -> list[Route]:
    def post(rule):
        def handle(h, params):
            who = h._who()
            return rule(who, h.json_body())
        return handle

    return [
        Route("/v1/health", {"GET": ControlHandler._health}),
        Route("/v1/projects", {"POST": post(rules.create_project)}),
        Route("/v1/runners", {"POST": post(rules.register_runner)}),
        Route("/v1/jobs", {"POST": post(rules.submit), "GET": ControlHandler._jobs}),
        Route("/v1/jobs/{id}", {"GET": ControlHandler._job}),
        Route("/v1/claim", {"POST": post(rules.claim)}),
        Route("/v1/heartbeat", {"POST": post(rules.heartbeat)}),
        Route("/v1/capability", {"POST": post(rules.capability)}),
        Route("/v1/result", {"POST": post(rules.result)}),
        Route("/v1/reconcile", {"POST": post(rules.reconcile)}),
        Route("/v1/ledger", {"GET": ControlHandler._ledger}),
    ]


def sweeper(rules: Rules, sweep_ms: int, stop: threading.Event):
    while not stop.wait(sweep_ms / 1000):
        try:
            rules.sweep()
        except Exception as err:  # a busy or failing store: try again next period
            print(f"sweep failed: {err!r}", file=sys.stderr, flush=True)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def main(argv=None):
    ap = ArgParser(description="The Python lab's control plane (docs/protocol.md).")
    ap.add_argument("--listen", default="127.0.0.1:7400",
                    help="HOST:PORT; port 0 picks a free port (printed as JSON on stdout)")
    ap.add_argument("--db", default="fencelab-control.sqlite", help="the SQLite file (created when absent)")
    ap.add_argument("--operator-token", default=os.environ.get("FENCELAB_OPERATOR_TOKEN"),
                    help="the operator's bearer token [env FENCELAB_OPERATOR_TOKEN]")
    ap.add_argument("--secret", default=os.environ.get("FENCELAB_CAPABILITY_SECRET"),
                    help="secret shared with the target [env FENCELAB_CAPABILITY_SECRET]")
    ap.add_argument("--lease-ms", type=positive_int, default=2000)
    ap.add_argument("--capability-ttl-ms", type=positive_int, default=30_000)
    ap.add_argument("--sweep-ms", type=positive_int, default=50)
    ap.add_argument("--bug", action="append", default=[], choices=sorted(BUGS),
                    help="switch on a planted bug (repeatable); also FENCELAB_PY_BUGS=a,b")
    ap.add_argument("--bugs", action="store_true", help="list the planted bugs and exit")
    args = ap.parse_args(argv)
    if args.bugs:
        for name, what in BUGS.items():
            print(f"{name:22} {what}")
        return 0
    if not args.operator_token:
        ap.error("--operator-token (or FENCELAB_OPERATOR_TOKEN) is required and must not be empty")
    if not args.secret:
        ap.error("--secret (or FENCELAB_CAPABILITY_SECRET) is required and must not be empty")
    bugs = set(args.bug) | bugs_from_env("control-plane")
    for name in sorted(bugs):
        print(f"planted bug on: {name}", file=sys.stderr, flush=True)

    try:
        store = Store(args.db)
    except sqlite3.Error as err:
        print(f"cannot open the store {args.db}: {err}", file=sys.stderr)
        return 1
    rules = Rules(store, args.operator_token, args.secret, args.lease_ms,
                  args.capability_ttl_ms, bugs)
    ControlHandler.rules = rules
    ControlHandler.routes = build_routes(rules)
    stop = threading.Event()
    threading.Thread(target=sweeper, args=(rules, args.sweep_ms, stop), name="sweeper",
                     daemon=True).start()

    def on_stop():
        stop.set()
        store.close()

    serve(ControlHandler, args.listen, on_stop)


if __name__ == "__main__":
    sys.exit(main())
