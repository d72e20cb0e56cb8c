#!/usr/bin/env python3
"""Interoperability checks between the Python lab and the reference lab (fencelab-ref).

Standard library only; loopback only; every wait bounded; every process it starts is
stopped at the end (SIGTERM, then SIGKILL after 5 s).

    python3 interop.py all                  # everything below
    python3 interop.py conformance          # same requests to both control planes and targets
    python3 interop.py capabilities         # capabilities signed by one side, verified by the other
    python3 interop.py runners              # each runner against the other side's servers
    python3 interop.py --ref /work/bin/fencelab-ref ...

Exit code 0 when every check passed, 1 otherwise. Differences found by ``conformance``
are printed one a line; a difference is a check failure unless it is listed in
KNOWN_DIFFERENCES (each of which is a gap written down in README.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
OP = "op-secret"
SECRET = "cap-secret"


# ====================================================================== processes


class Proc:
    """A child process whose stdout is read line by line in a thread."""

    all: list["Proc"] = []

    def __init__(self, name: str, cmd: list[str], cwd: str, env: dict | None = None):
        self.name = name
        self.cmd = cmd
        self.err_path = os.path.join(cwd, f"{name}.stderr")
        self.err = open(self.err_path, "w")
        self.p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=self.err,
                                  env=dict(os.environ, **(env or {})), text=True,
                                  start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        Proc.all.append(self)

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def listening(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            try:
                return json.loads(line)["listening"]
            except (ValueError, KeyError, TypeError):
                continue
        self.stop()
        raise RuntimeError(f"{self.name} did not print its listening line within {timeout}s; "
                           f"stderr: {open(self.err_path).read()[-2000:]}")

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, timeout: float = 5.0) -> int | None:
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGTERM)
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout)
        self.err.close()
        return self.p.returncode


def stop_all():
    for proc in reversed(Proc.all):
        proc.stop()
    Proc.all.clear()


class Lab:
    """How to start one implementation's control plane, target and runner."""

    def __init__(self, name: str, ref: str | None):
        self.name, self.ref = name, ref

    def _cmd(self, kind: str) -> list[str]:
        if self.ref:
            return [self.ref, "lab", kind]
        return [PY, os.path.join(HERE, {"control-plane": "control_plane.py", "target": "target.py",
                                        "runner": "runner.py"}[kind])]

    def control_plane(self, work: str, lease_ms: int = 1000, extra=()) -> tuple[Proc, str]:
        cmd = self._cmd("control-plane") + [
            "--listen", "127.0.0.1:0", "--db", os.path.join(work, f"{self.name}-cp.sqlite"),
            "--operator-token", OP, "--secret", SECRET, "--lease-ms", str(lease_ms), *extra]
        proc = Proc(f"{self.name}-control-plane", cmd, work)
        return proc, proc.listening()

    def target(self, work: str, mode: str = "fenced", extra=()) -> tuple[Proc, str]:
        cmd = self._cmd("target") + [
            "--listen", "127.0.0.1:0", "--secret", SECRET, "--mode", mode,
            "--step-log", os.path.join(work, f"{self.name}-steps.jsonl"), *extra]
        proc = Proc(f"{self.name}-target", cmd, work)
        return proc, proc.listening()

    def runner(self, work: str, rid: str, token: str, cp: str, tg: str, extra=()) -> Proc:
        cmd = self._cmd("runner") + [
            "--id", rid, "--token", token, "--control-url", f"http://{cp}",
            "--target-url", f"http://{tg}", "--log", os.path.join(work, f"{self.name}-{rid}.jsonl"),
            *extra]
        return Proc(f"{self.name}-runner-{rid}", cmd, work)


# ====================================================================== a fault proxy


class Proxy:
    """A loopback TCP forwarder with three modes: ``up`` (forward both ways), ``down``
    (refuse new connections and cut open ones), ``mute`` (forward requests, drop answers)."""

    def __init__(self, upstream: str):
        import socket

        self.socket = socket
        self.up_host, up_port = upstream.rsplit(":", 1)
        self.up_port = int(up_port)
        self.mode = "up"
        self.conns: list = []
        self.lock = threading.Lock()
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.settimeout(0.2)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode: str):
        with self.lock:
            self.mode = mode
            if mode == "down":
                for c in self.conns:
                    try:
                        c.close()
                    except OSError:
                        pass
                self.conns.clear()

    def close(self):
        self.closed = True
        self.set("down")
        self.lsock.close()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                continue
            with self.lock:
                if self.mode == "down":
                    client.close()
                    continue
                try:
                    server = self.socket.create_connection((self.up_host, self.up_port), timeout=2)
                except OSError:
                    client.close()
                    continue
                self.conns += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src, dst, answers: bool):
        src.settimeout(None)
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answers and self.mode == "mute":
                    continue
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass


# ====================================================================== HTTP


def call(addr: str, method: str, path: str, body=None, token: str | None = None,
         headers: dict | None = None, raw: bytes | None = None, timeout: float = 10.0):
    """One request on a fresh connection → (status, headers, parsed JSON or raw bytes)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    hdrs = {}
    if body is not None or raw is not None:
        hdrs["Content-Type"] = "application/json"
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    hdrs = {k: v for k, v in hdrs.items() if v is not None}
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        try:
            parsed = json.loads(payload) if payload else None
        except ValueError:
            parsed = payload
        return resp.status, dict((k.lower(), v) for k, v in resp.getheaders()), parsed
    finally:
        conn.close()


def code_of(answer):
    status, _, body = answer
    if isinstance(body, dict):
        return status, body.get("code") or body.get("decision"), body.get("reason")
    return status, None, None


# ====================================================================== conformance


def shape(value):
    """A value with the variable parts (times, tokens, signatures) blanked out."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("received_ms", "observed_ms", "mono_ns", "lease_expires_ms", "claimed_ms",
                     "expires_ms", "signature", "token", "registration_token", "error"):
                out[k] = "<" + type(v).__name__ + ">"
            else:
                out[k] = shape(v)
        return out
    if isinstance(value, list):
        return [shape(v) for v in value]
    return value


