"""Shared pieces of the Python lab: clocks, strict JSON bodies, errors, capabilities, HTTP.

Standard library only (Python 3.11). The control plane and the target are both small
HTTP/1.1 servers built on ``http.server.ThreadingHTTPServer``; everything they have in
common (how a body is read and parsed, how an error is answered, how the process starts
and stops) lives here so that each server file only holds its own rules.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 65_536
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

# Every planted bug of the Python lab, and which process it belongs to.
ALL_BUGS = {
    "accept-stale-result": "control-plane",
    "trust-runner-clock": "control-plane",
    "target-ignores-fence": "target",
    "runner-ignores-deadline": "runner",
    "runner-reports-unfinished-success": "runner",
    "runner-resends-lost-step": "runner",
}

_ID_RE = re.compile(r"[A-Za-z0-9\-_.:]{1,128}")


# --------------------------------------------------------------------------- clocks


def wall_ms() -> int:
    """This host's wall clock in Unix milliseconds."""
    return time.time_ns() // 1_000_000


def mono_ns() -> int:
    """The host's CLOCK_MONOTONIC in nanoseconds (one axis for every process of a run)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answer: ``{"error": message, "code": code, "status": status}``."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": self.message, "code": self.code, "status": self.status}


def is_id(value) -> bool:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


# --------------------------------------------------------------------------- JSON bodies


class _Duplicate(Exception):
    pass


def _pairs_no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def _reject_constant(name):
    # NaN, Infinity and -Infinity are not JSON.
    raise ValueError(f"{name} is not JSON")


def _check_strings(value):
    """Lone UTF-16 surrogates (``"\\ud800"``) are not valid Unicode text: refuse them."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            k.encode("utf-8")
            _check_strings(v)
    elif isinstance(value, list):
        for v in value:
            _check_strings(v)


