#!/usr/bin/env python3
"""fencelab's control-plane role for the observed Buildbot 4.3.0 system.

Buildbot runs unmodified (a master started from master.cfg as a child process, its workers
started by runner.py) and makes every decision about a job. This program only:

- starts the master on a basedir in --data-dir (kept across restarts: the same database);
- serves the operator half of fencelab's contract (docs/protocol.md) on --listen: a project,
  runner registration (the answer carries the worker's password), job submission through
  Buildbot's own `buildbot try` PB call, and job views read from Buildbot's database;
- records Buildbot's own records as a ledger (`GET /v1/ledger`): a thread polls the database
  every 100 ms and appends each fact the first time it sees it to ledger.jsonl, so that a
  SIGKILL and a restart keep every entry and its seq.

It decides nothing and adds nothing Buildbot lacks. Buildbot has no lease, heartbeat,
capability, reconciliation or late observation: claims carry no lease_expires_ms, and the
runners' endpoints answer 404 `not_provided`. An attempt is one Buildbot build; its fence is
the build's `builds.id`, Buildbot's one global increasing counter.
"""

import argparse
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(os.path.abspath(sys.executable))

# Buildbot's result codes (buildbot/process/results.py).
SUCCESS, WARNINGS, FAILURE, SKIPPED, EXCEPTION, RETRY, CANCELLED = range(7)
POLL_S = 0.1
MAX_BODY = 65536
U64_MAX = 2**64 - 1
ID_RE = re.compile(r'^[A-Za-z0-9\-_.:]{1,128}$')
TRY_USER = 'fencelab-submit'
# Properties the facade puts on each buildset and reads back; nothing else identifies a job.
JOB_PROPS = ('job', 'project', 'deployment_key', 'steps', 'step_ms')


def derive(secret, purpose):
    """A deterministic password or token for `purpose`, from the run's secret."""
    return hmac.new(secret.encode(), purpose.encode(), hashlib.sha256).hexdigest()[:48]


def log(message):
    sys.stderr.write(f'control_plane: {message}\n')
    sys.stderr.flush()


class ApiError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# ------------------------------------------------------------------ Buildbot's database


class Snapshot:
    """One consistent read of what Buildbot recorded: try buildsets, requests, builds."""

    def __init__(self, db_path):
        self.jobs = []  # in submission (buildset id) order
        self.by_job = {}
        if not os.path.exists(db_path):
            return
        conn = sqlite3.connect(f'file:{db_path}?mode=ro', uri=True, timeout=10)
        try:
            conn.execute('BEGIN')
            props = conn.execute(
                'SELECT bs.id, bs.submitted_at, p.property_name, p.property_value FROM buildsets bs '
                'JOIN buildset_properties p ON p.buildsetid = bs.id ORDER BY bs.id'
            ).fetchall()
            requests = conn.execute('SELECT id, buildsetid, complete, results, complete_at FROM buildrequests').fetchall()
            builds = conn.execute(
                'SELECT b.id, b.buildrequestid, b.started_at, b.complete_at, b.results, w.name '
                'FROM builds b LEFT JOIN workers w ON w.id = b.workerid ORDER BY b.id'
            ).fetchall()
            conn.execute('COMMIT')
        except sqlite3.OperationalError as error:
            if 'no such table' in str(error):  # the master has not made its tables yet
                return
            raise
        finally:
            conn.close()
        sets = {}
        for bsid, submitted_at, name, value in props:
            if name in JOB_PROPS:
                entry = sets.setdefault(bsid, {'bsid': bsid, 'submitted_at': submitted_at})
                entry[name] = json.loads(value)[0]  # buildset properties are [value, source]
        by_bsid = {}
        for bsid in sorted(sets):
            job = sets[bsid]
            if 'job' not in job:
                continue
            job.update(requests=[], builds=[])
            self.jobs.append(job)
            self.by_job[job['job']] = job
            by_bsid[bsid] = job
        by_brid = {}
        for brid, bsid, complete, results, complete_at in requests:
            if bsid in by_bsid:
                request = {'id': brid, 'complete': bool(complete), 'results': results, 'complete_at': complete_at}
                by_bsid[bsid]['requests'].append(request)
                by_brid[brid] = by_bsid[bsid]
        for buildid, brid, started_at, complete_at, results, worker in builds:
            if brid in by_brid:
                by_brid[brid]['builds'].append(
                    {'id': buildid, 'started_at': started_at, 'complete_at': complete_at, 'results': results, 'worker': worker or ''}
                )


