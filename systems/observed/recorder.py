"""What the recorders of fencelab's observed systems share (systems/buildbot/, systems/airflow/).

A recorder is its system's control_plane.py: it serves the operator half of fencelab's
contract (docs/protocol.md) and reads the system's own records into an append-only ledger,
deciding nothing. What is the same for every observed system is here: the checks of a
request's body, query and ids; the HTTP handler, which routes each endpoint to the system's
facade and answers the contract's endpoints the system has no concept for with 404
`not_provided` and the system's own reason; the facade's own state (its one project, the
registered runners, who a bearer token is); ledger.jsonl's file (read back after a kill,
appended to with fsync); atomic writes; a child that dies with its parent; and, from
keys.py, the derivation of secrets from the run's. How a system's records are read and how
a job is submitted to it stay in the system's own control_plane.py.

Each control_plane.py imports this file by its path (systems/observed/, next to the
system's own folder), whatever the working directory.
"""

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

from keys import derive  # noqa: F401 (systems/observed/keys.py, beside this file; a recorder's secrets)

# The venv's own bin folder: where the system's own commands are installed.
BIN = os.path.dirname(os.path.abspath(sys.executable))
POLL_S = 0.1
MAX_BODY = 65536
U64_MAX = 2**64 - 1
ID_RE = re.compile(r'^[A-Za-z0-9\-_.:]{1,128}$')


def logger(stamped):
    """The recorder's log on stderr (`control_plane: ...`), each line with the UTC time when
    `stamped`."""

    def log(message):
        stamp = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime()) + 'Z ' if stamped else ''
        sys.stderr.write(f'control_plane: {stamp}{message}\n')
        sys.stderr.flush()

    return log


class ApiError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def die_with_parent():
    try:
        import ctypes

        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def write_atomically(path, text):
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + '.tmp', path)


# ------------------------------------------------------------------ the ledger's file


class LedgerFile:
    """The append-only record of the system's facts, in ledger.jsonl (one entry a line). A
    system's ledger says what identifies a fact (`fact_key`) and polls its records (`poll`),
    appending what it has not seen with `append`."""

    def __init__(self, path):
        self.path = path
        self.entries = []
        self.seen = set()
        self.lock = threading.Lock()
        self.load()
        self.file = open(path, 'a', encoding='utf-8')

    def load(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, 'rb') as f:
            data = f.read()
        good = 0
        for line in data.split(b'\n'):
            if not line.endswith(b'}'):
                break  # a line a kill cut short: dropped, it was never served
            entry = json.loads(line)
            self.remember(entry)
            good += len(line) + 1
        if good != len(data):
            with open(self.path, 'r+b') as f:
                f.truncate(good)

    def remember(self, entry):
        self.entries.append(entry)
        self.seen.add(self.fact_key(entry))

    @staticmethod
    def fact_key(entry):
        raise NotImplementedError

    def append(self, facts, mono):
        """Appends `facts` ((order, fact key, entry) each), in their order, each entry with the
        next seq and `mono`, to the file (flushed and synced) and to memory. Under the lock."""
        facts.sort(key=lambda fact: fact[0])
        lines = []
        for _, _, entry in facts:
            entry = {'seq': len(self.entries) + 1, **entry, 'mono_ns': mono}
            self.remember(entry)
            lines.append(json.dumps(entry, separators=(',', ':')) + '\n')
        self.file.write(''.join(lines))
        self.file.flush()
        os.fsync(self.file.fileno())

    def page(self, after, limit):
        with self.lock:
            if after >= len(self.entries):
                return []
            return self.entries[after:after + limit]

    def of_job(self, job):
        with self.lock:
            return [entry for entry in self.entries if entry['job'] == job]

    def has_submit(self, job):
        with self.lock:
            return ('submit', job) in self.seen


def keep_recording(ledger, log):
    """The recorder's thread: polls the system's records every POLL_S, for good."""
    while True:
        try:
            ledger.poll()
        except Exception as error:  # noqa: BLE001 (a busy or half-made database: the next poll tries again)
            log(f'recording: {error!r}')
        time.sleep(POLL_S)