def control_plane_script(cp: str, lease_ms: int) -> list[tuple[str, object]]:
    """The same requests, in the same order, against one control plane; returns
    (label, observation) pairs to compare between implementations."""
    out: list[tuple[str, object]] = []

    def obs(label, answer, full=False):
        status, headers, body = answer
        seen = (status, shape(body) if full else code_of(answer))
        if status == 405:
            seen = seen + (headers.get("allow"),)
        out.append((label, seen))
        return answer

    J = "application/json"
    # ---- authentication and bodies ------------------------------------------------------
    obs("no auth", call(cp, "POST", "/v1/projects", {"id": "p0"}))
    obs("empty token", call(cp, "POST", "/v1/projects", {"id": "p0"},
                            headers={"Authorization": "Bearer "}))
    obs("basic", call(cp, "POST", "/v1/projects", {"id": "p0"}, headers={"Authorization": "Basic b3A="}))
    obs("unknown token + bad json", call(cp, "POST", "/v1/projects", raw=b"{", token="nope"))
    obs("no content type", call(cp, "POST", "/v1/projects", raw=b'{"id":"p0"}', token=OP,
                                headers={"Content-Type": None}))
    obs("text/plain", call(cp, "POST", "/v1/projects", raw=b'{"id":"p0"}', token=OP,
                           headers={"Content-Type": "text/plain"}))
    obs("ctype uppercase", call(cp, "POST", "/v1/projects", raw=b'{"id":"p-upper"}', token=OP,
                                headers={"Content-Type": "Application/JSON"}))
    obs("ctype jsonx", call(cp, "POST", "/v1/projects", raw=b'{"id":"p-jsonx"}', token=OP,
                            headers={"Content-Type": "application/jsonx"}))
    obs("ctype charset", call(cp, "POST", "/v1/projects", raw=b'{"id":"p-charset"}', token=OP,
                              headers={"Content-Type": "application/json; charset=utf-8"}))
    obs("ctype problem+json", call(cp, "POST", "/v1/projects", raw=b'{"id":"p-pj"}', token=OP,
                                   headers={"Content-Type": "application/problem+json"}))
    obs("too large", call(cp, "POST", "/v1/projects", raw=b" " * 70000, token=OP))
    obs("exactly 65536", call(cp, "POST", "/v1/projects",
                              raw=b'{"id":"p-big"}' + b" " * (65536 - 14), token=OP))
    obs("65537", call(cp, "POST", "/v1/projects",
                      raw=b'{"id":"p-big2"}' + b" " * (65537 - 14), token=OP))
    obs("too large unauth", call(cp, "POST", "/v1/projects", raw=b" " * 70000))
    obs("too large text/plain", call(cp, "POST", "/v1/projects", raw=b" " * 70000, token=OP,
                                     headers={"Content-Type": "text/plain"}))
    for label, raw in [("empty", b""), ("array", b"[1]"), ("string", b'"x"'), ("null", b"null"),
                       ("trailing", b'{"id":"p0"} x'), ("truncated", b'{"id":"p0"'),
                       ("duplicate", b'{"id":"p0","id":"p1"}'), ("unknown field", b'{"id":"p0","x":1}'),
                       ("id null", b'{"id":null}'), ("id number", b'{"id":5}'),
                       ("bad utf8", b'{"id":"\xff"}'), ("lone surrogate", b'{"id":"\\ud800"}'),
                       ("NaN", b'{"id":NaN}'), ("bom", b'\xef\xbb\xbf{"id":"p-bom"}'),
                       ("id space", b'{"id":"a b"}'), ("id empty", b'{"id":""}'),
                       ("id unicode", '{"id":"\u00e9"}'.encode()),
                       ("id 129", ('{"id":"%s"}' % ("x" * 129)).encode()),
                       ("id 128", ('{"id":"%s"}' % ("x" * 128)).encode()),
                       ("id newline", b'{"id":"a\\n"}'),
                       ("deep nesting", b'{"id":' + b"[" * 10000 + b"]" * 10000 + b"}"),
                       ("whitespace", b'  {"id":"p-ws"}  \n')]:
        obs(f"project body {label}", call(cp, "POST", "/v1/projects", raw=raw, token=OP))
    obs("create demo", call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP), full=True)
    obs("create demo again", call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP))
    other = call(cp, "POST", "/v1/projects", {"id": "other"}, token=OP)[2]
    demo_reg = call(cp, "POST", "/v1/projects", {"id": "demo2"}, token=OP)[2]["registration_token"]
    # ---- runners -------------------------------------------------------------------------
    obs("runner no project (op)", call(cp, "POST", "/v1/runners", {"id": "r0"}, token=OP))
    obs("runner project null (op)", call(cp, "POST", "/v1/runners", {"id": "r0", "project": None}, token=OP))
    obs("runner bad id first", call(cp, "POST", "/v1/runners", {"id": "bad id"}, token="nope"))
    obs("runner unknown project (op)", call(cp, "POST", "/v1/runners", {"id": "r0", "project": "nope"}, token=OP))
    obs("runner bad project id (op)", call(cp, "POST", "/v1/runners", {"id": "r0", "project": "bad id"}, token=OP))
    r1 = obs("runner r1 (op)", call(cp, "POST", "/v1/runners", {"id": "r1", "project": "demo"}, token=OP), full=True)[2]
    reg_other = other["registration_token"]
    obs("runner reg other project", call(cp, "POST", "/v1/runners", {"id": "r9", "project": "demo"}, token=reg_other))
    obs("runner reg unknown project", call(cp, "POST", "/v1/runners", {"id": "r9", "project": "nope"}, token=reg_other))
    obs("runner reg bad project id", call(cp, "POST", "/v1/runners", {"id": "r9", "project": "bad id"}, token=reg_other))
    r2 = obs("runner reg implicit", call(cp, "POST", "/v1/runners", {"id": "r2"}, token=reg_other), full=True)[2]
    obs("runner reg explicit", call(cp, "POST", "/v1/runners", {"id": "r3", "project": "demo2"}, token=demo_reg), full=True)
    obs("runner exists other project", call(cp, "POST", "/v1/runners", {"id": "r1", "project": "other"}, token=OP))
    obs("runner by runner token", call(cp, "POST", "/v1/runners", {"id": "r8", "project": "demo"}, token=r1["token"]))
    obs("runner bad id by runner token", call(cp, "POST", "/v1/runners", {"id": "", "project": "demo"}, token=r1["token"]))
    obs("project by runner token", call(cp, "POST", "/v1/projects", {"id": "px"}, token=r1["token"]))
    obs("project by reg token", call(cp, "POST", "/v1/projects", {"id": "px"}, token=reg_other))
    obs("project bad id by runner token", call(cp, "POST", "/v1/projects", {"id": "bad id"}, token=r1["token"]))
    obs("project bad json by runner token", call(cp, "POST", "/v1/projects", raw=b"{", token=r1["token"]))
    # ---- jobs ----------------------------------------------------------------------------
    spec = {"steps": 2, "step_ms": 0}
    obs("job by runner", call(cp, "POST", "/v1/jobs", {"project": "demo", "deployment_key": "k", "spec": spec}, token=r1["token"]))
    obs("job explicit j2", call(cp, "POST", "/v1/jobs", {"project": "demo", "id": "j2", "deployment_key": "k0", "spec": spec}, token=OP), full=True)
    obs("job generated 1", call(cp, "POST", "/v1/jobs", {"project": "demo", "deployment_key": "k1", "spec": spec}, token=OP), full=True)
    obs("job generated 2", call(cp, "POST", "/v1/jobs", {"project": "demo", "deployment_key": "k2", "spec": spec}, token=OP), full=True)
    obs("job id null", call(cp, "POST", "/v1/jobs", {"project": "demo", "id": None, "deployment_key": "k3", "spec": spec}, token=OP), full=True)
    call(cp, "POST", "/v1/jobs", {"project": "other", "id": "ox", "deployment_key": "kx", "spec": spec}, token=OP)
    obs("job exists other project", call(cp, "POST", "/v1/jobs", {"project": "other", "id": "j2", "deployment_key": "k", "spec": spec}, token=OP))
    obs("job unknown project", call(cp, "POST", "/v1/jobs", {"project": "nope", "deployment_key": "k", "spec": spec}, token=OP))
    obs("job bad project + unknown", call(cp, "POST", "/v1/jobs", {"project": "bad id", "deployment_key": "k", "spec": spec}, token=OP))
    obs("job bad key", call(cp, "POST", "/v1/jobs", {"project": "demo", "deployment_key": "", "spec": spec}, token=OP))
    obs("job unknown project + bad spec", call(cp, "POST", "/v1/jobs", {"project": "nope", "deployment_key": "k", "spec": {"steps": 0, "step_ms": 0}}, token=OP))
    obs("job exists + bad spec", call(cp, "POST", "/v1/jobs", {"project": "demo", "id": "j2", "deployment_key": "k", "spec": {"steps": 0, "step_ms": 0}}, token=OP))
    for label, sp in [("steps 0", {"steps": 0, "step_ms": 0}), ("steps 1000", {"steps": 1000, "step_ms": 0}),
                      ("steps 1001", {"steps": 1001, "step_ms": 0}), ("steps u32max", {"steps": 4294967295, "step_ms": 0}),
                      ("steps 2^32", {"steps": 4294967296, "step_ms": 0}), ("steps -1", {"steps": -1, "step_ms": 0}),
                      ("steps 1.0", {"steps": 1.0, "step_ms": 0}), ("steps '1'", {"steps": "1", "step_ms": 0}),
                      ("steps true", {"steps": True, "step_ms": 0}), ("step_ms 600001", {"steps": 1, "step_ms": 600001}),
                      ("step_ms 600000", {"steps": 1, "step_ms": 600000}), ("step_ms 2^64", {"steps": 1, "step_ms": 2**64}),
                      ("step_ms 2^63", {"steps": 1, "step_ms": 2**63}), ("spec missing", {"steps": 1}),
                      ("spec extra", {"steps": 1, "step_ms": 0, "x": 1}), ("spec null", None),
                      ("steps 1e3", "RAW")]:
        if sp == "RAW":
            ans = call(cp, "POST", "/v1/jobs", raw=b'{"project":"demo","deployment_key":"kk","spec":{"steps":1e3,"step_ms":0}}', token=OP)
        else:
            ans = call(cp, "POST", "/v1/jobs", {"project": "demo", "id": "s-" + label.replace(" ", "_").replace("'", "").replace("^", ""), "deployment_key": "kspec", "spec": sp}, token=OP)
        obs(f"job spec {label}", ans)
    # ---- reads -----------------------------------------------------------------------------
    obs("jobs list", call(cp, "GET", "/v1/jobs", token=OP), full=True)
    obs("jobs list runner", call(cp, "GET", "/v1/jobs", token=r1["token"]))
    obs("jobs list noauth", call(cp, "GET", "/v1/jobs"))
    obs("jobs list query", call(cp, "GET", "/v1/jobs?x=1", token=OP))
    obs("jobs trailing slash", call(cp, "GET", "/v1/jobs/", token=OP))
    obs("health trailing slash", call(cp, "GET", "/v1/health/"))
    obs("health query", call(cp, "GET", "/v1/health?x=1"))
    obs("health double slash", call(cp, "GET", "//v1/health"))
    obs("job j2", call(cp, "GET", "/v1/jobs/j2", token=OP), full=True)
    obs("job unknown", call(cp, "GET", "/v1/jobs/nope", token=OP))
    obs("job bad utf8 path noauth", call(cp, "GET", "/v1/jobs/%FF"))
    obs("job bad utf8 path", call(cp, "GET", "/v1/jobs/%FF", token=OP))
    obs("job space path", call(cp, "GET", "/v1/jobs/a%20b", token=OP))
    obs("job encoded j2", call(cp, "GET", "/v1/jobs/%6A2", token=OP))
    obs("job bad escape", call(cp, "GET", "/v1/jobs/%G1", token=OP))
    obs("job sub path", call(cp, "GET", "/v1/jobs/j2/x", token=OP))
    obs("job runner token", call(cp, "GET", "/v1/jobs/j2", token=r1["token"]))
    obs("job unknown runner token", call(cp, "GET", "/v1/jobs/nope", token=r1["token"]))
    obs("job query", call(cp, "GET", "/v1/jobs/j2?x=1", token=OP))
    obs("delete jobs", call(cp, "DELETE", "/v1/jobs", token=OP))
    obs("put claim", call(cp, "PUT", "/v1/claim", token=OP))
    obs("get claim", call(cp, "GET", "/v1/claim", token=OP))
    obs("post job view", call(cp, "POST", "/v1/jobs/j2", {}, token=OP))
    obs("post ledger", call(cp, "POST", "/v1/ledger", {}, token=OP))
    obs("head jobs", call(cp, "HEAD", "/v1/jobs", token=OP))
    obs("head health", call(cp, "HEAD", "/v1/health"))
    obs("options health", call(cp, "OPTIONS", "/v1/health"))
    obs("unknown path", call(cp, "GET", "/nope"))
    obs("unknown path post", call(cp, "POST", "/v1/nope", {}, token=OP))
    obs("root", call(cp, "GET", "/"))
    for q in ["after=-1", "after=abc", "after=", "limit=0", "after=%2B5", "after=+5", "x=1",
              "after=1&after=2", "after=18446744073709551615", "after=18446744073709551616",
              "limit=99999999999999999999", "limit=4294967295", "limit=4294967296", "after=%35", "after=1.0", "after=0x1", "after=%201",
              "after", "&", "after=1&", "limit=-0", "after=-0", "after=0&limit=2"]:
        obs(f"ledger ?{q}", call(cp, "GET", "/v1/ledger?" + q, token=OP), full=True)
    obs("ledger bad query noauth", call(cp, "GET", "/v1/ledger?after=x"))
    obs("ledger runner", call(cp, "GET", "/v1/ledger", token=r1["token"]))
    # ---- claim -----------------------------------------------------------------------------
    t1 = r1["token"]
    obs("claim by operator", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 1}, token=OP))
    obs("claim mismatch", call(cp, "POST", "/v1/claim", {"runner": "r2", "observed_ms": 1}, token=t1))
    obs("claim mismatch bad body", call(cp, "POST", "/v1/claim", {"runner": "r2"}, token=t1))
    obs("claim observed float", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 1.5}, token=t1))
    obs("claim observed huge", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 2**63}, token=t1))
    obs("claim by reg", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 1}, token=reg_other))
    g = obs("claim 1", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": -5}, token=t1), full=True)[2]["grant"]
    claim = dict(g["claim"], observed_ms=123)
    # ---- reports ----------------------------------------------------------------------------
    obs("hb fence 2^63", call(cp, "POST", "/v1/heartbeat", dict(claim, fence=2**63), token=t1))
    obs("hb fence 2^64", call(cp, "POST", "/v1/heartbeat", dict(claim, fence=2**64), token=t1))
    obs("hb fence 2^63 mismatch", call(cp, "POST", "/v1/heartbeat", dict(claim, fence=2**63, runner="r2"), token=t1))
    obs("hb fence 2^63 unknown job", call(cp, "POST", "/v1/heartbeat", dict(claim, fence=2**63, job="nope"), token=t1))
    obs("hb mismatch unknown job", call(cp, "POST", "/v1/heartbeat", dict(claim, runner="r2", job="nope"), token=t1))
    obs("hb by operator", call(cp, "POST", "/v1/heartbeat", claim, token=OP))
    obs("hb unknown job", call(cp, "POST", "/v1/heartbeat", dict(claim, job="nope"), token=t1))
    obs("hb job of other project", call(cp, "POST", "/v1/heartbeat", dict(claim, job="ox"), token=t1))
    obs("hb unknown attempt", call(cp, "POST", "/v1/heartbeat", dict(claim, attempt="zz"), token=t1), full=True)
    obs("hb wrong fence", call(cp, "POST", "/v1/heartbeat", dict(claim, fence=claim["fence"] + 5), token=t1), full=True)
    obs("hb other job's attempt", call(cp, "POST", "/v1/heartbeat", dict(claim, job="j1"), token=t1), full=True)
    obs("hb missing observed", call(cp, "POST", "/v1/heartbeat", {k: v for k, v in claim.items() if k != "observed_ms"}, token=t1))
    obs("hb with outcome", call(cp, "POST", "/v1/heartbeat", dict(claim, outcome="succeeded"), token=t1))
    obs("hb ok", call(cp, "POST", "/v1/heartbeat", claim, token=t1), full=True)
    cap = obs("cap ok", call(cp, "POST", "/v1/capability", claim, token=t1), full=True)
    obs("cap wrong fence", call(cp, "POST", "/v1/capability", dict(claim, fence=claim["fence"] + 7), token=t1), full=True)
    obs("result no outcome", call(cp, "POST", "/v1/result", claim, token=t1))
    obs("result bad outcome", call(cp, "POST", "/v1/result", dict(claim, outcome="ok"), token=t1))
    obs("result detail number", call(cp, "POST", "/v1/result", dict(claim, outcome="succeeded", detail=5), token=t1))
    obs("result wrong fence", call(cp, "POST", "/v1/result", dict(claim, outcome="succeeded", fence=claim["fence"] + 7), token=t1), full=True)
    obs("result ok", call(cp, "POST", "/v1/result", dict(claim, outcome="succeeded", detail=None), token=t1), full=True)
    obs("result dup", call(cp, "POST", "/v1/result", dict(claim, outcome="succeeded", detail="again"), token=t1), full=True)
    obs("result conflict", call(cp, "POST", "/v1/result", dict(claim, outcome="failed"), token=t1), full=True)
    obs("hb after result", call(cp, "POST", "/v1/heartbeat", claim, token=t1), full=True)
    obs("cap after result", call(cp, "POST", "/v1/capability", claim, token=t1), full=True)
    obs("result dup wrong fence", call(cp, "POST", "/v1/result", dict(claim, outcome="succeeded", fence=claim["fence"] + 1), token=t1), full=True)
    # ---- expiry and reconcile -------------------------------------------------------------------
    g2 = obs("claim 2", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 0}, token=t1), full=True)[2]["grant"]
    c2 = dict(g2["claim"], observed_ms=0)
    rc = {"job": c2["job"], "attempt": c2["attempt"], "finding": "stopped"}
    obs("reconcile running", call(cp, "POST", "/v1/reconcile", rc, token=OP))
    obs("reconcile by runner", call(cp, "POST", "/v1/reconcile", rc, token=t1))
    obs("reconcile completed no outcome", call(cp, "POST", "/v1/reconcile", dict(rc, finding="completed"), token=OP))
    obs("reconcile stopped with outcome", call(cp, "POST", "/v1/reconcile", dict(rc, outcome="failed"), token=OP))
    obs("reconcile bad finding", call(cp, "POST", "/v1/reconcile", dict(rc, finding="gone"), token=OP))
    obs("reconcile unknown job", call(cp, "POST", "/v1/reconcile", dict(rc, job="nope"), token=OP))
    obs("reconcile unknown job no outcome", call(cp, "POST", "/v1/reconcile", dict(rc, job="nope", finding="completed"), token=OP))
    obs("reconcile unknown attempt", call(cp, "POST", "/v1/reconcile", dict(rc, attempt="nope"), token=OP))
    obs("reconcile other job's attempt", call(cp, "POST", "/v1/reconcile", dict(rc, attempt=claim["attempt"]), token=OP))
    obs("reconcile by runner no outcome", call(cp, "POST", "/v1/reconcile", dict(rc, finding="completed"), token=t1))
    time.sleep(lease_ms / 1000 + 0.4)
    obs("job after expiry", call(cp, "GET", f"/v1/jobs/{c2['job']}", token=OP), full=True)
    obs("hb after expiry", call(cp, "POST", "/v1/heartbeat", c2, token=t1), full=True)
    obs("claim while uncertain", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 0}, token=t1), full=True)
    obs("reconcile still-running", call(cp, "POST", "/v1/reconcile", dict(rc, finding="still-running", evidence="seen"), token=OP), full=True)
    obs("reconcile stopped", call(cp, "POST", "/v1/reconcile", dict(rc, evidence="frozen"), token=OP), full=True)
    obs("reconcile again", call(cp, "POST", "/v1/reconcile", rc, token=OP))
    obs("result after stopped", call(cp, "POST", "/v1/result", dict(c2, outcome="succeeded"), token=t1), full=True)
    g3 = obs("claim 3 (requeued)", call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 0}, token=t1), full=True)[2]["grant"]
    c3 = dict(g3["claim"], observed_ms=0)
    obs("old attempt superseded", call(cp, "POST", "/v1/heartbeat", c2, token=t1), full=True)
    time.sleep(lease_ms / 1000 + 0.4)
    obs("reconcile completed", call(cp, "POST", "/v1/reconcile", {"job": c3["job"], "attempt": c3["attempt"], "finding": "completed", "outcome": "succeeded"}, token=OP), full=True)
    obs("result after completed", call(cp, "POST", "/v1/result", dict(c3, outcome="succeeded"), token=t1), full=True)
    obs("reconcile superseded attempt", call(cp, "POST", "/v1/reconcile", dict(rc, finding="stopped"), token=OP))
    obs("ledger", call(cp, "GET", "/v1/ledger", token=OP), full=True)
    obs("jobs list end", call(cp, "GET", "/v1/jobs", token=OP), full=True)
    # ---- last: cases where the reference is known to accept what the docs refuse ------------
    obs("job spec as array", call(cp, "POST", "/v1/jobs", {"project": "demo", "id": "s-arr", "deployment_key": "kspec", "spec": [1, 2]}, token=OP))
    obs("project body as array", call(cp, "POST", "/v1/projects", raw=b'["p-arr"]', token=OP))
    obs("claim body as array", call(cp, "POST", "/v1/claim", raw=b'["r1", 5]', token=t1))
    obs("lowercase bearer", call(cp, "POST", "/v1/projects", {"id": "p-lower"},
                                 headers={"Authorization": f"bearer {OP}"}))
    obs("two spaces", call(cp, "POST", "/v1/projects", {"id": "p-two"},
                           headers={"Authorization": f"Bearer  {OP}"}))
    obs("BEARER", call(cp, "POST", "/v1/projects", {"id": "p-upper"},
                       headers={"Authorization": f"BEARER {OP}"}))
    obs("trailing space token", call(cp, "POST", "/v1/projects", {"id": "p-trail"},
                                     headers={"Authorization": f"Bearer {OP} "}))
    obs("tab separator", call(cp, "POST", "/v1/projects", {"id": "p-tab"},
                              headers={"Authorization": f"Bearer\t{OP}"}))
    return out