def attempt_id(job, build):
    return f"{job['job']}-b{build['id']}"


def spec_of(job):
    return {'steps': job['steps'], 'step_ms': job['step_ms']}


def build_state(build):
    if build['complete_at'] is None:
        return 'running'
    return 'succeeded' if build['results'] in (SUCCESS, WARNINGS) else 'failed'


def job_state(job):
    """The job's state as Buildbot's records say it (see the module's docstring)."""
    request = job['requests'][-1] if job['requests'] else None
    if request and request['complete']:
        return 'succeeded' if request['results'] in (SUCCESS, WARNINGS) else 'failed'
    latest = job['builds'][-1] if job['builds'] else None
    if latest is None or latest['results'] == RETRY:
        return 'queued'  # never built, or put back in the queue after a lost worker
    return build_state(latest)  # a finished build whose request Buildbot has not yet closed


def job_view(job, full, ledger_entries):
    state = job_state(job)
    view = {'id': job['job'], 'project': job['project'], 'deployment_key': job['deployment_key'], 'spec': spec_of(job), 'state': state}
    if job['builds']:
        view['current_attempt'] = attempt_id(job, job['builds'][-1])
    if state in ('succeeded', 'failed'):
        view['outcome'] = state
    view['attempts'] = []
    view['ledger'] = []
    if full:
        for build in job['builds']:
            attempt = {
                'id': attempt_id(job, build), 'job': job['job'], 'runner': build['worker'], 'fence': build['id'],
                'state': build_state(build), 'current': build is job['builds'][-1], 'claimed_ms': build['started_at'] * 1000,
            }
            # Buildbot grants no lease: lease_expires_ms is left out.
            if build['complete_at'] is not None:
                attempt['closed_by'] = 'expired-requeued' if build['results'] == RETRY else 'result'
            view['attempts'].append(attempt)
        view['ledger'] = ledger_entries
    return view


# ------------------------------------------------------------------ the ledger


class Ledger:
    """The append-only record of Buildbot's facts, in ledger.jsonl (one entry a line)."""

    def __init__(self, path, db_path):
        self.path, self.db_path = path, db_path
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
            self.entries.append(entry)
            self.seen.add(self.fact_key(entry))
            good += len(line) + 1
        if good != len(data):
            with open(self.path, 'r+b') as f:
                f.truncate(good)

    @staticmethod
    def fact_key(entry):
        if entry['kind'] == 'submit':
            return ('submit', entry['job'])
        if entry['kind'] == 'claim':
            return ('claim', entry['fence'])
        return ('close', entry['fence'])

    def poll(self):
        """Reads Buildbot's database once and appends every fact not yet recorded; returns
        the snapshot read, every fact of which is then in the ledger."""
        with self.lock:
            snapshot = Snapshot(self.db_path)
            mono = time.monotonic_ns()
            facts = []
            for job in snapshot.jobs:
                base = {'project': job['project'], 'job': job['job']}
                if ('submit', job['job']) not in self.seen:
                    facts.append(((job['submitted_at'], 0, job['bsid'], 0), ('submit', job['job']),
                                  {'kind': 'submit', **base, 'deployment_key': job['deployment_key'],
                                   'received_ms': job['submitted_at'] * 1000}))
                for build in job['builds']:
                    claim = {**base, 'attempt': attempt_id(job, build), 'runner': build['worker'], 'fence': build['id'],
                             'deployment_key': job['deployment_key']}
                    if ('claim', build['id']) not in self.seen:
                        facts.append(((build['started_at'], 1, build['id'], 0), ('claim', build['id']),
                                      {'kind': 'claim', **claim, 'decision': 'accepted', 'received_ms': build['started_at'] * 1000}))
                    if build['complete_at'] is not None and ('close', build['id']) not in self.seen:
                        facts.append(((build['complete_at'], 1, build['id'], 1), ('close', build['id']),
                                      close_entry(claim, build)))
            if not facts:
                return snapshot
            facts.sort(key=lambda fact: fact[0])
            lines = []
            for _, key, entry in facts:
                entry = {'seq': len(self.entries) + 1, **entry, 'mono_ns': mono}
                self.entries.append(entry)
                self.seen.add(key)
                lines.append(json.dumps(entry, separators=(',', ':')) + '\n')
            self.file.write(''.join(lines))
            self.file.flush()
            os.fsync(self.file.fileno())
            return snapshot

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