def parse_json(raw: bytes):
    """Parse a request body strictly. Syntax problems are 400 malformed_json; a duplicate
    key (valid syntax, wrong shape) is 400 invalid_body."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "malformed_json", "the body is not UTF-8")
    try:
        value = json.loads(
            text, object_pairs_hook=_pairs_no_duplicates, parse_constant=_reject_constant
        )
        _check_strings(value)
    except _Duplicate as dup:
        raise ApiError(400, "invalid_body", f"duplicate field `{dup.args[0]}`")
    except RecursionError:
        # Valid syntax nested deeper than any request shape: the wrong shape.
        raise ApiError(400, "invalid_body", "the body is nested too deeply")
    except (ValueError, UnicodeEncodeError) as err:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {err}")
    return value


# Field kinds of the request shapes. A shape is {name: (kind, required)}; a kind is one of
# the strings below, a frozenset of allowed words (an enum), or a nested shape (dict).
STR, U64, I64, U32 = "string", "u64", "i64", "u32"


def _bad(msg: str) -> ApiError:
    return ApiError(400, "invalid_body", msg)


def _check_kind(name: str, kind, value):
    if isinstance(kind, dict):
        return check_shape(value, kind, prefix=name + ".")
    if isinstance(kind, frozenset):
        if not isinstance(value, str) or value not in kind:
            raise _bad(f"`{name}` must be one of {sorted(kind)}")
        return value
    if kind == STR:
        if not isinstance(value, str):
            raise _bad(f"`{name}` must be a string")
        return value
    # integers: bool is an int in Python but never a JSON number
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(f"`{name}` must be an integer")
    lo, hi = {U64: (0, U64_MAX), I64: (I64_MIN, I64_MAX), U32: (0, U32_MAX)}[kind]
    if not lo <= value <= hi:
        raise _bad(f"`{name}` is out of range for {kind}")
    return value


def check_shape(value, shape: dict, prefix: str = "") -> dict:
    """Check that ``value`` is an object of exactly the documented fields. An optional
    field given as ``null`` counts as absent (as a Rust ``Option`` would read it)."""
    if not isinstance(value, dict):
        raise _bad(f"the body{(' field ' + prefix[:-1]) if prefix else ''} must be a JSON object")
    out = {}
    for key, item in value.items():
        if key not in shape:
            raise _bad(f"unknown field `{prefix}{key}`")
        kind, required = shape[key]
        if item is None:
            if required:
                raise _bad(f"`{prefix}{key}` must not be null")
            continue
        out[key] = _check_kind(prefix + key, kind, item)
    for key, (kind, required) in shape.items():
        if required and key not in out:
            raise _bad(f"missing field `{prefix}{key}`")
    return out


# --------------------------------------------------------------------------- capabilities


def capability_message(cap: dict) -> bytes:
    parts = [
        cap["deployment_key"],
        cap["job"],
        cap["attempt"],
        cap["runner"],
        str(int(cap["fence"])),
        str(int(cap["expires_ms"])),
    ]
    return "\n".join(parts).encode("utf-8")


def sign_capability(secret: str, cap: dict) -> str:
    return hmac.new(secret.encode("utf-8"), capability_message(cap), hashlib.sha256).hexdigest()


def verify_capability(secret: str, cap: dict) -> bool:
    try:
        given = bytes.fromhex(cap["signature"])
    except (ValueError, TypeError):
        return False
    if len(cap["signature"]) % 2 or not all(c in "0123456789abcdefABCDEF" for c in cap["signature"]):
        return False
    want = hmac.new(secret.encode("utf-8"), capability_message(cap), hashlib.sha256).digest()
    return hmac.compare_digest(given, want)


# --------------------------------------------------------------------------- query strings


def parse_query(query: str, allowed: dict[str, int]) -> dict[str, int]:
    """Non-negative decimal integers only, each at most its maximum in ``allowed``
    (name -> max), no unknown or repeated parameter."""
    out: dict[str, int] = {}
    if not query:
        return out
    for part in query.split("&"):
        if part == "":
            continue
        name, _, raw = part.partition("=")
        name = urllib.parse.unquote_plus(name)
        raw = urllib.parse.unquote_plus(raw)
        if name not in allowed:
            raise ApiError(400, "invalid_query", f"unknown query parameter `{name}`")
        if name in out:
            raise ApiError(400, "invalid_query", f"`{name}` given twice")
        digits = raw
        if not digits.isascii() or not digits.isdigit():
            raise ApiError(400, "invalid_query", f"`{name}` must be a non-negative integer")
        number = int(digits)
        if number > allowed[name]:
            raise ApiError(400, "invalid_query", f"`{name}` is too large")
        out[name] = number
    return out


def decode_path_segment(segment: str) -> str:
    try:
        return urllib.parse.unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_path", "the path does not percent-decode to UTF-8")


# --------------------------------------------------------------------------- HTTP


class Route:
    """A path pattern: literal segments, or ``{name}`` for one captured raw segment."""

    def __init__(self, pattern: str, methods: dict):
        self.parts = pattern.strip("/").split("/")
        self.methods = methods  # method -> callable(handler, params)

    def match(self, path: str):
        if not path.startswith("/"):
            return None
        segs = path[1:].split("/")
        if len(segs) != len(self.parts):
            return None
        params = {}
        for want, got in zip(self.parts, segs):
            if want.startswith("{"):
                if got == "":
                    return None
                params[want[1:-1]] = got
            elif want != got:
                return None
        return params


class JsonHandler(BaseHTTPRequestHandler):
    """Routes requests to ``self.routes`` and answers JSON. Subclasses set ``routes``."""

    protocol_version = "HTTP/1.1"
    # Answers go out in one write with TCP_NODELAY: a header segment and a body segment
    # under Nagle's algorithm meet the client's delayed ACK and cost ~40 ms per request
    # on a kept-alive connection.
    disable_nagle_algorithm = True
    server_version = "fencelab-python"
    sys_version = ""
    timeout = 30  # seconds a connection may sit idle or trickle a request
    routes: list[Route] = []

    # Every method name reaches dispatch, so an unusual method on a known path is a 405.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def log_message(self, fmt, *args):  # quiet by default; errors go to stderr below
        pass

    # -- body -------------------------------------------------------------------------

    _body_read = False

    def read_body(self) -> bytes:
        """Read the request body, at most MAX_BODY bytes; 413 when over or unreadable."""
        self._body_read = True
        te = self.headers.get("Transfer-Encoding", "")
        try:
            if "chunked" in te.lower():
                return self._read_chunked()
            length = self.headers.get("Content-Length")
            if length is None:
                return b""
            if not length.strip().isdigit():
                self.close_connection = True
                raise ApiError(413, "body_too_large", "the body could not be read")
            n = int(length)
            if n > MAX_BODY:
                self.close_connection = True
                raise ApiError(413, "body_too_large", f"the body is over {MAX_BODY} bytes")
            data = self.rfile.read(n)
            if len(data) != n:
                self.close_connection = True
                raise ApiError(413, "body_too_large", "the body could not be read (cut short)")
            return data
        except (OSError, ValueError) as err:
            self.close_connection = True
            raise ApiError(413, "body_too_large", f"the body could not be read: {err}")

    def _read_chunked(self) -> bytes:
        data = bytearray()
        while True:
            line = self.rfile.readline(1024)
            size = int(line.split(b";")[0].strip() or b"x", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(data)
            if len(data) + size > MAX_BODY:
                self.close_connection = True
                raise ApiError(413, "body_too_large", f"the body is over {MAX_BODY} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise ValueError("chunk cut short")
            data += chunk
            self.rfile.readline(1024)

    def _drain_body(self):
        """Keep the connection usable when a body was not read (an early refusal)."""
        if self._body_read:
            return
        length = self.headers.get("Content-Length")
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            self.close_connection = True
        elif length and length.strip().isdigit():
            n = int(length)
            if n > 4 * MAX_BODY:
                self.close_connection = True
            else:
                try:
                    self.rfile.read(n)
                except OSError:
                    self.close_connection = True

    def json_body(self):
        """Content type (415), size (413), then JSON syntax (400). The media type is
        compared in any case, its parameters ignored; a suffix or a longer subtype is not JSON."""
        ctype = self.headers.get("Content-Type")
        if ctype is None or ctype.split(";")[0].strip().lower() != "application/json":
            raise ApiError(415, "unsupported_media_type", "Content-Type must be application/json")
        return parse_json(self.read_body())

    # -- answers -----------------------------------------------------------------------

    def send_json(self, status: int, value, headers: dict | None = None):
        body = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        self._drain_body()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if self.close_connection:
                self.send_header("Connection", "close")
            self._headers_buffer.append(b"\r\n")
            if self.command != "HEAD":
                self._headers_buffer.append(body)
            self.flush_headers()  # status line, headers and body in one write
        except OSError:
            # The client went away; whatever was decided is already committed.
            self.close_connection = True

    def send_error(self, code, message=None, explain=None):
        """Errors http.server raises itself (a garbled request line, …), answered as JSON."""
        self.close_connection = True
        err = ApiError(code, "bad_request" if code < 500 else "internal", message or "bad request")
        try:
            self.send_json(code, err.body())
        except Exception:
            pass

    def _dispatch(self):
        # http.server folds a leading "//" in self.path; route on the path as sent.
        parts = self.requestline.split(" ")
        target = parts[1] if len(parts) >= 2 else self.path
        raw_path, _, query = target.partition("?")
        if raw_path.startswith("http://") or raw_path.startswith("https://"):
            raw_path = "/" + raw_path.split("/", 3)[-1] if raw_path.count("/") >= 3 else "/"
        self.query = query
        method = self.command
        try:
            for route in self.routes:
                params = route.match(raw_path)
                if params is None:
                    continue
                methods = dict(route.methods)  # in declaration order: the Allow header's
                if "GET" in methods:
                    methods.setdefault("HEAD", methods["GET"])
                fn = methods.get(method)
                if fn is None:
                    allow = ",".join(methods)
                    raise ApiError(405, "method_not_allowed",
                                   f"{raw_path} does not take {method}", {"Allow": allow})
                status, value = fn(self, params)
                self.send_json(status, value)
                return
            raise ApiError(404, "no_route", f"no endpoint {raw_path}")
        except ApiError as err:
            self.send_json(err.status, err.body(), err.headers)
        except Exception as err:  # a bug or a store failure: never leave the client hanging
            print(f"internal error on {method} {raw_path}: {err!r}", file=sys.stderr, flush=True)
            self.send_json(500, ApiError(500, "internal", f"internal error: {err}").body())


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class ArgParser(argparse.ArgumentParser):
    """argparse, exiting 254 on a bad command line (as the reference lab does)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(254)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535 or not host:
        raise ValueError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def serve(handler_cls, listen: str, on_stop=None):
    """Bind, print ``{"listening": "HOST:PORT"}``, serve until SIGTERM/SIGINT, exit 0."""
    host, port = parse_listen(listen)
    try:
        server = Server((host, port), handler_cls)
    except OSError as err:
        print(f"cannot listen on {listen}: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    bound_host, bound_port = server.server_address[:2]
    stop = threading.Event()

    def _on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              name="http", daemon=True)
    thread.start()
    print(json.dumps({"listening": f"{bound_host}:{bound_port}"}, separators=(",", ":")),
          flush=True)
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    if on_stop is not None:
        on_stop()
    sys.exit(0)


def bugs_from_env(process: str) -> set[str]:
    """Bugs named in FENCELAB_PY_BUGS (comma-separated) that belong to ``process``.
    A name no process knows is an error (exit 2), so a typo never runs the correct lab."""
    out = set()
    for name in (n.strip() for n in os.environ.get("FENCELAB_PY_BUGS", "").split(",")):
        if not name:
            continue
        if name not in ALL_BUGS:
            print(f"FENCELAB_PY_BUGS names an unknown bug {name!r}; known: {sorted(ALL_BUGS)}",
                  file=sys.stderr)
            sys.exit(254)
        if ALL_BUGS[name] == process:
            out.add(name)
    return out


def no_proxy_opener():
    """A urllib opener that never goes through an HTTP proxy (loopback only)."""
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))
