#!/usr/bin/env python3
"""fencelab's control-plane role for the observed Airflow 3 system.

Airflow runs unmodified (its scheduler, API server and DAG processor started from here as
child processes, its edge workers started by runner.py) and makes every decision about a
job. This program only:

- makes the metadata database (a database of its own in the run's PostgreSQL cluster) and
  Airflow's schema in it (`airflow db migrate`), once, and starts Airflow on it, with every
  setting from airflow_env.py; the API server listens on --api-port, which every edge
  worker reaches through its own fault proxy;
- serves the operator half of fencelab's contract (docs/protocol.md) on --listen: a project,
  runner registration (the answer carries what an edge worker signs its requests with),
  job submission as a DAG run of `fencelab_deploy` through Airflow's own REST API
  (`POST /api/v2/dags/fencelab_deploy/dagRuns`, the run id = the job id, the job in the
  run's conf), and job views read from Airflow's database;
- records Airflow's own records as a ledger (`GET /v1/ledger`): a thread reads the database
  every 100 ms (the DAG runs, the task instance and its tries' history, the event log) and
  the API server's own access log (which try reported its own end through the Execution
  API), and appends each fact the first time it sees it to ledger.jsonl, so that a SIGKILL
  and a restart keep every entry and its seq.

It decides nothing and adds nothing Airflow lacks. Airflow has heartbeats but no lease with
an end: a try stays its task's current try until the scheduler's sweep finds its last
heartbeat older than the timeout, and a heartbeat accepted before that sweep extends it
however late it came; no expiry instant is recorded anywhere. Claims therefore carry no
lease_expires_ms. Airflow has no capability, reconciliation or operator reconcile: those
endpoints answer 404 `not_provided`. An attempt is one task try (`<job>-t<try number>`); its
fence is the try's generation, the first 64 bits of its UUIDv7 id (see dags/fencelab_deploy.py).
"""

import argparse
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import psycopg2
import psycopg2.extensions

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'observed'))
import airflow_env  # noqa: E402
import recorder  # noqa: E402 (systems/observed/recorder.py: what the observed systems' recorders share)
from airflow_env import DAG_ID, TASK_ID  # noqa: E402
from recorder import BIN, ApiError, die_with_parent  # noqa: E402

# A failed try whose own report of its end the API server's log does not (yet) show is
# recorded as Airflow's own decision only once it ended this long ago: the access log's line
# is written when the request's answer is sent, a moment after the database's commit.
OWN_REPORT_WAIT_MS = 1000
COMPONENTS = ('api-server', 'scheduler', 'dag-processor')
# The event log's rows for a try, each stamped by the Airflow process that wrote it (its
# host's clock): `running` (the API server took the try's start), `success`, `failed`,
# `up_for_retry` (the API server took the try's own report of its end), `heartbeat timeout`
# (the scheduler found its heartbeats stopped). The task instance's own start_date and
# end_date are the worker's: the supervisor sends them from its clock (and sends them again
# unchanged when it retries the call), so they are not the server's receipt.
EVENTS = ('running', 'success', 'failed', 'up_for_retry', 'heartbeat timeout')
# The Execution API's own access-log line for a try's report of its end
# (`PATCH /execution/task-instances/{id}/state`), and the answer it got.
STATE_REPORT = re.compile(
    r'method=PATCH path=/execution/task-instances/([0-9a-f-]{36})/state\b.*?status_code=(\d{3})'
)


log = recorder.logger(stamped=True)


def ms(instant):
    """Airflow's timestamps (timezone-aware, microseconds) in whole milliseconds."""
    return int(instant.timestamp() * 1000)


def generation(ti_id):
    """The try's fence, as the DAG's task computes it: the first 64 bits of its UUIDv7 id."""
    return int(ti_id.replace('-', ''), 16) >> 64


# ------------------------------------------------------------------ Airflow's records