def close_entry(claim, build):
    """How a finished build is recorded: a result, or an expiry Buildbot decided."""
    at = build['complete_at'] * 1000
    results = build['results']
    if results in (SUCCESS, WARNINGS, FAILURE):
        outcome = 'failed' if results == FAILURE else 'succeeded'
        return {'kind': 'result', **claim, 'decision': 'accepted', 'outcome': outcome, 'received_ms': at}
    # RETRY: the master lost the worker and put the request back in the queue. EXCEPTION,
    # CANCELLED (and SKIPPED): the build ended without its command's own result, and the
    # request with it.
    recorded = 'requeued' if results == RETRY else 'failed'
    return {'kind': 'expire', **claim, 'recorded_as': recorded, 'received_ms': at}


# ------------------------------------------------------------------ the master


class Master:
    def __init__(self, options):
        self.options = options
        self.basedir = os.path.join(options.data_dir, 'master')
        self.db_path = os.path.join(self.basedir, 'state.sqlite')
        self.process = None
        self.stopping = False

    def prepare(self):
        marker = os.path.join(self.basedir, '.fencelab-created')
        if not os.path.exists(marker):
            shutil.rmtree(self.basedir, ignore_errors=True)  # a creation a kill cut short
            subprocess.run(
                [os.path.join(BIN, 'buildbot'), 'create-master', '--quiet', '--db=sqlite:///state.sqlite', self.basedir],
                check=True, stdout=sys.stderr,
            )
            open(marker, 'w').close()
        settings = {
            'pb_port': self.options.pb_port,
            'runners': self.options.runners,
            'passwords': {f'r{k}': derive(self.options.secret, f'worker:r{k}') for k in range(1, self.options.runners + 1)},
            'fencelab': self.options.fencelab,
            'secret': self.options.secret,
            'try_user': TRY_USER,
            'try_password': derive(self.options.secret, 'try'),
            'key_locks': self.options.key_locks,
        }
        write_atomically(os.path.join(self.basedir, 'fencelab-settings.json'), json.dumps(settings, indent=1))
        shutil.copyfile(os.path.join(HERE, 'master.cfg'), os.path.join(self.basedir, 'master.cfg'))
        stale = os.path.join(self.basedir, 'twistd.pid')  # a killed master's; twistd refuses to start over it
        if os.path.exists(stale):
            os.unlink(stale)

    def start(self):
        self.process = subprocess.Popen(
            [os.path.join(BIN, 'buildbot'), 'start', '--nodaemon', self.basedir],
            stdout=sys.stderr, stderr=sys.stderr, preexec_fn=die_with_parent,
        )
        threading.Thread(target=self.watch, daemon=True).start()

    def watch(self):
        code = self.process.wait()
        if not self.stopping:
            log(f'the buildbot master exited ({code})')
            os._exit(3)

    def up(self):
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            with socket.create_connection(('127.0.0.1', self.options.pb_port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self):
        self.stopping = True
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=1.5)
            except subprocess.TimeoutExpired:
                self.process.kill()


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


# ------------------------------------------------------------------ submission: `buildbot try` over PB


