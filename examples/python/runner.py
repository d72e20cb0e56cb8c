#!/usr/bin/env python3
"""The runner of the Python lab: claims jobs, runs them as steps on the target, reports.

What it does, per job:

1. polls ``POST /v1/claim`` every ``--poll-ms`` until granted, noting when it *sent* the claim;
2. holds authority until a renewal deadline on its monotonic clock: the send time of the
   last accepted claim or heartbeat plus ``lease_ms - renewal_margin_ms``;
3. heartbeats every ``--heartbeat-interval-ms``; a definite refusal (409 or an error answer)
   ends its authority at once, no answer changes nothing;
4. before each step redeems a capability, then sends the step to the target, racing the
   answer against the deadline; it sends nothing once authority has ended and stops at the
   first refused step;
5. reports ``succeeded`` after the last applied step, else ``failed``, retrying the result on
   transport errors only (``--result-tries-max``, backoff 100 ms doubling to 1 s).

Its wall clock (``observed_ms`` in every report) is the host's plus ``--clock-offset-ms`` plus
the integer in ``--clock-offset-file`` (re-read at every observation), so a harness can skew
it. No lease decision is ever taken on it: the deadline is monotonic.

Every request and answer is written to ``--log`` as JSON Lines (docs/history.md).

    python3 runner.py --id r1 --token TOKEN --control-url http://127.0.0.1:7400 \\
        --target-url http://127.0.0.1:7500 --log runner-r1.jsonl
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse

from common import ALL_BUGS, ArgParser, bugs_from_env, mono_ns, wall_ms

# Most times the planted `runner-resends-lost-step` sends one step again (a poll apart).
STEP_RESENDS_MAX = 100


# ====================================================================== clock and log


class Clock:
    """The runner's wall clock, as reported in ``observed_ms``; skewable, never trusted."""

    def __init__(self, offset_ms: int, offset_file: str | None):
        self.offset_ms = offset_ms
        self.offset_file = offset_file

    def file_offset(self) -> int:
        if not self.offset_file:
            return 0
        try:
            with open(self.offset_file, encoding="utf-8") as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return 0  # missing, unreadable or not an integer: no further offset

    def observed_ms(self) -> int:
        return wall_ms() + self.offset_ms + self.file_offset()


class RunnerLog:
    """JSON Lines of history events (docs/history.md), one per line, flushed; ``time_ns``
    is the host's CLOCK_MONOTONIC taken under the lock so lines are in time order."""

    ORDER = ("index", "time_ns", "process", "type", "f", "project", "job", "attempt", "runner",
             "fence", "key", "received_ms", "observed_ms", "lease_expires_ms", "decision",
             "reason", "outcome", "value")

    def __init__(self, path: str | None, runner_id: str):
        self.fh = open(path, "a", encoding="utf-8") if path else None
        self.process = f"runner:{runner_id}"
        self.lock = threading.Lock()

    def write(self, type_: str, f: str, **fields) -> int:
        """Writes one line; returns its time (monotonic ns): a request's send is that time,
        so that the runner's authority runs from the time its log shows, however long the
        runner is stopped (SIGSTOP) on either side of the line."""
        if self.fh is None:
            return mono_ns()
        with self.lock:
            # "index" is 0 in every line, as the reference runner writes it; the run's merge
            # numbers the events.
            now_ns = mono_ns()
            event = dict(fields, index=0, time_ns=now_ns, process=self.process, type=type_, f=f)
            line = json.dumps({k: event[k] for k in self.ORDER if event.get(k) is not None},
                              separators=(",", ":"))
            self.fh.write(line + "\n")
            self.fh.flush()
            return now_ns

    def close(self):
        if self.fh is not None:
            with self.lock:
                self.fh.close()
                self.fh = None


# ====================================================================== HTTP


class Answer:
    """What came back: ``status`` and ``body`` for an answer, or ``error`` when none came."""

    def __init__(self, status=None, body=None, error=None):
        self.status, self.body, self.error = status, body, error
        # When the request was sent: its log line's time (monotonic ns), set by call_control.
        self.sent_ns = None

    @property
    def answered(self) -> bool:
        # A 503 says the outcome is unknown (docs/protocol.md): it counts as no answer.
        return self.error is None and self.status != 503

    def code(self) -> str | None:
        return self.body.get("code") if isinstance(self.body, dict) else None