def target_script(tg: str, cp: str | None) -> list[tuple[str, object]]:
    from common import sign_capability  # same HMAC as both control planes are checked for

    out: list[tuple[str, object]] = []

    def obs(label, answer, full=False):
        status, headers, body = answer
        seen = (status, shape(body) if full else code_of(answer))
        if status == 405:
            seen = seen + (headers.get("allow"),)
        out.append((label, seen))
        return answer

    far = int(time.time() * 1000) + 600_000

    def cap(key="prod", job="j1", attempt="j1-a1", runner="r1", fence=5, expires=far, sig=None):
        c = {"deployment_key": key, "job": job, "attempt": attempt, "runner": runner,
             "fence": fence, "expires_ms": expires}
        c["signature"] = sig if sig is not None else sign_capability(SECRET, c)
        return c

    def step(c, s=0, n=2, d=0):
        return {"capability": c, "step": s, "steps": n, "duration_ms": d}

    obs("health", call(tg, "GET", "/v1/health"), full=True)
    obs("deployment unknown", call(tg, "GET", "/v1/deployments/prod"))
    obs("deployment bad utf8", call(tg, "GET", "/v1/deployments/%FF"))
    obs("no ctype", call(tg, "POST", "/v1/steps", raw=json.dumps(step(cap())).encode(), headers={"Content-Type": None}))
    obs("too large", call(tg, "POST", "/v1/steps", raw=b" " * 70000))
    obs("malformed", call(tg, "POST", "/v1/steps", raw=b"{"))
    obs("not object", call(tg, "POST", "/v1/steps", raw=b"[]"))
    obs("unknown field", call(tg, "POST", "/v1/steps", dict(step(cap()), x=1)))
    obs("cap unknown field", call(tg, "POST", "/v1/steps", step(dict(cap(), x=1))))
    obs("steps 0", call(tg, "POST", "/v1/steps", step(cap(), 0, 0)))
    obs("step = steps", call(tg, "POST", "/v1/steps", step(cap(), 2, 2)))
    obs("duration 600001", call(tg, "POST", "/v1/steps", step(cap(), d=600001)))
    obs("steps 2^32", call(tg, "POST", "/v1/steps", step(cap(), 0, 2**32)))
    obs("fence 2^63", call(tg, "POST", "/v1/steps", step(cap(key="huge", fence=2**63))), full=True)
    obs("fence 2^64", call(tg, "POST", "/v1/steps", step(cap(fence=2**64))))
    obs("bad ids in cap", call(tg, "POST", "/v1/steps", step(cap(key="bad key", job="", runner="a\nb", fence=1))), full=True)
    obs("bad signature new key", call(tg, "POST", "/v1/steps", step(cap(key="k-bad", sig="00" * 32))), full=True)
    obs("deployment after refused", call(tg, "GET", "/v1/deployments/k-bad"), full=True)
    obs("apply f5 s0", call(tg, "POST", "/v1/steps", step(cap())), full=True)
    obs("apply f5 s0 again", call(tg, "POST", "/v1/steps", step(cap())), full=True)
    obs("apply f7 s0", call(tg, "POST", "/v1/steps", step(cap(fence=7, attempt="j1-a2"))), full=True)
    obs("stale f5 s1", call(tg, "POST", "/v1/steps", step(cap(), 1)), full=True)
    obs("expired", call(tg, "POST", "/v1/steps", step(cap(fence=9, expires=1000))), full=True)
    obs("negative expires", call(tg, "POST", "/v1/steps", step(cap(fence=9, expires=-5))), full=True)
    obs("uppercase signature", call(tg, "POST", "/v1/steps", step(cap(fence=9, sig=cap(fence=9)["signature"].upper()))), full=True)
    obs("odd signature", call(tg, "POST", "/v1/steps", step(cap(fence=9, sig="abc"))), full=True)
    obs("nonhex signature", call(tg, "POST", "/v1/steps", step(cap(fence=9, sig="zz" * 32))), full=True)
    obs("tampered", call(tg, "POST", "/v1/steps", step(dict(cap(fence=9), fence=10))), full=True)
    obs("signature spaced", call(tg, "POST", "/v1/steps", step(cap(fence=9, sig=" ".join([cap(fence=9)["signature"][:2], cap(fence=9)["signature"][2:]])))), full=True)
    obs("deployment prod", call(tg, "GET", "/v1/deployments/prod"), full=True)
    obs("deployment query", call(tg, "GET", "/v1/deployments/prod?x=1"), full=True)
    t0 = time.monotonic()
    obs("duration 300", call(tg, "POST", "/v1/steps", step(cap(fence=11), d=300)), full=True)
    took = time.monotonic() - t0
    out.append(("duration 300 took >= 0.3s", took >= 0.29))
    for q in ["", "after=1", "after=1&limit=2", "limit=0", "after=999", "after=-1", "x=1", "after=1&after=1",
              "limit=100001", "after=18446744073709551616", "limit=4294967296",
              "limit=18446744073709551615"]:
        obs(f"steps ?{q}", call(tg, "GET", "/v1/steps?" + q if q else "/v1/steps"), full=True)
    obs("deployment huge", call(tg, "GET", "/v1/deployments/huge"), full=True)
    obs("delete steps", call(tg, "DELETE", "/v1/steps"))
    obs("post deployments", call(tg, "POST", "/v1/deployments/prod", {}))
    obs("unknown", call(tg, "GET", "/v1/nope"))
    return out