# ------------------------------------------------------------------ the facade's own state


class Facade:
    """The operator's side of the contract as every observed system serves it: one project,
    the registered runners (kept in facade.json), who a bearer token is, and the checks of
    each request. A system's facade gives `health`, `submit` (after `checked_submission`),
    `view` (a job as its records say), `runner_token` and `runner_of`, and the words of its
    refusals: `one_project` (why a second project is refused) and `runners_are` (what its
    runners r1..rN are)."""

    one_project = ''
    runners_are = ''

    def __init__(self, options, ledger):
        self.options, self.ledger = options, ledger
        self.state_path = os.path.join(options.data_dir, 'facade.json')
        self.state = {'project': None, 'runners': {}}
        if os.path.exists(self.state_path):
            with open(self.state_path, encoding='utf-8') as f:
                self.state = json.load(f)
        self.lock = threading.Lock()
        self.submit_lock = threading.Lock()

    def save(self):
        write_atomically(self.state_path, json.dumps(self.state))

    def registration_token(self, project):
        return derive(self.options.secret, f'registration:{project}')

    def who(self, headers):
        value = (headers.get('Authorization') or '').strip()
        if not value.startswith('Bearer ') or len(value) == len('Bearer '):
            raise ApiError(401, 'unauthorized', 'a bearer token is required')
        token = value[len('Bearer '):]
        if token == self.options.operator_token:
            return ('operator', None)
        project = self.state['project']
        if project and hmac.compare_digest(token, self.registration_token(project)):
            return ('registration', project)
        runner = self.runner_of(token)
        if runner is not None:
            return runner
        raise ApiError(401, 'unauthorized', 'the bearer token is not known')

    def create_project(self, who, body):
        fields(body, {'id': str}, {})
        if who[0] != 'operator':
            raise ApiError(403, 'forbidden', 'creating a project needs the operator token')
        check_id(body['id'], 'id')
        with self.lock:
            if self.state['project'] is not None:
                raise ApiError(409, 'exists', f"a project exists ({self.state['project']}); {self.one_project}")
            self.state['project'] = body['id']
            self.save()
        return 201, {'id': body['id'], 'registration_token': self.registration_token(body['id'])}

    def register_runner(self, who, body):
        fields(body, {'id': str}, {'project': str})
        check_id(body['id'], 'id')
        project = body.get('project')
        if who[0] == 'operator':
            if project is None:
                raise ApiError(400, 'missing_field', 'the operator names the project')
        elif who[0] == 'registration':
            if project is not None and project != who[1]:
                raise ApiError(403, 'forbidden', 'the registration token is for another project')
            project = who[1]
        else:
            raise ApiError(403, 'forbidden', 'registering a runner needs the operator or a registration token')
        with self.lock:
            if project != self.state['project']:
                raise ApiError(404, 'unknown_project', f'no project {project}')
            names = {f'r{k}' for k in range(1, self.options.runners + 1)}
            if body['id'] not in names:
                raise ApiError(404, 'unknown_runner', f"{self.runners_are} r1..r{self.options.runners} only, not {body['id']}")
            if body['id'] in self.state['runners']:
                raise ApiError(409, 'exists', f"runner {body['id']} is registered")
            self.state['runners'][body['id']] = project
            self.save()
        return 201, {'id': body['id'], 'project': project, 'token': self.runner_token(body['id'])}

    def checked_submission(self, who, body):
        """A submission's checks, before anything is asked of the system: the job's id (None
        when the system is to name it) and what the job is (project, key, steps, step_ms)."""
        fields(body, {'project': str, 'deployment_key': str, 'spec': dict}, {'id': str})
        fields(body['spec'], {'steps': int, 'step_ms': int}, {})
        for name in ('steps', 'step_ms'):
            if body['spec'][name] < 0:
                raise ApiError(400, 'invalid_body', f'spec.{name} must be an unsigned integer')
        if who[0] != 'operator':
            raise ApiError(403, 'forbidden', 'submitting needs the operator token')
        check_id(body['project'], 'project')
        check_id(body['deployment_key'], 'deployment_key')
        if body.get('id') is not None:
            check_id(body['id'], 'id')
        steps, step_ms = body['spec']['steps'], body['spec']['step_ms']
        if not 1 <= steps <= 1000 or step_ms > 600000:
            raise ApiError(400, 'invalid_field', 'spec.steps must be 1..=1000 and spec.step_ms 0..=600000')
        if body['project'] != self.state['project']:
            raise ApiError(404, 'unknown_project', f"no project {body['project']}")
        return body.get('id'), {'project': body['project'], 'deployment_key': body['deployment_key'], 'steps': steps, 'step_ms': step_ms}

    # A job is shown as of a snapshot the ledger already holds every fact of (the recorder
    # polls it first): a view never shows what the ledger has not recorded.
    def jobs(self, who):
        self.operator(who, 'reading jobs')
        snapshot = self.ledger.poll()
        return 200, [self.view(job, False) for job in snapshot.jobs]

    def job(self, who, job_id):
        self.operator(who, 'reading a job')
        job = self.ledger.poll().by_job.get(job_id)
        if job is None:
            raise ApiError(404, 'unknown_job', f'no job {job_id}')
        return 200, self.view(job, True)

    def ledger_page(self, who, after, limit):
        self.operator(who, 'reading the ledger')
        return 200, self.ledger.page(after, limit)

    @staticmethod
    def operator(who, what):
        if who[0] != 'operator':
            raise ApiError(403, 'forbidden', f'{what} needs the operator token')