class Snapshot:
    """One consistent read (REPEATABLE READ) of what Airflow recorded for the deploy DAG: its
    runs, each run's task instance and the history of its earlier tries, and the event log's
    heartbeat timeouts."""

    def __init__(self, dsn):
        self.jobs = []  # in submission (DAG run id) order
        self.by_job = {}
        conn = psycopg2.connect(dsn, connect_timeout=5)
        try:
            conn.set_session(isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ, readonly=True)
            with conn.cursor() as cur:
                cur.execute('SELECT id, run_id, conf, queued_at, state FROM dag_run WHERE dag_id = %s ORDER BY id', (DAG_ID,))
                runs = cur.fetchall()
                cur.execute(
                    'SELECT id::text, run_id, try_number, state, hostname, start_date, end_date FROM task_instance '
                    'WHERE dag_id = %s AND task_id = %s', (DAG_ID, TASK_ID))
                current = cur.fetchall()
                cur.execute(
                    'SELECT task_instance_id::text, run_id, try_number, state, hostname, start_date, end_date '
                    'FROM task_instance_history WHERE dag_id = %s AND task_id = %s', (DAG_ID, TASK_ID))
                history = cur.fetchall()
                cur.execute(
                    'SELECT run_id, try_number, event, min(dttm) FROM log WHERE dag_id = %s AND task_id = %s AND event IN %s '
                    'GROUP BY run_id, try_number, event', (DAG_ID, TASK_ID, EVENTS))
                events = cur.fetchall()
            conn.rollback()
        finally:
            conn.close()
        for _, run_id, conf, queued_at, state in runs:
            if not isinstance(conf, dict) or conf.get('job') != run_id or queued_at is None:
                continue  # not a run this recorder submitted
            job = {'job': run_id, 'project': conf['project'], 'deployment_key': conf['deployment_key'],
                   'steps': conf['steps'], 'step_ms': conf['step_ms'], 'submitted_at': queued_at, 'state': state,
                   'tries': {}, 'current': None}
            self.jobs.append(job)
            self.by_job[run_id] = job
        for ti_id, run_id, try_number, state, hostname, start, end in history:
            job = self.by_job.get(run_id)
            if job is not None and start is not None and hostname:
                job['tries'][try_number] = try_of(ti_id, try_number, state, hostname, start, end, past=True)
        for ti_id, run_id, try_number, state, hostname, start, end in current:
            job = self.by_job.get(run_id)
            if job is None:
                continue
            job['current'] = {'id': ti_id, 'try_number': try_number, 'state': state}
            # The live row holds its try's own fields only while that try runs or once it
            # ended for good: a try sent back for retry is already in the history, and the
            # live row then carries the next try's id beside the last try's times and host.
            if state in ('running', 'success', 'failed') and start is not None and hostname and try_number not in job['tries']:
                job['tries'][try_number] = try_of(ti_id, try_number, state, hostname, start, end, past=False)
        for run_id, try_number, event, at in events:
            job = self.by_job.get(run_id)
            if job is not None and try_number in job['tries']:
                job['tries'][try_number]['events'][event] = at


def try_of(ti_id, try_number, state, hostname, start, end, past):
    return {'id': ti_id, 'try_number': try_number, 'state': state, 'runner': hostname, 'start': start,
            'end': end if state in ('success', 'failed', 'up_for_retry', 'upstream_failed', 'skipped', 'removed') or past else None,
            'past': past, 'events': {}}


def attempt_id(job, tried):
    return f"{job['job']}-t{tried['try_number']}"


def spec_of(job):
    return {'steps': job['steps'], 'step_ms': job['step_ms']}


def sorted_tries(job):
    return [job['tries'][n] for n in sorted(job['tries'])]


def requeued(job, tried):
    """Whether Airflow went on to another try of the task after this one."""
    current = job['current']
    return current is not None and (current['try_number'] > tried['try_number'] or current['state'] in ('up_for_retry', 'scheduled', 'queued'))


def job_state(job, ledger):
    """The job's state as Airflow's records say it, as far as the ledger holds them: a try
    whose end the ledger has not recorded yet is still running."""
    tries = sorted_tries(job)
    if tries:
        close = ledger.close_of(attempt_id(job, tries[-1]))
        if close is None:
            return 'running'
        if close['kind'] == 'result':
            return close['outcome']  # the try's own end: the DAG run's end follows from it
        if close['recorded_as'] == 'failed':
            return 'failed'
        return 'queued'  # sent back for another try
    if job['state'] == 'failed':
        return 'failed'  # ended by Airflow before any try ran
    return 'queued'