def target_mode_script(tg: str, mode: str) -> list[tuple[str, object]]:
    """Idempotent and unfenced targets: what they refuse and what they apply."""
    from common import sign_capability

    out = []
    far = int(time.time() * 1000) + 600_000

    def send(label, fence, step=0, job="j1", sig=None, expires=far, key="prod"):
        c = {"deployment_key": key, "job": job, "attempt": f"{job}-a1", "runner": "r1",
             "fence": fence, "expires_ms": expires}
        c["signature"] = sig if sig is not None else sign_capability(SECRET, c)
        ans = call(tg, "POST", "/v1/steps", {"capability": c, "step": step, "steps": 3, "duration_ms": 0})
        out.append((f"{mode} {label}", (ans[0], shape(ans[2]))))

    send("first", 5)
    send("same step again", 5)
    send("same step other fence", 9)
    send("next step lower fence", 2, step=1)
    send("bad signature", 5, step=2, sig="00" * 32)
    send("expired", 5, step=2, expires=1)
    send("other job same step", 1, job="j2")
    send("garbage signature new key", 1, sig="xyz", key="k2")
    out.append((f"{mode} deployment", shape(call(tg, "GET", "/v1/deployments/prod")[2])))
    out.append((f"{mode} deployment k2", shape(call(tg, "GET", "/v1/deployments/k2")[2])))
    return out