# ------------------------------------------------------------------ a request's checks


def check_id(value, name):
    if not ID_RE.match(value) or not value.isascii():
        raise ApiError(400, 'invalid_field', f'{name} is not an id (1 to 128 of [A-Za-z0-9-_.:])')


def fields(body, required, optional):
    """The shape check: an object of exactly these fields, each of its type (null = absent for
    an optional one); ints are JSON integers, never booleans or fractions."""
    if not isinstance(body, dict):
        raise ApiError(400, 'invalid_body', 'an object was expected')
    for name in body:
        if name not in required and name not in optional:
            raise ApiError(400, 'invalid_body', f'unknown field {name}')
    for name, kind in list(required.items()) + list(optional.items()):
        if name not in body or (name in optional and body[name] is None):
            if name in required:
                raise ApiError(400, 'invalid_body', f'missing field {name}')
            body.pop(name, None)
            continue
        value = body[name]
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value <= U64_MAX
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ApiError(400, 'invalid_body', f'{name} has the wrong type')


class Duplicate(ValueError):
    pass


def no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise Duplicate(key)
        seen[key] = value
    return seen


def no_constant(name):
    raise ValueError(f'{name} is not JSON')


def parse_body(raw):
    try:
        text = raw.decode('utf-8')
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except Duplicate as error:
        raise ApiError(400, 'invalid_body', f'duplicate field {error}') from error
    except ValueError as error:
        raise ApiError(400, 'malformed_json', f'the body is not JSON ({error})') from error


def parse_query(query):
    values = {}
    for part in query.split('&') if query else []:
        name, _, value = part.partition('=')
        if name not in ('after', 'limit') or name in values or not value.isdigit() or not value.isascii() or int(value) > U64_MAX:
            raise ApiError(400, 'invalid_query', 'after and limit are decimal integers, each at most once')
        values[name] = int(value)
    return values.get('after', 0), min(max(values.get('limit', 1000), 1), 10000)


# ------------------------------------------------------------------ HTTP