# ------------------------------------------------------------------ the API server's own log


class ReportLog:
    """Which tries reported their own end: the Execution API's access-log lines for `PATCH
    /execution/task-instances/{id}/state`, read from the API server's log file as it grows
    (from its start after a restart: the file is appended to)."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.pending = b''
        self.accepted = set()  # try ids whose own end report the API server answered 2xx
        self.refused = {}  # try id -> the statuses of its refused end reports

    def read(self):
        try:
            with open(self.path, 'rb') as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.pending + data).split(b'\n')
        self.pending = lines.pop()
        for line in lines:
            match = STATE_REPORT.search(line.decode('utf-8', 'replace'))
            if match is None:
                continue
            ti_id, status = match.group(1), int(match.group(2))
            if 200 <= status < 300:
                self.accepted.add(ti_id)
            else:
                self.refused.setdefault(ti_id, []).append(status)


# ------------------------------------------------------------------ the ledger


class Ledger(recorder.LedgerFile):
    """The append-only record of Airflow's facts, in ledger.jsonl (one entry a line)."""

    def __init__(self, path, dsn, reports):
        self.dsn, self.reports = dsn, reports
        self.closes = {}  # attempt -> its result or expire entry
        super().__init__(path)

    def remember(self, entry):
        super().remember(entry)
        if entry['kind'] in ('result', 'expire'):
            self.closes[entry['attempt']] = entry

    @staticmethod
    def fact_key(entry):
        if entry['kind'] == 'submit':
            return ('submit', entry['job'])
        if entry['kind'] == 'claim':
            return ('claim', entry['attempt'])
        return ('close', entry['attempt'])

    def poll(self):
        """Reads Airflow's records once and appends every fact not yet recorded; returns the
        snapshot read, every fact of which is then in the ledger."""
        with self.lock:
            self.reports.read()
            snapshot = Snapshot(self.dsn)
            now_ms = int(time.time() * 1000)
            mono = time.monotonic_ns()
            facts = []
            for job in snapshot.jobs:
                base = {'project': job['project'], 'job': job['job']}
                if ('submit', job['job']) not in self.seen:
                    at = ms(job['submitted_at'])
                    facts.append(((at, 0, 0), ('submit', job['job']),
                                  {'kind': 'submit', **base, 'deployment_key': job['deployment_key'], 'received_ms': at}))
                for tried in sorted_tries(job):
                    attempt = attempt_id(job, tried)
                    claim = {**base, 'attempt': attempt, 'runner': tried['runner'], 'fence': generation(tried['id']),
                             'deployment_key': job['deployment_key']}
                    if ('claim', attempt) not in self.seen:
                        at = ms(tried['events'].get('running') or tried['start'])
                        facts.append(((at, 1, tried['try_number']), ('claim', attempt),
                                      {'kind': 'claim', **claim, 'decision': 'accepted', 'received_ms': at}))
                    if tried['end'] is not None and ('close', attempt) not in self.seen:
                        entry = self.close_entry(job, tried, claim, now_ms)
                        if entry is not None:
                            facts.append(((entry['received_ms'], 2, tried['try_number']), ('close', attempt), entry))
            if facts:
                self.append(facts, mono)
            return snapshot

    def close_entry(self, job, tried, claim, now_ms):
        """How an ended try is recorded: its own result, or Airflow's decision to end it.

        A try whose end its own supervisor reported (the Execution API answered its `PATCH
        .../state` 2xx) ended with a result: `succeeded` or `failed` as the task said. A try
        that ended otherwise was ended by Airflow — the scheduler found its heartbeats stopped
        (the event log's `heartbeat timeout`), or an executor or a restarted scheduler gave it
        up — and is an `expire`: `requeued` when Airflow went on to another try of the task,
        `failed` when it ended the task there. None while the answer to the try's own report
        may not be in the access log yet."""
        events = tried['events']
        timed_out = 'heartbeat timeout' in events
        own = tried['id'] in self.reports.accepted
        if tried['state'] == 'success' or (own and not timed_out):
            outcome = 'succeeded' if tried['state'] == 'success' else 'failed'
            at = events.get('success' if outcome == 'succeeded' else 'failed') or events.get('up_for_retry') or tried['end']
            return {'kind': 'result', **claim, 'decision': 'accepted', 'outcome': outcome, 'received_ms': ms(at)}
        at = ms(tried['end'])
        if not own and not timed_out and now_ms - at < OWN_REPORT_WAIT_MS:
            return None
        # Airflow's end of the try: its end_date, set by the Airflow process that ended it
        # (for a heartbeat timeout, the DAG processor running the scheduler's callback, after
        # the event log's `heartbeat timeout`).
        recorded = 'requeued' if requeued(job, tried) else 'failed'
        return {'kind': 'expire', **claim, 'recorded_as': recorded, 'received_ms': at}

    def close_of(self, attempt):
        with self.lock:
            return self.closes.get(attempt)