def run_conformance(ref: str, work: str, dump: str | None = None) -> tuple[int, list[str]]:
    diffs = []
    results = {}
    for lab in (Lab("ref", ref), Lab("py", None)):
        d = os.path.join(work, "conformance", lab.name)
        os.makedirs(d, exist_ok=True)
        try:
            _, cp = lab.control_plane(d, lease_ms=1000)
            _, tg = lab.target(d)
            _, tg_i = lab.target(d, mode="idempotent")
            _, tg_u = lab.target(d, mode="unfenced")
            results[lab.name] = (control_plane_script(cp, 1000), target_script(tg, cp),
                                 target_mode_script(tg_i, "idempotent")
                                 + target_mode_script(tg_u, "unfenced"))
        finally:
            stop_all()
    if dump:
        with open(dump, "w") as fh:
            json.dump(results, fh, indent=1)
    checks = 0
    for which, (a, b) in zip(("control-plane", "target", "target-modes"),
                             zip(results["ref"], results["py"])):
        for (la, va), (lb, vb) in zip(a, b):
            checks += 1
            if va != vb:
                diffs.append(f"{which} / {la}:\n    ref: {json.dumps(va)}\n    py:  {json.dumps(vb)}")
    return checks, diffs


# ====================================================================== capabilities


def run_capabilities(ref: str, work: str) -> list[str]:
    """A capability from each control plane is sent to each target: the signatures must
    verify both ways, and a tampered copy must be refused both ways."""
    failures = []
    d = os.path.join(work, "capabilities")
    os.makedirs(d, exist_ok=True)
    labs = {"ref": Lab("ref", ref), "py": Lab("py", None)}
    cps, tgs = {}, {}
    for name, lab in labs.items():
        cps[name] = lab.control_plane(d, lease_ms=5000)[1]
        tgs[name] = lab.target(d)[1]
    caps = {}
    for name, cp in cps.items():
        call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP)
        tok = call(cp, "POST", "/v1/runners", {"id": "r1", "project": "demo"}, token=OP)[2]["token"]
        call(cp, "POST", "/v1/jobs", {"project": "demo", "deployment_key": f"key-{name}", "spec": {"steps": 1, "step_ms": 0}}, token=OP)
        g = call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 0}, token=tok)[2]["grant"]
        ans = call(cp, "POST", "/v1/capability", dict(g["claim"], observed_ms=0), token=tok)
        caps[name] = ans[2]["capability"]
    for signer, cap in caps.items():
        for verifier, tg in tgs.items():
            ans = call(tg, "POST", "/v1/steps", {"capability": cap, "step": 0, "steps": 1, "duration_ms": 0})
            ok = ans[0] == 200 and ans[2]["record"]["applied"]
            print(f"  capability signed by {signer}, verified by {verifier} target: "
                  f"{'applied' if ok else 'REFUSED ' + json.dumps(ans[2])}")
            if not ok:
                failures.append(f"{signer}-signed capability refused by {verifier} target: {ans[2]}")
            bad = dict(cap, fence=cap["fence"] + 1)
            ans = call(tg, "POST", "/v1/steps", {"capability": bad, "step": 0, "steps": 1, "duration_ms": 0})
            if not (ans[0] == 409 and ans[2]["record"].get("reason") == "bad_signature"):
                failures.append(f"tampered {signer} capability not refused as bad_signature by {verifier}: {ans}")
    stop_all()
    return failures


# ====================================================================== runners


def check_runner_pair(runner_lab: Lab, server_lab: Lab, work: str, jobs: int = 6,
                      runners: int = 2, timeout_s: float = 60.0) -> list[str]:
    """Start ``server_lab``'s control plane and target, ``runner_lab``'s runners, push
    ``jobs`` jobs over two keys, and wait (bounded) for all to succeed."""
    failures = []
    label = f"{runner_lab.name} runners → {server_lab.name} servers"
    d = os.path.join(work, f"runners-{runner_lab.name}-on-{server_lab.name}")
    os.makedirs(d, exist_ok=True)
    try:
        _, cp = server_lab.control_plane(d, lease_ms=2000)
        _, tg = server_lab.target(d)
        call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP)
        procs = []
        for i in range(1, runners + 1):
            tok = call(cp, "POST", "/v1/runners", {"id": f"r{i}", "project": "demo"}, token=OP)[2]["token"]
            procs.append(runner_lab.runner(d, f"r{i}", tok, cp, tg))
        for i in range(jobs):
            call(cp, "POST", "/v1/jobs", {"project": "demo", "deployment_key": f"key-{i % 2}",
                                          "spec": {"steps": 3, "step_ms": 20}}, token=OP)
        deadline = time.monotonic() + timeout_s
        views = []
        while time.monotonic() < deadline:
            views = call(cp, "GET", "/v1/jobs", token=OP)[2]
            if all(v["state"] in ("succeeded", "failed") for v in views):
                break
            time.sleep(0.2)
        states = [v["state"] for v in views]
        print(f"  {label}: job states {states}")
        if states.count("succeeded") != jobs:
            failures.append(f"{label}: not every job succeeded within {timeout_s}s: {states}")
        steps = call(tg, "GET", "/v1/steps")[2]
        applied = sum(1 for s in steps if s["applied"])
        print(f"  {label}: {applied} steps applied, {len(steps) - applied} refused")
        if applied != jobs * 3:
            failures.append(f"{label}: {applied} applied steps, expected {jobs * 3}")
        ledger = call(cp, "GET", "/v1/ledger?limit=10000", token=OP)[2]
        kinds = {}
        for e in ledger:
            kinds[(e["kind"], e.get("decision"))] = kinds.get((e["kind"], e.get("decision")), 0) + 1
        print(f"  {label}: ledger {sorted(kinds.items(), key=str)}")
        for p in procs:
            if not p.alive() and p.p.returncode not in (0, None):
                failures.append(f"{label}: {p.name} exited {p.p.returncode}: "
                                f"{open(p.err_path).read()[-500:]}")
        # the runner's log must be readable events of the history vocabulary
        for i in range(1, runners + 1):
            path = os.path.join(d, f"{runner_lab.name}-r{i}.jsonl")
            failures += check_runner_log(path, f"r{i}")
    finally:
        stop_all()
    return failures


RUNNER_LOG_FIELDS = {"index", "time_ns", "process", "type", "f", "project", "job", "attempt", "runner",
                     "fence", "key", "received_ms", "observed_ms", "lease_expires_ms", "decision",
                     "reason", "outcome", "value"}


