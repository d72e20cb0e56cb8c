#!/usr/bin/env python3
"""The deployment target of the Python lab: applies steps, keeps the step log.

A step arrives with a capability signed by the control plane. Depending on the mode the
target refuses it (bad signature, expired capability, stale fence, duplicate step) or
applies it. Judging, applying and logging happen atomically under one lock at the target's
own receipt time; an applied step is then answered after ``duration_ms``.

    python3 target.py --listen 127.0.0.1:7500 --mode fenced --secret cap-secret \\
        --step-log steps.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from common import (
    ArgParser,
    I64, I64_MAX, STR, U32, U64, U64_MAX, ApiError, JsonHandler, Route, bugs_from_env, check_shape,
    decode_path_segment,
    mono_ns, parse_query, serve, verify_capability, wall_ms,
)

BUGS = {
    "target-ignores-fence": "the fenced target applies steps without comparing their fence",
}
MODES = ("fenced", "idempotent", "unfenced")
MAX_SERVED = 1_000_000  # records kept in memory for GET /v1/steps

CAPABILITY = {
    "deployment_key": (STR, True), "job": (STR, True), "attempt": (STR, True),
    "runner": (STR, True), "fence": (U64, True), "expires_ms": (I64, True),
    "signature": (STR, True),
}
STEP = {"capability": (CAPABILITY, True), "step": (U32, True), "steps": (U32, True),
        "duration_ms": (U64, True)}


class Deployment:
    def __init__(self):
        self.revision = 0
        self.highest_fence = 0
        self.applied: set[tuple[str, int]] = set()


class Target:
    def __init__(self, mode: str, secret: str | None, step_log: str | None, bugs: set[str]):
        self.mode = mode
        self.secret = secret
        self.bugs = bugs
        self.lock = threading.Lock()
        self.deployments: dict[str, Deployment] = {}
        self.records: list[dict] = []
        self.next_seq = 0
        self.log = open(step_log, "a", encoding="utf-8") if step_log else None

    def judge(self, cap: dict) -> str | None:
        """The refusal reason for this capability, or None to apply."""
        if self.mode == "unfenced":
            return None
        if not verify_capability(self.secret, cap):
            return "bad_signature"
        if cap["expires_ms"] <= self._now:
            return "expired"
        dep = self.deployments.get(cap["deployment_key"])
        if self.mode == "idempotent":
            return "duplicate" if dep and (cap["job"], self._step) in dep.applied else None
        if dep and cap["fence"] < dep.highest_fence and "target-ignores-fence" not in self.bugs:
            return "stale_fence"
        return None

    def step(self, req: dict) -> tuple[int, dict, int]:
        cap = req["capability"]
        with self.lock:
            now = wall_ms()
            self._now, self._step = now, req["step"]
            reason = self.judge(cap)
            # Any judged step makes its key known (revision 0 if nothing was ever applied).
            dep = self.deployments.setdefault(cap["deployment_key"], Deployment())
            before = dep.highest_fence
            if reason is None:
                dep.revision += 1
                dep.highest_fence = max(dep.highest_fence, cap["fence"])
                dep.applied.add((cap["job"], req["step"]))
            record = {
                "seq": self.next_seq, "deployment_key": cap["deployment_key"], "job": cap["job"],
                "attempt": cap["attempt"], "runner": cap["runner"], "fence": cap["fence"],
                "step": req["step"], "steps": req["steps"], "applied": reason is None,
            }
            if reason is not None:
                record["reason"] = reason
            record.update(revision=dep.revision, highest_fence_before=before,
                          received_ms=now, mono_ns=mono_ns())
            self.next_seq += 1
            if len(self.records) < MAX_SERVED:
                self.records.append(record)
            if self.log is not None:
                self.log.write(json.dumps(record, separators=(",", ":")) + "\n")
                self.log.flush()
        if reason is None:
            return 200, {"record": record}, req["duration_ms"]
        return 409, {"record": record}, 0

    def deployment(self, key: str) -> dict:
        with self.lock:
            dep = self.deployments.get(key)
            if dep is None:
                raise ApiError(404, "unknown_deployment", f"no step ever touched {key}")
            return {"key": key, "revision": dep.revision, "highest_fence": dep.highest_fence}

    def steps(self, after: int, limit: int) -> list[dict]:
        with self.lock:
            return self.records[after:after + limit] if after < len(self.records) else []


class TargetHandler(JsonHandler):
    target: Target

    def _health(self, params):
        return 200, {"status": "ok"}

    def _post_step(self, params):
        req = check_shape(self.json_body(), STEP)
        if req["steps"] < 1 or req["step"] >= req["steps"]:
            raise ApiError(400, "invalid_field", "need steps >= 1 and step < steps")
        if req["duration_ms"] > 600_000:
            raise ApiError(400, "invalid_field", "`duration_ms` must be at most 600000")
        if req["capability"]["fence"] > I64_MAX:
            raise ApiError(400, "invalid_field", "`capability.fence` must be at most i64::MAX")
        status, body, wait_ms = self.target.step(req)
        if wait_ms:
            # The step's work; the record dates from receipt. Not time.sleep: under
            # libfaketime (target-clock-skew) its clock_nanosleep(CLOCK_MONOTONIC,
            # TIMER_ABSTIME) fails with EINVAL; a condition's timed wait does not.
            threading.Event().wait(wait_ms / 1000)
        return status, body

    def _get_steps(self, params):
        q = parse_query(self.query, {"after": U64_MAX, "limit": U64_MAX})
        limit = min(max(q.get("limit", 10_000), 1), 100_000)
        return 200, self.target.steps(q.get("after", 0), limit)

    def _get_deployment(self, params):
        return 200, self.target.deployment(decode_path_segment(params["key"]))


TargetHandler.routes = [
    Route("/v1/health", {"GET": TargetHandler._health}),
    Route("/v1/steps", {"POST": TargetHandler._post_step, "GET": TargetHandler._get_steps}),
    Route("/v1/deployments/{key}", {"GET": TargetHandler._get_deployment}),
]


def main(argv=None):
    ap = ArgParser(description="The Python lab's deployment target (docs/protocol.md).")
    ap.add_argument("--listen", default="127.0.0.1:7500")
    ap.add_argument("--secret", default=os.environ.get("FENCELAB_CAPABILITY_SECRET"),
                    help="secret shared with the control plane [env FENCELAB_CAPABILITY_SECRET]")
    ap.add_argument("--mode", default="fenced", choices=MODES)
    ap.add_argument("--step-log", help="append every step record to this JSONL file")
    ap.add_argument("--bug", action="append", default=[], choices=sorted(BUGS),
                    help="switch on a planted bug (repeatable); also FENCELAB_PY_BUGS=a,b")
    args = ap.parse_args(argv)
    if not args.secret and args.mode != "unfenced":
        ap.error("--secret (or FENCELAB_CAPABILITY_SECRET) is required")
    bugs = set(args.bug) | bugs_from_env("target")
    for name in sorted(bugs):
        print(f"planted bug on: {name}", file=sys.stderr, flush=True)
    try:
        target = Target(args.mode, args.secret, args.step_log, bugs)
    except OSError as err:
        print(f"cannot open the step log {args.step_log}: {err}", file=sys.stderr)
        return 1
    TargetHandler.target = target
    serve(TargetHandler, args.listen, lambda: target.log and target.log.close())


if __name__ == "__main__":
    sys.exit(main())