def job_view(job, full, ledger):
    state = job_state(job, ledger)
    view = {'id': job['job'], 'project': job['project'], 'deployment_key': job['deployment_key'], 'spec': spec_of(job), 'state': state}
    tries = sorted_tries(job)
    if tries:
        view['current_attempt'] = attempt_id(job, tries[-1])
    if state in ('succeeded', 'failed'):
        view['outcome'] = state
    view['attempts'] = []
    view['ledger'] = []
    if full:
        entries = ledger.of_job(job['job'])
        closes = {entry['attempt']: entry for entry in entries if entry['kind'] in ('result', 'expire')}
        for tried in tries:
            attempt = attempt_id(job, tried)
            view_of = {
                'id': attempt, 'job': job['job'], 'runner': tried['runner'], 'fence': generation(tried['id']),
                'state': 'running', 'current': tried is tries[-1], 'claimed_ms': ms(tried['events'].get('running') or tried['start']),
            }
            # Airflow grants no lease with an end: lease_expires_ms is left out.
            close = closes.get(attempt)
            if close is not None:
                if close['kind'] == 'result':
                    view_of['state'], view_of['closed_by'] = close['outcome'], 'result'
                else:
                    view_of['state'] = 'failed'
                    view_of['closed_by'] = 'expired-requeued' if close['recorded_as'] == 'requeued' else 'result'
            view['attempts'].append(view_of)
        view['ledger'] = entries
    return view


# ------------------------------------------------------------------ Airflow's processes