class Submitter:
    """Buildbot's try interface (Try_Userpass's perspective_try, the call `buildbot try
    --connect=pb` makes), from a Twisted reactor in a thread of its own. The call answers
    once the buildset and its build request are in Buildbot's database, which is what makes
    it the submission: an answer is Buildbot's acceptance, and nothing is acknowledged before."""

    def __init__(self, port, password):
        from twisted.internet import reactor

        self.reactor, self.port, self.password = reactor, port, password
        self.seen_ready = False
        threading.Thread(target=lambda: reactor.run(installSignalHandlers=False), daemon=True).start()

    def submit(self, properties, timeout_s=10):
        from twisted.internet import threads

        return threads.blockingCallFromThread(self.reactor, self._submit, properties, timeout_s)

    def _submit(self, properties, timeout_s):
        from twisted.cred import credentials
        from twisted.internet import defer
        from twisted.spread import pb

        factory = pb.PBClientFactory()
        connector = self.reactor.connectTCP('127.0.0.1', self.port, factory, timeout=timeout_s)

        @defer.inlineCallbacks
        def call():
            try:
                perspective = yield factory.login(credentials.UsernamePassword(TRY_USER.encode(), self.password.encode()))
                # (branch, revision, patch, repository, project, builderNames, who, comment, properties)
                status = yield perspective.callRemote(
                    'try', None, None, (0, b''), '', '', ['deploy'], 'fencelab', properties['job'], properties
                )
                return status is not None
            finally:
                connector.disconnect()

        return call().addTimeout(timeout_s, self.reactor)

    def ready(self, timeout_s=2):
        """Whether the try scheduler takes a login: the master's PB port listens before its
        schedulers are configured, and on a loaded machine the gap lasts seconds. Once true,
        true for good (a restart is a new process)."""
        if self.seen_ready:
            return True
        try:
            self.seen_ready = threads_call(self.reactor, self._login, timeout_s)
        except Exception:  # noqa: BLE001 (not ready: refused, timed out, not listening)
            return False
        return self.seen_ready

    def _login(self, timeout_s):
        from twisted.cred import credentials
        from twisted.internet import defer
        from twisted.spread import pb

        factory = pb.PBClientFactory()
        connector = self.reactor.connectTCP('127.0.0.1', self.port, factory, timeout=timeout_s)

        @defer.inlineCallbacks
        def call():
            try:
                yield factory.login(credentials.UsernamePassword(TRY_USER.encode(), self.password.encode()))
                return True
            finally:
                connector.disconnect()

        return call().addTimeout(timeout_s, self.reactor)


def threads_call(reactor, function, *args):
    from twisted.internet import threads

    return threads.blockingCallFromThread(reactor, function, *args)


# ------------------------------------------------------------------ the facade's own state


class Facade:
    def __init__(self, options, master, ledger, submitter):
        self.options, self.master, self.ledger, self.submitter = options, master, ledger, submitter
        self.state_path = os.path.join(options.data_dir, 'facade.json')
        self.state = {'project': None, 'runners': {}}
        if os.path.exists(self.state_path):
            with open(self.state_path, encoding='utf-8') as f:
                self.state = json.load(f)
        self.lock = threading.Lock()
        self.submit_lock = threading.Lock()

    def save(self):
        write_atomically(self.state_path, json.dumps(self.state))

    def password(self, runner):
        return derive(self.options.secret, f'worker:{runner}')

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
        for runner in self.state['runners']:
            if hmac.compare_digest(token, self.password(runner)):
                return ('runner', runner)
        raise ApiError(401, 'unauthorized', 'the bearer token is not known')

    def create_project(self, who, body):
        fields(body, {'id': str}, {})
        if who[0] != 'operator':
            raise ApiError(403, 'forbidden', 'creating a project needs the operator token')
        check_id(body['id'], 'id')
        with self.lock:
            if self.state['project'] is not None:
                raise ApiError(409, 'exists', f"a project exists ({self.state['project']}); Buildbot's builder serves one")
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
                raise ApiError(404, 'unknown_runner', f"master.cfg configures workers r1..r{self.options.runners} only, not {body['id']}")
            if body['id'] in self.state['runners']:
                raise ApiError(409, 'exists', f"runner {body['id']} is registered")
            self.state['runners'][body['id']] = project
            self.save()
        return 201, {'id': body['id'], 'project': project, 'token': self.password(body['id'])}

    def submit(self, who, body):
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
        with self.submit_lock:
            known = Snapshot(self.master.db_path).by_job
            job = body.get('id')
            if job is None:
                n = len(known) + 1
                while f'j{n}' in known:
                    n += 1
                job = f'j{n}'
            if job in known:
                raise ApiError(409, 'exists', f'job {job} exists')
            properties = {'job': job, 'project': body['project'], 'deployment_key': body['deployment_key'], 'steps': steps, 'step_ms': step_ms}
            try:
                accepted = self.submitter.submit(properties)
            except Exception as error:  # noqa: BLE001 (any failure of the call)
                # The call may have reached Buildbot; its database says whether it did.
                if job not in Snapshot(self.master.db_path).by_job:
                    raise ApiError(503, 'outcome_unknown', f'buildbot try did not answer ({error!r})') from error
                accepted = True
            if not accepted:
                raise ApiError(500, 'internal', 'buildbot refused the try request (no builder)')
            for _ in range(100):  # the buildset is in the database once try answered
                self.ledger.poll()
                if self.ledger.has_submit(job):
                    break
                time.sleep(0.05)
        return 201, {'id': job}

    # A job is shown as of a snapshot the ledger already holds every fact of (the recorder
    # polls it first): a view never shows what the ledger has not recorded.
    def jobs(self, who):
        self.operator(who, 'reading jobs')
        snapshot = self.ledger.poll()
        return 200, [job_view(job, False, []) for job in snapshot.jobs]

    def job(self, who, job_id):
        self.operator(who, 'reading a job')
        job = self.ledger.poll().by_job.get(job_id)
        if job is None:
            raise ApiError(404, 'unknown_job', f'no job {job_id}')
        return 200, job_view(job, True, self.ledger.of_job(job_id))

    def ledger_page(self, who, after, limit):
        self.operator(who, 'reading the ledger')
        return 200, self.ledger.page(after, limit)

    @staticmethod
    def operator(who, what):
        if who[0] != 'operator':
            raise ApiError(403, 'forbidden', f'{what} needs the operator token')


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