def post(base: str, path: str, body: dict, token: str | None, timeout_s: float) -> Answer:
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout_s)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", url.path.rstrip("/") + path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return Answer(resp.status, parsed)
    except (OSError, http.client.HTTPException) as err:
        return Answer(error=f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
    finally:
        conn.close()


# ====================================================================== authority


class Authority:
    """The renewal deadline on the monotonic clock, moved only by accepted claims and
    heartbeats, ended at once by a definite refusal."""

    def __init__(self, deadline_ns: int, ignores_deadline: bool = False):
        self.deadline_ns = deadline_ns
        self.ended = False
        self.cond = threading.Condition()
        # The planted `runner-ignores-deadline`: authority ends only by a refusal.
        self.ignores_deadline = ignores_deadline

    def live(self) -> bool:
        with self.cond:
            if self.ignores_deadline:
                return not self.ended
            return not self.ended and time.monotonic_ns() < self.deadline_ns

    def extend(self, sent_ns: int, window_ns: int):
        """An accepted heartbeat sent at ``sent_ns``: the deadline moves to ``sent_ns +
        window_ns`` only if authority still held when it was sent; authority given up is
        not taken back, even when the server accepts a late heartbeat."""
        with self.cond:
            held = sent_ns < self.deadline_ns or self.ignores_deadline
            if not self.ended and held and sent_ns + window_ns > self.deadline_ns:
                self.deadline_ns = sent_ns + window_ns
            self.cond.notify_all()

    def end(self):
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def wait_for(self, done: threading.Event) -> bool:
        """Wait until ``done`` is set (True) or authority ends (False)."""
        with self.cond:
            while not done.is_set():
                if self.ended:
                    return False
                left = self.deadline_ns - time.monotonic_ns()
                if left <= 0 and not self.ignores_deadline:
                    return False
                self.cond.wait(min(max(left, 0) / 1e9, 0.01) or 0.01)
            return True


# ====================================================================== the runner


class Runner:
    def __init__(self, args, token: str):
        self.args = args
        self.id = args.id
        self.token = token
        self.clock = Clock(args.clock_offset_ms, args.clock_offset_file)
        self.log = RunnerLog(args.log, args.id)
        self.timeout_s = args.request_timeout_ms / 1000
        self.bugs = set(args.bug) | bugs_from_env("runner")
        self.stopping = threading.Event()
        # Control-plane replicas, its own first; after a request that got no answer the
        # next request goes to the next replica (round robin).
        self.control_urls = args.control_urls
        self.replica = 0
        self.replica_lock = threading.Lock()

    def post_control(self, path: str, body: dict) -> Answer:
        with self.replica_lock:
            index = self.replica
        ans = post(self.control_urls[index], path, body, self.token, self.timeout_s)
        if not ans.answered and len(self.control_urls) > 1:
            with self.replica_lock:
                if self.replica == index:
                    self.replica = (index + 1) % len(self.control_urls)
        return ans

    # -- one logged call to the control plane ---------------------------------------------------

    def call_control(self, f: str, path: str, body: dict, claim: dict | None = None,
                     key: str | None = None) -> Answer:
        fields = dict(claim or {"runner": self.id})
        fields["observed_ms"] = body["observed_ms"]
        if "outcome" in body:
            fields["outcome"] = body["outcome"]
        sent_ns = self.log.write("request", f, **fields)
        ans = self.post_control(path, body)
        ans.sent_ns = sent_ns
        if not ans.answered:
            self.log.write("info", f, reason=ans.error or f"http {ans.status} {ans.code()}", **fields)
            return ans
        b = ans.body if isinstance(ans.body, dict) else {}
        out = dict(fields)
        if "decision" in b:
            out.update(decision=b["decision"], reason=b.get("reason"),
                       lease_expires_ms=b.get("lease_expires_ms"))
            if "ledger_seq" in b:
                out["value"] = {"ledger_seq": b["ledger_seq"]}
        elif f == "claim" and ans.status == 200 and "grant" in b:
            grant = b["grant"]
            if grant is None:
                out["reason"] = "none_claimable"
            else:
                out.update(grant["claim"], key=grant["deployment_key"],
                           lease_expires_ms=grant["lease_expires_ms"], decision="accepted")
        else:  # an error answer: no decision; the code says why
            out["reason"] = ans.code() or f"http {ans.status}"
        self.log.write("response", f, **out)
        return ans

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> int:
        done = 0
        while not self.stopping.is_set():
            if self.args.jobs_max is not None and done >= self.args.jobs_max:
                return 0
            ans = self.call_control("claim", "/v1/claim",
                                    {"runner": self.id, "observed_ms": self.clock.observed_ms()})
            grant = ans.body.get("grant") if ans.answered and ans.status == 200 and isinstance(ans.body, dict) else None
            if grant:
                self.run_job(grant, ans.sent_ns)
                done += 1
            else:
                self.stopping.wait(self.args.poll_ms / 1000)
        return 0

    def run_job(self, grant: dict, sent_ns: int):
        a = self.args
        claim = dict(grant["claim"])
        key = grant["deployment_key"]
        spec = grant["spec"]
        window_ns = (grant["lease_ms"] - a.renewal_margin_ms) * 1_000_000
        authority = Authority(sent_ns + window_ns, "runner-ignores-deadline" in self.bugs)
        finished = threading.Event()
        beats = threading.Thread(target=self.heartbeats, args=(claim, authority, window_ns, finished),
                                 name=f"heartbeat-{claim['attempt']}", daemon=True)
        beats.start()
        applied = 0
        try:
            resends = STEP_RESENDS_MAX if "runner-resends-lost-step" in self.bugs else 0
            step = 0
            while step < spec["steps"]:
                if self.stopping.is_set() or not authority.live():
                    break
                cap = self.redeem(claim, authority)
                if cap is None or not authority.live():
                    break
                sent = self.send_step(claim, key, cap, step, spec, authority)
                if sent is None and resends > 0:
                    # The planted bug: the step may have been applied; it is sent again.
                    resends -= 1
                    self.stopping.wait(self.args.poll_ms / 1000)
                    continue
                if not sent:
                    break
                applied += 1
                step += 1
        finally:
            # The heartbeat thread ends after the call it may have in flight; the result
            # does not wait for it.
            finished.set()
        if self.stopping.is_set():
            return
        outcome = "succeeded" if applied == spec["steps"] else "failed"
        if "runner-reports-unfinished-success" in self.bugs:
            # The planted bug: a job the runner stopped working on counts as done.
            outcome = "succeeded"
        self.report(claim, outcome)

    def heartbeats(self, claim, authority: Authority, window_ns: int, finished: threading.Event):
        interval = self.args.heartbeat_interval_ms / 1000
        # Heartbeats go on until the job's steps end or one is refused, also past the
        # runner's own deadline (as the reference runner does): a late heartbeat is the
        # server's to judge, and it never gives back authority the runner gave up.
        while not finished.wait(interval):
            if self.stopping.is_set():
                return
            body = dict(claim, observed_ms=self.clock.observed_ms())
            ans = self.call_control("heartbeat", "/v1/heartbeat", body, claim)
            if not ans.answered:
                continue  # no answer changes nothing
            if ans.status == 200 and isinstance(ans.body, dict) and ans.body.get("decision") == "accepted":
                authority.extend(ans.sent_ns, window_ns)
            else:
                authority.end()  # a definite refusal: authority ends now
                return

    def redeem(self, claim, authority: Authority) -> dict | None:
        """A capability for the next step, asked again (while authority lasts) when no
        answer came; None when refused or when authority ended first."""
        while authority.live() and not self.stopping.is_set():
            body = dict(claim, observed_ms=self.clock.observed_ms())
            ans = self.call_control("capability", "/v1/capability", body, claim)
            if ans.answered:
                if ans.status == 200 and isinstance(ans.body, dict) and "capability" in ans.body:
                    return ans.body["capability"]
                authority.end()
                return None
            self.stopping.wait(min(self.args.poll_ms / 1000, 0.1))
        return None

    def send_step(self, claim, key, cap, step: int, spec, authority: Authority) -> bool | None:
        """Send one step; True when the target answered that it applied it in time, None
        when no answer came (the step may have been applied), False otherwise."""
        fields = dict(claim, key=key, value={"step": step, "steps": spec["steps"]})
        body = {"capability": cap, "step": step, "steps": spec["steps"],
                "duration_ms": spec["step_ms"]}
        box: dict = {}
        answered = threading.Event()
        self.log.write("request", "step", **fields)

        def go():
            box["ans"] = post(self.args.target_url, "/v1/steps", body, None,
                              self.timeout_s + spec["step_ms"] / 1000)
            answered.set()

        threading.Thread(target=go, name="step", daemon=True).start()
        if not authority.wait_for(answered):
            # Authority ended first. The step may still land; the runner stops here.
            self.log.write("info", "step", reason="authority ended before the step's answer",
                           **fields)
            return False
        ans = box["ans"]
        if not ans.answered:
            self.log.write("info", "step", reason=ans.error, **fields)
            return None
        record = ans.body.get("record") if isinstance(ans.body, dict) else None
        if record is not None:
            decision = "accepted" if record.get("applied") else "rejected"
            self.log.write("response", "step", decision=decision, reason=record.get("reason"),
                           **fields)
            return bool(record.get("applied")) and ans.status == 200
        self.log.write("response", "step", reason=ans.code() or f"http {ans.status}", **fields)
        return False

    def report(self, claim, outcome: str):
        delay = 0.1
        for attempt in range(1, self.args.result_tries_max + 1):
            body = dict(claim, observed_ms=self.clock.observed_ms(), outcome=outcome)
            ans = self.call_control("result", "/v1/result", body, claim)
            if ans.answered or attempt == self.args.result_tries_max:
                return
            if self.stopping.wait(delay):
                return
            delay = min(delay * 2, 1.0)


# ====================================================================== main


def register(args) -> str:
    """Register with a project's registration token; the answer holds the runner token."""
    ans = post(args.control_urls[0], "/v1/runners", {"id": args.id}, args.registration_token,
               args.request_timeout_ms / 1000)
    if ans.answered and ans.status == 201:
        return ans.body["token"]
    why = ans.error or f"{ans.status} {json.dumps(ans.body)}"
    print(f"registration of runner {args.id} failed: {why}", file=sys.stderr)
    sys.exit(1)


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def main(argv=None) -> int:
    ap = ArgParser(description="The Python lab's runner (docs/protocol.md).")
    ap.add_argument("--id", required=True)
    ap.add_argument("--control-url", default="http://127.0.0.1:7400",
                    help="the control plane; several replicas comma-separated, its own first")
    ap.add_argument("--target-url", default="http://127.0.0.1:7500")
    ap.add_argument("--token", default=os.environ.get("FENCELAB_RUNNER_TOKEN"),
                    help="this runner's bearer token [env FENCELAB_RUNNER_TOKEN]")
    ap.add_argument("--registration-token",
                    help="register with this project registration token instead of taking a token")
    ap.add_argument("--heartbeat-interval-ms", type=non_negative, default=250)
    ap.add_argument("--renewal-margin-ms", type=non_negative, default=200)
    ap.add_argument("--poll-ms", type=non_negative, default=100)
    ap.add_argument("--request-timeout-ms", type=non_negative, default=1000)
    ap.add_argument("--result-tries-max", type=non_negative, default=5)
    ap.add_argument("--clock-offset-ms", type=int, default=0,
                    help="added to this runner's clock in every observation time")
    ap.add_argument("--clock-offset-file",
                    help="a file holding a further offset in ms, re-read at every observation")
    ap.add_argument("--jobs-max", type=non_negative, help="exit 0 after this many jobs")
    ap.add_argument("--log", help="JSONL log of every request and answer")
    ap.add_argument("--bug", action="append", default=[],
                    choices=sorted(b for b, process in ALL_BUGS.items() if process == "runner"),
                    help="switch on a planted bug (repeatable); also FENCELAB_PY_BUGS=a,b")
    args = ap.parse_args(argv)
    if args.heartbeat_interval_ms == 0:
        ap.error("--heartbeat-interval-ms must be above 0")
    if args.request_timeout_ms == 0:
        ap.error("--request-timeout-ms must be above 0")
    if args.result_tries_max == 0:
        ap.error("--result-tries-max must be at least 1")
    args.control_urls = [u.strip() for u in args.control_url.split(",") if u.strip()]
    for name, url in [("control-url", u) for u in args.control_urls] + [("target-url", args.target_url)]:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            ap.error(f"--{name} must be an http:// URL, got {url!r}")
    if not args.control_urls:
        ap.error("--control-url must name at least one URL")
    if args.registration_token:
        token = register(args)
    elif args.token:
        token = args.token
    else:
        ap.error("give --token (or FENCELAB_RUNNER_TOKEN) or --registration-token")
    try:
        runner = Runner(args, token)
    except OSError as err:
        print(f"cannot open the log {args.log}: {err}", file=sys.stderr)
        return 1

    def on_signal(signum, frame):
        runner.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return runner.run()
    finally:
        runner.log.close()


if __name__ == "__main__":
    sys.exit(main())