class Airflow:
    def __init__(self, options):
        self.options = options
        self.home = os.path.join(options.data_dir, 'airflow')
        server = urllib.parse.urlsplit(options.database_url)
        self.server_dsn = options.database_url.replace('postgres://', 'postgresql://', 1)
        self.database = options.schema
        self.dsn = urllib.parse.urlunsplit(('postgresql', server.netloc, f'/{self.database}', '', ''))
        self.env = dict(os.environ)
        self.env.update(airflow_env.control_plane(
            options.secret, options.lease_ms, self.home,
            self.dsn.replace('postgresql://', 'postgresql+psycopg2://', 1), options.api_port))
        self.processes = {}
        self.stopping = False
        self.log_path = os.path.join(options.data_dir, 'api-server.log')

    def prepare(self):
        """The metadata database and Airflow's schema in it, made once (a marker says so)."""
        os.makedirs(self.home, exist_ok=True)
        marker = os.path.join(self.options.data_dir, '.fencelab-migrated')
        if os.path.exists(marker):
            return
        conn = psycopg2.connect(self.server_dsn, connect_timeout=10)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute('SELECT 1 FROM pg_database WHERE datname = %s', (self.database,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()
        subprocess.run([os.path.join(BIN, 'airflow'), 'db', 'migrate'], env=self.env, cwd=self.options.data_dir,
                       check=True, stdout=sys.stderr, stderr=sys.stderr, preexec_fn=die_with_parent)
        open(marker, 'w').close()

    def start(self):
        for name in COMPONENTS:
            out = open(self.log_path, 'ab') if name == 'api-server' else sys.stderr
            self.processes[name] = subprocess.Popen(
                [os.path.join(BIN, 'airflow'), name], env=self.env, cwd=self.options.data_dir,
                stdout=out, stderr=out, preexec_fn=die_with_parent,
            )
            threading.Thread(target=self.watch, args=(name,), daemon=True).start()

    def watch(self, name):
        code = self.processes[name].wait()
        if not self.stopping:
            log(f'airflow {name} exited ({code})')
            self.stop()
            os._exit(3)

    def health(self):
        """Why Airflow cannot take a job yet, or None: the API server answers, its metadata
        database is healthy by Airflow's own health check, and the deploy DAG is parsed and
        unpaused. The scheduler is not waited for: a DAG run submitted before it is up waits
        in the queue, as Airflow's own API allows."""
        try:
            with urllib.request.urlopen(f'http://127.0.0.1:{self.options.api_port}/api/v2/monitor/health', timeout=2) as answer:
                health = json.load(answer)
        except (OSError, ValueError) as error:
            return f'the API server does not answer ({error})'
        if (health.get('metadatabase') or {}).get('status') != 'healthy':
            return 'Airflow says its metadata database is not healthy'
        try:
            conn = psycopg2.connect(self.dsn, connect_timeout=2)
            try:
                with conn.cursor() as cur:
                    cur.execute('SELECT d.is_paused FROM dag d JOIN serialized_dag s ON s.dag_id = d.dag_id WHERE d.dag_id = %s', (DAG_ID,))
                    row = cur.fetchone()
            finally:
                conn.close()
        except psycopg2.Error as error:
            return f'the metadata database does not answer ({error})'
        if row is None:
            return f'the DAG {DAG_ID} is not parsed yet'
        if row[0]:
            return f'the DAG {DAG_ID} is paused'
        return None

    def query(self, sql, args):
        conn = psycopg2.connect(self.dsn, connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchone()
        finally:
            conn.close()

    def runs(self):
        return self.query('SELECT count(*) FROM dag_run WHERE dag_id = %s', (DAG_ID,))[0]

    def has_run(self, job):
        return self.query('SELECT 1 FROM dag_run WHERE dag_id = %s AND run_id = %s', (DAG_ID, job)) is not None

    def stop(self):
        self.stopping = True
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 1.5
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


# ------------------------------------------------------------------ submission: Airflow's REST API


class Submitter:
    """Airflow's public REST API: `POST /api/v2/dags/fencelab_deploy/dagRuns`. Its answer
    comes once the DAG run is in the database, which is what makes it the submission. The
    token is the simple auth manager's (`GET /auth/token`, every user an admin)."""

    def __init__(self, port):
        self.base = f'http://127.0.0.1:{port}'
        self.token = None

    def call(self, method, path, body=None, timeout_s=10):
        if self.token is None:
            with urllib.request.urlopen(f'{self.base}/auth/token', timeout=timeout_s) as answer:
                self.token = json.load(answer)['access_token']
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f'{self.base}{path}', data=data, method=method)
        request.add_header('Authorization', f'Bearer {self.token}')
        request.add_header('Content-Type', 'application/json')
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as error:
            if error.code == 401:
                self.token = None
            return error.code, error.read().decode('utf-8', 'replace')

    def submit(self, conf):
        body = {'dag_run_id': conf['job'], 'logical_date': None, 'conf': conf}
        return self.call('POST', f'/api/v2/dags/{DAG_ID}/dagRuns', body)


# ------------------------------------------------------------------ the facade's own state


class Facade(recorder.Facade):
    one_project = 'the deploy DAG serves one'
    runners_are = 'the deployment has edge workers'

    def __init__(self, options, airflow, ledger, submitter):
        super().__init__(options, ledger)
        self.airflow, self.submitter = airflow, submitter
        self.ready = False

    def runner_token(self, runner=None):
        """What an edge worker signs its requests to the API server with: the deployment's JWT
        secret, one for every worker (Airflow knows no per-worker credential)."""
        return airflow_env.jwt_secret(self.options.secret)

    def runner_of(self, token):
        if self.state['runners'] and hmac.compare_digest(token, self.runner_token()):
            return ('runner', None)
        return None

    def health(self):
        if not self.ready:
            why = self.airflow.health()
            if why is not None:
                raise ApiError(503, 'unavailable', f'Airflow is not up yet: {why}')
            self.ready = True  # once up, up for good: a restart is a new process
        return 200, {'status': 'ok'}

    def submit(self, who, body):
        job, what = self.checked_submission(who, body)
        if job is None:
            with self.submit_lock:  # a fresh id: the next j<n> Airflow has no run of
                n = self.airflow.runs() + 1
                while self.airflow.has_run(f'j{n}'):
                    n += 1
                job = f'j{n}'
        conf = {'job': job, **what}
        try:
            status, answer = self.submitter.submit(conf)
        except OSError as error:
            status, answer = None, repr(error)
        if status == 409:  # Airflow's own answer for a run id it has
            raise ApiError(409, 'exists', f'job {job} exists')
        if status != 200:
            # The call may have reached Airflow; its database says whether it did.
            if not self.airflow.has_run(job):
                if status is None or status >= 500:
                    raise ApiError(503, 'outcome_unknown', f'Airflow did not take the DAG run ({status}: {answer})')
                raise ApiError(500, 'internal', f'Airflow refused the DAG run ({status}: {answer})')
        for _ in range(100):  # the DAG run is in the database once the API answered
            if self.ledger.has_submit(job):
                break
            self.ledger.poll()
            if self.ledger.has_submit(job):
                break
            time.sleep(0.05)
        return 201, {'id': job}

    def view(self, job, full):
        return job_view(job, full, self.ledger)


NOT_PROVIDED = {
    '/v1/claim': "Airflow has no claim: its edge workers fetch the tries the scheduler queued through Airflow's own edge API",
    '/v1/heartbeat': "Airflow's tries heartbeat through its own Execution API, and it grants no lease with an end",
    '/v1/result': "Airflow records a try's end from its own supervisor's Execution API report",
    '/v1/capability': 'Airflow has no capability',
    '/v1/reconcile': 'Airflow has no reconciliation of uncertain tries',
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--listen', required=True)
    parser.add_argument('--api-port', required=True, type=int, help="the API server's port, which the edge workers reach through their proxies")
    parser.add_argument('--runners', required=True, type=int)
    parser.add_argument('--operator-token', required=True)
    parser.add_argument('--secret', required=True)
    parser.add_argument('--lease-ms', required=True, type=int)
    parser.add_argument('--database-url', required=True, help="the run's PostgreSQL server (libpq URL)")
    parser.add_argument('--schema', required=True, help='the name of the metadata database made in it')
    options = parser.parse_args()
    if not options.operator_token or not options.secret or options.runners < 1:
        parser.error('--operator-token and --secret must not be empty, and --runners at least 1')
    if not re.match(r'^[a-z_][a-z0-9_]{0,62}$', options.schema):
        parser.error('--schema must be 1 to 63 of [a-z0-9_], not starting with a digit')
    options.data_dir = os.path.abspath(options.data_dir)
    os.makedirs(options.data_dir, exist_ok=True)

    # Both ports are bound before Airflow is prepared (a minute or more on a loaded machine):
    # the contract's now, the API server's until Airflow starts it. The harness keeps up to 64
    # submissions in flight, and Airflow answers each in tens to hundreds of milliseconds:
    # socketserver's backlog of 5 would refuse connections.
    server = recorder.Server(options.listen, NOT_PROVIDED, log, request_queue_size=256)
    api_port = recorder.hold_port(options.api_port)
    airflow = Airflow(options)

    def stop(signum, frame):
        log(f'stopping on signal {signum}')
        airflow.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    airflow.prepare()
    ledger = Ledger(os.path.join(options.data_dir, 'ledger.jsonl'), airflow.dsn, ReportLog(airflow.log_path))
    api_port.close()
    airflow.start()
    server.facade = Facade(options, airflow, ledger, Submitter(options.api_port))
    threading.Thread(target=recorder.keep_recording, args=(ledger, log), daemon=True).start()
    log(f'serving on {options.listen}; Airflow in {airflow.home}, its API server on 127.0.0.1:{options.api_port}')
    server.serve_forever()


if __name__ == '__main__':
    main()