def check_runner_log(path: str, rid: str) -> list[str]:
    """The documented shape of a runner's --log file (docs/history.md)."""
    failures = []
    if not os.path.exists(path):
        return [f"{path}: no runner log written"]
    last = -1
    with open(path) as fh:
        lines = fh.read().splitlines()
    for n, line in enumerate(lines, 1):
        try:
            ev = json.loads(line)
        except ValueError:
            if n == len(lines):
                continue  # a torn last line is allowed
            failures.append(f"{path}:{n}: not JSON")
            continue
        extra = set(ev) - RUNNER_LOG_FIELDS
        if extra:
            failures.append(f"{path}:{n}: unknown fields {sorted(extra)}")
        if ev.get("process") != f"runner:{rid}":
            failures.append(f"{path}:{n}: process {ev.get('process')!r}")
        if ev.get("type") not in ("request", "response", "info"):
            failures.append(f"{path}:{n}: type {ev.get('type')!r}")
        if ev.get("f") not in ("claim", "heartbeat", "capability", "result", "step"):
            failures.append(f"{path}:{n}: f {ev.get('f')!r}")
        if ev.get("decision") not in (None, "accepted", "rejected", "duplicate", "conflict"):
            failures.append(f"{path}:{n}: decision {ev.get('decision')!r}")
        if ev.get("index", 0) != 0:
            failures.append(f"{path}:{n}: index {ev.get('index')!r} (the reference writes 0)")
        if ev.get("time_ns", -1) < last:
            failures.append(f"{path}:{n}: time_ns goes backwards")
        last = ev.get("time_ns", last)
    return failures[:20]


def log_shapes(path: str) -> dict:
    """(type, f, decision, reason kind) -> the sorted field names and value keys seen."""
    shapes: dict = {}
    if not os.path.exists(path):
        return shapes
    for line in open(path):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        reason = ev.get("reason")
        kind = (ev["type"], ev["f"], ev.get("decision"),
                reason if reason in ("none_claimable", None) or ev.get("decision") else "text")
        shapes.setdefault(str(kind), set()).add(
            (tuple(ev), tuple(sorted((ev.get("value") or {}).keys()))))
    return shapes


def compare_logs(ref_path: str, py_path: str) -> list[str]:
    """The same kinds of event must carry the same fields in both runners' logs."""
    a, b = log_shapes(ref_path), log_shapes(py_path)
    out = []
    for kind in sorted(set(a) & set(b)):
        if a[kind] != b[kind]:
            out.append(f"runner log {kind}: ref {sorted(a[kind])} py {sorted(b[kind])}")
    return out


# ====================================================================== behaviour under faults


def wait_until(pred, timeout_s: float, every: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    return None


def job_story(cp: str, job: str) -> list[str]:
    """The job's ledger as words, consecutive repeats collapsed (heartbeat counts vary)."""
    view = call(cp, "GET", f"/v1/jobs/{job}", token=OP)[2]
    words = []
    for e in view["ledger"]:
        w = e["kind"]
        for k in ("decision", "reason", "recorded_as", "outcome"):
            if k in e:
                w += f" {e[k]}"
        if e["kind"] != "submit" and "attempt" in e:
            w = f"{e['attempt']}: {w}"
        if not words or words[-1] != w:
            words.append(w)
    return words + [f"final {view['state']}"]


def applied_steps(tg: str, job: str) -> int:
    return sum(1 for s in call(tg, "GET", "/v1/steps")[2] if s["job"] == job and s["applied"])


def run_behaviour(runner_lab: Lab, server_lab: Lab, work: str) -> dict:
    """Scenarios with faults for one runner implementation on one lab's servers; returns
    {scenario: facts} to compare between runner implementations."""
    d = os.path.join(work, f"behaviour-{runner_lab.name}-on-{server_lab.name}")
    os.makedirs(d, exist_ok=True)
    facts = {}
    lease = 1500
    try:
        _, cp = server_lab.control_plane(d, lease_ms=lease)
        _, tg = server_lab.target(d)
        call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP)

        def runner(rid, *extra, via=None):
            tok = call(cp, "POST", "/v1/runners", {"id": rid, "project": "demo"}, token=OP)[2]["token"]
            return runner_lab.runner(d, rid, tok, via or cp, tg, extra=list(extra))

        def submit(job, steps, step_ms):
            call(cp, "POST", "/v1/jobs", {"project": "demo", "id": job, "deployment_key": job,
                                          "spec": {"steps": steps, "step_ms": step_ms}}, token=OP)

        def state(job):
            return call(cp, "GET", f"/v1/jobs/{job}", token=OP)[2]["state"]

        def settle(job, timeout_s=20):
            return wait_until(lambda: state(job) in ("succeeded", "failed"), timeout_s)

        # 1. a job long enough to need heartbeats
        r = runner("r-normal")
        submit("normal", 4, 300)
        settle("normal")
        facts["normal"] = job_story(cp, "normal")
        r.stop()

        # 2. the runner stalls (SIGSTOP) past its lease, then wakes up
        r = runner("r-pause")
        submit("pause", 6, 300)
        wait_until(lambda: applied_steps(tg, "pause") >= 1, 10)
        os.kill(r.p.pid, signal.SIGSTOP)
        wait_until(lambda: state("pause") == "uncertain", 5)
        time.sleep(0.3)
        os.kill(r.p.pid, signal.SIGCONT)
        time.sleep(2.0)
        story = job_story(cp, "pause")
        view = call(cp, "GET", "/v1/jobs/pause", token=OP)[2]
        call(cp, "POST", "/v1/reconcile", {"job": "pause", "attempt": view["current_attempt"],
                                           "finding": "stopped", "evidence": "runner stalled"}, token=OP)
        settle("pause")
        facts["pause"] = job_story(cp, "pause")
        facts["pause (before reconcile)"] = story
        r.stop()

        # 3. the control link is cut mid-deployment for 2.5 s
        px = Proxy(cp)
        r = runner("r-cut", via=px.addr)
        submit("cut", 6, 300)
        wait_until(lambda: applied_steps(tg, "cut") >= 1, 10)
        px.set("down")
        wait_until(lambda: state("cut") == "uncertain", 5)
        time.sleep(1.0)
        steps_when_cut = applied_steps(tg, "cut")
        px.set("up")
        time.sleep(2.5)
        story = job_story(cp, "cut")
        view = call(cp, "GET", "/v1/jobs/cut", token=OP)[2]
        call(cp, "POST", "/v1/reconcile", {"job": "cut", "attempt": view["current_attempt"],
                                           "finding": "stopped"}, token=OP)
        settle("cut")
        facts["cut (before reconcile)"] = story
        facts["cut: steps applied after the link went down"] = applied_steps(tg, "cut") > steps_when_cut + 6
        facts["cut"] = job_story(cp, "cut")
        r.stop()
        px.close()

        # 4. the runner's clock 90 s behind: nothing changes but observed_ms
        off = os.path.join(d, "skew.offset")
        with open(off, "w") as fh:
            fh.write("-90000")
        r = runner("r-skew", "--clock-offset-file", off)
        submit("skew", 3, 300)
        settle("skew")
        facts["skew"] = job_story(cp, "skew")
        view = call(cp, "GET", "/v1/jobs/skew", token=OP)[2]
        lags = [e["received_ms"] - e["observed_ms"] for e in view["ledger"] if "observed_ms" in e]
        facts["skew: observed_ms 90 s behind"] = bool(lags) and all(89_000 < x < 91_000 for x in lags)
        r.stop()

        # 5. the answer to the result is lost; the runner retries; the retry is a duplicate
        px = Proxy(cp)
        r = runner("r-lost", via=px.addr)
        submit("lost", 3, 500)
        # mute once the last step's capability is redeemed: the step is then in flight
        wait_until(lambda: sum(1 for e in call(cp, "GET", "/v1/jobs/lost", token=OP)[2]["ledger"]
                               if e["kind"] == "capability") >= 3, 10, every=0.01)
        time.sleep(0.1)  # let the capability's answer through first
        px.set("mute")
        wait_until(lambda: state("lost") in ("succeeded", "failed"), 5)
        time.sleep(0.3)
        px.set("up")
        settle("lost")
        time.sleep(2.0)
        facts["lost"] = job_story(cp, "lost")
        r.stop()
        px.close()
    finally:
        stop_all()
    return facts