def hold_port(port):
    """Binds 127.0.0.1:`port` until the system's own server takes it (close the socket just
    before starting that server). The harness chose the port free; a system that takes a
    minute to prepare must not leave it free that long, or another process binding port 0 may
    be given it, and the harness would then talk to that process. SO_REUSEADDR, so that a
    restarted control plane can hold a port its predecessor's connections left in TIME_WAIT;
    the socket never listens."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(('127.0.0.1', port))
    return held


class Server(ThreadingHTTPServer):
    """The contract's HTTP server on `listen` (HOST:PORT): each request goes to `facade` (set
    once the system is started), and each path of `not_provided` is answered 404
    `not_provided` with its reason (the system's own words for the concept it has not).
    Made before the system is prepared, so that the port is bound from the start: requests
    wait in the backlog until `serve_forever`."""

    daemon_threads = True

    def __init__(self, listen, not_provided, log, request_queue_size=5):
        host, _, port = listen.rpartition(':')
        self.not_provided, self.log, self.facade = not_provided, log, None
        self.request_queue_size = request_queue_size
        super().__init__((host, int(port)), Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def answer(self, status, body, extra_headers=()):
        data = json.dumps(body, separators=(',', ':')).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        for name, value in extra_headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(data)

    def fail(self, error, extra_headers=()):
        self.answer(error.status, {'error': error.message, 'code': error.code, 'status': error.status}, extra_headers)

    def do_GET(self):
        self.route('GET')

    def do_HEAD(self):
        self.route('GET')

    def do_POST(self):
        self.route('POST')

    def do_PUT(self):
        self.route('PUT')

    def do_DELETE(self):
        self.route('DELETE')

    def do_PATCH(self):
        self.route('PATCH')

    def read_body(self):
        length = self.headers.get('Content-Length')
        if length is None or not length.isdigit():
            return b''
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, 'body_too_large', 'the body is over 65536 bytes')
        return self.rfile.read(int(length))

    def json_body(self):
        kind = (self.headers.get('Content-Type') or '').split(';')[0].strip().lower()
        raw = self.read_body()
        if kind != 'application/json':
            raise ApiError(415, 'unsupported_media_type', 'the body must be application/json')
        return parse_body(raw)

    def route(self, method):
        facade = self.server.facade
        not_provided = self.server.not_provided
        target = urllib.parse.urlsplit(self.path)
        path = target.path
        try:
            if path in not_provided:
                self.read_body()
                raise ApiError(404, 'not_provided', not_provided[path])
            posts = {'/v1/projects': facade.create_project, '/v1/runners': facade.register_runner, '/v1/jobs': facade.submit}
            if path == '/v1/health':
                self.allow(method, 'GET')
                return self.answer(*facade.health())
            if path == '/v1/ledger':
                self.allow(method, 'GET')
                after, limit = parse_query(target.query)
                return self.answer(*facade.ledger_page(facade.who(self.headers), after, limit))
            if path == '/v1/jobs' and method == 'GET':
                return self.answer(*facade.jobs(facade.who(self.headers)))
            if path.startswith('/v1/jobs/') and path.count('/') == 3 and len(path) > len('/v1/jobs/'):
                self.allow(method, 'GET')
                try:
                    job = urllib.parse.unquote(path[len('/v1/jobs/'):], errors='strict')
                except UnicodeDecodeError as error:
                    raise ApiError(400, 'invalid_path', 'the job id does not decode to UTF-8') from error
                return self.answer(*facade.job(facade.who(self.headers), job))
            if path in posts:
                self.allow(method, 'POST', also_get=path == '/v1/jobs')
                who = facade.who(self.headers)
                return self.answer(*posts[path](who, self.json_body()))
            raise ApiError(404, 'no_route', f'no endpoint {path}')
        except ApiError as error:
            allow = [('Allow', error.allow)] if getattr(error, 'allow', None) else []
            self.fail(error, allow)
        except Exception as error:  # noqa: BLE001 (any failure is answered, never a dropped connection)
            self.server.log(f'{method} {path}: {error!r}')
            self.fail(ApiError(500, 'internal', f'the facade failed ({error})'))

    def allow(self, method, wanted, also_get=False):
        if method != wanted:
            error = ApiError(405, 'method_not_allowed', f'{method} is not allowed here')
            error.allow = 'GET, HEAD, POST' if also_get else ('GET, HEAD' if wanted == 'GET' else wanted)
            self.read_body()
            raise error