NOT_PROVIDED = {
    '/v1/claim': 'Buildbot has no claim: its master assigns builds to connected workers itself',
    '/v1/heartbeat': 'Buildbot has no lease and no heartbeat',
    '/v1/result': "Buildbot records a build's result from its own worker connection",
    '/v1/capability': 'Buildbot has no capability',
    '/v1/reconcile': 'Buildbot has no reconciliation of uncertain attempts',
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    facade: Facade = None

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
        facade = self.facade
        target = urllib.parse.urlsplit(self.path)
        path = target.path
        try:
            if path in NOT_PROVIDED:
                self.read_body()
                raise ApiError(404, 'not_provided', NOT_PROVIDED[path])
            posts = {'/v1/projects': facade.create_project, '/v1/runners': facade.register_runner, '/v1/jobs': facade.submit}
            if path == '/v1/health':
                self.allow(method, 'GET')
                if not facade.master.up() or not facade.submitter.ready():
                    raise ApiError(503, 'unavailable', 'the buildbot master is not up yet (its try scheduler takes no login)')
                return self.answer(200, {'status': 'ok'})
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
            log(f'{method} {path}: {error!r}')
            self.fail(ApiError(500, 'internal', f'the facade failed ({error})'))

    def allow(self, method, wanted, also_get=False):
        if method != wanted:
            error = ApiError(405, 'method_not_allowed', f'{method} is not allowed here')
            error.allow = 'GET, HEAD, POST' if also_get else ('GET, HEAD' if wanted == 'GET' else wanted)
            self.read_body()
            raise error


def recorder(ledger):
    while True:
        try:
            ledger.poll()
        except Exception as error:  # noqa: BLE001 (a busy or half-made database: the next poll tries again)
            log(f'recording: {error!r}')
        time.sleep(POLL_S)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--listen', required=True)
    parser.add_argument('--pb-port', required=True, type=int)
    parser.add_argument('--runners', required=True, type=int)
    parser.add_argument('--operator-token', required=True)
    parser.add_argument('--fencelab', required=True)
    parser.add_argument('--secret', required=True)
    parser.add_argument('--key-locks', action='store_true',
                        help="a Buildbot master lock per deployment key (a user's one-deployment-per-key setup)")
    options = parser.parse_args()
    if not options.operator_token or not options.secret or options.runners < 1:
        parser.error('--operator-token and --secret must not be empty, and --runners at least 1')
    host, _, port = options.listen.rpartition(':')
    os.makedirs(options.data_dir, exist_ok=True)

    master = Master(options)
    master.prepare()
    ledger = Ledger(os.path.join(options.data_dir, 'ledger.jsonl'), master.db_path)
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True

    def stop(signum, frame):
        master.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    master.start()
    Handler.facade = Facade(options, master, ledger, Submitter(options.pb_port, derive(options.secret, 'try')))
    threading.Thread(target=recorder, args=(ledger,), daemon=True).start()
    log(f'serving on {options.listen}; buildbot master in {master.basedir}, PB on 127.0.0.1:{options.pb_port}')
    server.serve_forever()


if __name__ == '__main__':
    main()