def compare_behaviour(ref: str, work: str) -> list[str]:
    failures = []
    for server in (Lab("ref", ref), Lab("py", None)):
        a = run_behaviour(Lab("ref", ref), server, work)
        b = run_behaviour(Lab("py", None), server, work)
        for k in a:
            same = a[k] == b[k]
            print(f"  [{server.name} servers] {k}: {'same' if same else 'DIFFERENT'}")
            if not same or k in ("pause (before reconcile)", "cut (before reconcile)"):
                print(f"      ref runner: {a[k]}")
                print(f"      py runner:  {b[k]}")
        for name, facts in (("ref", a), ("py", b)):
            if facts["normal"][-1] != "final succeeded":
                failures.append(f"{name} runner on {server.name}: the normal job did not succeed")
            if not facts["skew: observed_ms 90 s behind"]:
                failures.append(f"{name} runner on {server.name}: observed_ms not 90 s behind")
            if facts["cut: steps applied after the link went down"]:
                failures.append(f"{name} runner on {server.name}: steps went on without authority")
            if not any("duplicate" in w for w in facts["lost"]):
                failures.append(f"{name} runner on {server.name}: no duplicate after a lost result answer")
            for k in ("pause (before reconcile)", "cut (before reconcile)"):
                accepted_after_expiry = False
                expired = False
                for w in facts[k]:
                    if "expire" in w:
                        expired = True
                    elif expired and "accepted" in w and "claim" not in w:
                        accepted_after_expiry = True
                if accepted_after_expiry:
                    failures.append(f"{name} runner on {server.name}: {k}: accepted after expiry")
    return failures


# ====================================================================== planted bugs


def bug_sequences(cp: str, tg: str, lease_ms: int) -> list[tuple[str, object]]:
    """Short direct sequences whose answers differ between the correct lab and a bug."""
    from common import sign_capability

    out = []
    call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP)
    tok = call(cp, "POST", "/v1/runners", {"id": "r1", "project": "demo"}, token=OP)[2]["token"]

    def claim(job):
        call(cp, "POST", "/v1/jobs", {"project": "demo", "id": job, "deployment_key": job,
                                      "spec": {"steps": 1, "step_ms": 0}}, token=OP)
        g = call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 0}, token=tok)[2]["grant"]
        return g

    def obs(label, ans):
        out.append((label, code_of(ans)))

    # a result after the lease lapsed (accept-stale-result)
    g = claim("late")
    c = dict(g["claim"], observed_ms=int(time.time() * 1000))
    time.sleep(lease_ms / 1000 + 0.3)
    obs("late result", call(cp, "POST", "/v1/result", dict(c, outcome="succeeded"), token=tok))
    obs("late result: job", (200, {"code": call(cp, "GET", "/v1/jobs/late", token=OP)[2]["state"]}, None))
    # a superseded attempt's result (accept-stale-result)
    g = claim("sup")
    c = dict(g["claim"], observed_ms=0)
    time.sleep(lease_ms / 1000 + 0.3)
    call(cp, "POST", "/v1/reconcile", {"job": "sup", "attempt": c["attempt"], "finding": "stopped"}, token=OP)
    g2 = call(cp, "POST", "/v1/claim", {"runner": "r1", "observed_ms": 0}, token=tok)[2]["grant"]
    obs("superseded result", call(cp, "POST", "/v1/result", dict(c, outcome="succeeded"), token=tok))
    obs("superseded result: job", (200, {"code": call(cp, "GET", "/v1/jobs/sup", token=OP)[2]["state"]}, None))
    # a late heartbeat and result whose runner clock says the lease is still live
    # (trust-runner-clock)
    g = claim("skew")
    c = dict(g["claim"], observed_ms=g["lease_expires_ms"] - lease_ms)
    time.sleep(lease_ms / 1000 + 0.3)
    obs("late heartbeat, early runner clock", call(cp, "POST", "/v1/heartbeat", c, token=tok))
    obs("late result, early runner clock", call(cp, "POST", "/v1/result", dict(c, outcome="succeeded"), token=tok))
    obs("late result, early runner clock: job", (200, {"code": call(cp, "GET", "/v1/jobs/skew", token=OP)[2]["state"]}, None))
    # a live heartbeat whose runner clock is far ahead (trust-runner-clock)
    g = claim("ahead")
    c = dict(g["claim"], observed_ms=g["lease_expires_ms"] + 60_000)
    obs("live heartbeat, runner clock ahead", call(cp, "POST", "/v1/heartbeat", c, token=tok))
    # a lower fence after a higher one on the target (target-ignores-fence)
    far = int(time.time() * 1000) + 60_000
    for fence in (7, 5):
        cap = {"deployment_key": "tk", "job": "tj", "attempt": f"tj-a{fence}", "runner": "r1",
               "fence": fence, "expires_ms": far}
        cap["signature"] = sign_capability(SECRET, cap)
        ans = call(tg, "POST", "/v1/steps", {"capability": cap, "step": 0, "steps": 1, "duration_ms": 0})
        out.append((f"target step fence {fence}", (ans[0], ans[2]["record"].get("reason"))))
    return out


def run_bugs(ref: str, work: str) -> list[str]:
    """Each planted bug of the Python lab against the same bug of the reference lab, and
    against the correct lab: the answers that change must be the same ones."""
    from common import ALL_BUGS

    failures = []
    lease = 600
    table = {}
    # The servers' bugs only: a runner's bug changes no server's answer.
    servers = sorted(bug for bug, process in ALL_BUGS.items() if process != "runner")
    for bug in [None] + servers:
        for lab in (Lab("ref", ref), Lab("py", None)):
            d = os.path.join(work, f"bugs-{lab.name}-{bug or 'none'}")
            os.makedirs(d, exist_ok=True)
            cp_extra = ["--bug", bug] if bug and ALL_BUGS[bug] == "control-plane" else []
            tg_extra = ["--bug", bug] if bug and ALL_BUGS[bug] == "target" else []
            try:
                _, cp = lab.control_plane(d, lease_ms=lease, extra=cp_extra)
                _, tg = lab.target(d, extra=tg_extra)
                table[(bug, lab.name)] = bug_sequences(cp, tg, lease)
            finally:
                stop_all()
    correct = dict(table[(None, "py")])
    for (bug, name), seq in sorted(table.items(), key=str):
        if bug is None:
            continue
        changed = [f"{label}: {correct[label]} → {v}" for label, v in seq if correct[label] != v]
        print(f"  {name} lab with {bug}: {len(changed)} answers change")
        for c in changed:
            print(f"      {c}")
        if not changed:
            failures.append(f"{name} lab with {bug}: no answer differs from the correct lab")
    for bug in servers:
        if table[(bug, "ref")] != table[(bug, "py")]:
            diffs = [f"{a[0]}: ref {a[1]} py {b[1]}" for a, b in zip(table[(bug, "ref")], table[(bug, "py")]) if a != b]
            print(f"  {bug}: the Python bug differs from the reference's: {diffs}")
    if table[(None, "ref")] != table[(None, "py")]:
        failures.append(f"correct labs differ on the bug sequences: {table[(None, 'ref')]} vs {table[(None, 'py')]}")
    return failures


# ====================================================================== robustness


def run_robustness(lab: Lab, work: str) -> list[str]:
    """Races, a half-closed request, and a SIGKILL restart on the same store."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    failures = []
    d = os.path.join(work, f"robustness-{lab.name}")
    os.makedirs(d, exist_ok=True)
    try:
        proc, cp = lab.control_plane(d, lease_ms=5000)
        call(cp, "POST", "/v1/projects", {"id": "demo"}, token=OP)
        toks = [call(cp, "POST", "/v1/runners", {"id": f"r{i}", "project": "demo"}, token=OP)[2]["token"]
                for i in range(8)]
        for i in range(4):
            call(cp, "POST", "/v1/jobs", {"project": "demo", "id": f"same{i}", "deployment_key": "one",
                                          "spec": {"steps": 1, "step_ms": 0}}, token=OP)
        # eight runners claim at once: one key, so exactly one grant
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: call(cp, "POST", "/v1/claim", {"runner": f"r{i}", "observed_ms": 0},
                                                   token=toks[i]), range(8)))
        grants = [a[2]["grant"] for a in answers if a[0] == 200 and a[2]["grant"]]
        print(f"  [{lab.name}] 8 racing claims on one key: {len(grants)} granted")
        if len(grants) != 1:
            failures.append(f"{lab.name}: {len(grants)} claims granted on one key at once")
        g = grants[0]
        tok = toks[int(g["claim"]["runner"][1:])]
        report = dict(g["claim"], observed_ms=0, outcome="succeeded")
        # eight copies of one result at once: one accepted, seven duplicates
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: call(cp, "POST", "/v1/result", report, token=tok), range(8)))
        decisions = sorted(a[2]["decision"] for a in answers)
        print(f"  [{lab.name}] 8 racing copies of one result: {decisions}")
        if decisions != ["accepted"] + ["duplicate"] * 7:
            failures.append(f"{lab.name}: racing results decided {decisions}")
        # a request whose sender half-closes its side is still judged and answered
        host, port = cp.rsplit(":", 1)
        body = json.dumps({"project": "demo", "id": "halfclose", "deployment_key": "hc",
                           "spec": {"steps": 1, "step_ms": 0}}).encode()
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Authorization: Bearer {OP}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        status_line = reply.split(b"\r\n", 1)[0].decode()
        print(f"  [{lab.name}] half-closed request answered: {status_line}")
        if not reply.startswith(b"HTTP/1.1 201"):
            failures.append(f"{lab.name}: a half-closed request was answered {reply[:40]!r}")
        # SIGKILL and restart on the same store and port: nothing acknowledged is lost
        before = call(cp, "GET", "/v1/ledger?limit=10000", token=OP)[2]
        os.killpg(proc.p.pid, signal.SIGKILL)
        proc.p.wait(5)
        cmd = [w for w in proc.cmd]
        cmd[cmd.index("--listen") + 1] = cp
        again = Proc(f"{lab.name}-control-plane-again", cmd, d)
        again.listening()
        after = call(cp, "GET", "/v1/ledger?limit=10000", token=OP)[2]
        view = call(cp, "GET", f"/v1/jobs/{g['claim']['job']}", token=OP)[2]
        print(f"  [{lab.name}] after SIGKILL and restart: {len(after)} of {len(before)} ledger entries, "
              f"job {view['state']}")
        if after[:len(before)] != before or view["state"] != "succeeded":
            failures.append(f"{lab.name}: state lost across a restart")
        call(cp, "POST", "/v1/jobs", {"project": "demo", "id": "next", "deployment_key": "nk",
                                      "spec": {"steps": 1, "step_ms": 0}}, token=OP)
        g2 = call(cp, "POST", "/v1/claim", {"runner": "r0", "observed_ms": 0}, token=toks[0])[2]["grant"]
        if not g2 or g2["claim"]["fence"] <= g["claim"]["fence"]:
            failures.append(f"{lab.name}: the fence counter did not survive the restart: {g2}")
    finally:
        stop_all()
    return failures


# ====================================================================== replicas


def run_replicas(work: str) -> list[str]:
    """Two Python control planes on one SQLite file; runners given both, their own first.
    One replica is SIGKILLed mid-run: the runners fail over and every job still succeeds."""
    failures = []
    d = os.path.join(work, "replicas")
    os.makedirs(d, exist_ok=True)
    py = Lab("py", None)
    try:
        p1, cp1 = py.control_plane(d, lease_ms=1500)
        _, cp2 = py.control_plane(d, lease_ms=1500)  # the same --db: <work>/py-cp.sqlite
        _, tg = py.target(d)
        call(cp1, "POST", "/v1/projects", {"id": "demo"}, token=OP)
        runners = []
        for i, urls in ((1, f"http://{cp1},http://{cp2}"), (2, f"http://{cp2},http://{cp1}")):
            tok = call(cp2, "POST", "/v1/runners", {"id": f"r{i}", "project": "demo"}, token=OP)[2]["token"]
            runners.append(py.runner(d, f"r{i}", tok, cp1, tg,
                                     extra=["--control-url", urls, "--request-timeout-ms", "500"]))
        for i in range(8):
            call(cp1 if i % 2 else cp2, "POST", "/v1/jobs",
                 {"project": "demo", "deployment_key": f"k{i % 3}", "spec": {"steps": 4, "step_ms": 150}},
                 token=OP)
        time.sleep(1.5)
        os.killpg(p1.p.pid, signal.SIGKILL)
        ok = wait_until(lambda: all(v["state"] in ("succeeded", "failed", "uncertain")
                                    for v in call(cp2, "GET", "/v1/jobs", token=OP)[2]), 40, 0.2)
        states = [v["state"] for v in call(cp2, "GET", "/v1/jobs", token=OP)[2]]
        print(f"  two replicas, one killed at 1.5 s: job states {states}")
        if not ok or states.count("succeeded") != 8:
            failures.append(f"replicas: not every job succeeded after a replica was killed: {states}")
        ledger = call(cp2, "GET", "/v1/ledger?limit=10000", token=OP)[2]
        seqs = [e["seq"] for e in ledger]
        if seqs != list(range(1, len(seqs) + 1)):
            failures.append("replicas: the shared ledger has gaps or repeats")
    finally:
        stop_all()
    return failures


# ====================================================================== main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="all",
                    choices=["all", "conformance", "capabilities", "runners", "behaviour", "bugs",
                             "robustness", "replicas"])
    ap.add_argument("--ref", default=os.environ.get("FENCELAB_REF", "/work/bin/fencelab-ref"),
                    help="the reference fencelab binary")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, stores)")
    ap.add_argument("--dump", help="write every observation of both sides to this JSON file")
    ap.add_argument("--show-known", action="store_true", help="also print known differences")
    args = ap.parse_args(argv)
    if not os.access(args.ref, os.X_OK):
        print(f"the reference binary {args.ref} is not executable", file=sys.stderr)
        return 254
    work = tempfile.mkdtemp(prefix="fencelab-py-interop-")
    failures: list[str] = []
    signal.signal(signal.SIGTERM, lambda *a: (stop_all(), sys.exit(2)))
    try:
        if args.what in ("all", "conformance"):
            print("== conformance: the same requests to the reference and the Python servers")
            checks, diffs = run_conformance(args.ref, work, args.dump)
            unknown = [d for d in diffs if d.split(":\n")[0] not in KNOWN_DIFFERENCES]
            known = [d for d in diffs if d.split(":\n")[0] in KNOWN_DIFFERENCES]
            print(f"  {checks} observations compared, {len(diffs)} differ "
                  f"({len(known)} known and documented, {len(unknown)} new)")
            for d in unknown + (known if args.show_known else []):
                print("  DIFF " + d)
            failures += unknown
        if args.what in ("all", "capabilities"):
            print("== capabilities: signed by one control plane, verified by either target")
            failures += run_capabilities(args.ref, work)
        if args.what in ("all", "runners"):
            ref, py = Lab("ref", args.ref), Lab("py", None)
            print("== runners: the Python runner on the reference servers, and the reverse")
            failures += check_runner_pair(py, ref, work)
            failures += check_runner_pair(ref, py, work)
            failures += check_runner_pair(py, py, work)
            failures += compare_logs(os.path.join(work, "runners-ref-on-py", "ref-r1.jsonl"),
                                     os.path.join(work, "runners-py-on-ref", "py-r1.jsonl"))
        if args.what in ("all", "robustness"):
            print("== robustness: races, a half-closed request, SIGKILL and restart")
            for lab in (Lab("ref", args.ref), Lab("py", None)):
                failures += run_robustness(lab, work)
        if args.what in ("all", "replicas"):
            print("== replicas: two Python control planes on one store, one killed")
            failures += run_replicas(work)
        if args.what in ("all", "bugs"):
            print("== planted bugs: the Python lab's bugs against the reference's bugs of the same name")
            failures += run_bugs(args.ref, work)
        if args.what in ("all", "behaviour"):
            print("== behaviour: both runners under the same faults, on both labs' servers")
            failures += compare_behaviour(args.ref, work)
    finally:
        stop_all()
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("== " + ("all checks passed" if not failures else f"{len(failures)} failures"))
    for f in failures:
        print("  FAIL " + f.replace("\n", "\n       "))
    return 0 if not failures else 1


# Differences from the reference that are understood and written down in README.md
# ("Gaps in the contract"); the label is "<server> / <case>".
KNOWN_DIFFERENCES: set[str] = {
    # GAPS.md 1: the reference takes the Bearer scheme case-insensitively and with more spaces
    "control-plane / lowercase bearer", "control-plane / two spaces", "control-plane / BEARER",
    # GAPS.md 2: the reference accepts a nested struct written as a JSON array
    "control-plane / job spec as array",
}


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(main())
