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
import hmac
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'observed'))
import recorder  # noqa: E402 (systems/observed/recorder.py: what the observed systems' recorders share)
from recorder import BIN, ApiError, derive, die_with_parent, write_atomically  # noqa: E402

# Buildbot's result codes (buildbot/process/results.py).
SUCCESS, WARNINGS, FAILURE, SKIPPED, EXCEPTION, RETRY, CANCELLED = range(7)
TRY_USER = 'fencelab-submit'
# Properties the facade puts on each buildset and reads back; nothing else identifies a job.
JOB_PROPS = ('job', 'project', 'deployment_key', 'steps', 'step_ms')
log = recorder.logger(stamped=False)


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


class Ledger(recorder.LedgerFile):
    """The append-only record of Buildbot's facts, in ledger.jsonl (one entry a line)."""

    def __init__(self, path, db_path):
        self.db_path = db_path
        super().__init__(path)

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
            if facts:
                self.append(facts, mono)
            return snapshot


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


class Facade(recorder.Facade):
    one_project = "Buildbot's builder serves one"
    runners_are = 'master.cfg configures workers'

    def __init__(self, options, master, ledger, submitter):
        super().__init__(options, ledger)
        self.master, self.submitter = master, submitter

    def password(self, runner):
        return derive(self.options.secret, f'worker:{runner}')

    def runner_token(self, runner):
        return self.password(runner)

    def runner_of(self, token):
        for runner in self.state['runners']:
            if hmac.compare_digest(token, self.password(runner)):
                return ('runner', runner)
        return None

    def health(self):
        if not self.master.up() or not self.submitter.ready():
            raise ApiError(503, 'unavailable', 'the buildbot master is not up yet (its try scheduler takes no login)')
        return 200, {'status': 'ok'}

    def submit(self, who, body):
        job, what = self.checked_submission(who, body)
        with self.submit_lock:
            known = Snapshot(self.master.db_path).by_job
            if job is None:
                n = len(known) + 1
                while f'j{n}' in known:
                    n += 1
                job = f'j{n}'
            if job in known:
                raise ApiError(409, 'exists', f'job {job} exists')
            properties = {'job': job, **what}
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

    def view(self, job, full):
        return job_view(job, full, self.ledger.of_job(job['job']) if full else [])


NOT_PROVIDED = {
    '/v1/claim': 'Buildbot has no claim: its master assigns builds to connected workers itself',
    '/v1/heartbeat': 'Buildbot has no lease and no heartbeat',
    '/v1/result': "Buildbot records a build's result from its own worker connection",
    '/v1/capability': 'Buildbot has no capability',
    '/v1/reconcile': 'Buildbot has no reconciliation of uncertain attempts',
}


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
    os.makedirs(options.data_dir, exist_ok=True)

    # Both ports are bound before the master is prepared: the contract's now, PB's until the
    # master starts and takes it.
    server = recorder.Server(options.listen, NOT_PROVIDED, log)
    pb_port = recorder.hold_port(options.pb_port)
    master = Master(options)
    master.prepare()
    ledger = Ledger(os.path.join(options.data_dir, 'ledger.jsonl'), master.db_path)

    def stop(signum, frame):
        master.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    pb_port.close()
    master.start()
    server.facade = Facade(options, master, ledger, Submitter(options.pb_port, derive(options.secret, 'try')))
    threading.Thread(target=recorder.keep_recording, args=(ledger, log), daemon=True).start()
    log(f'serving on {options.listen}; buildbot master in {master.basedir}, PB on 127.0.0.1:{options.pb_port}')
    server.serve_forever()


if __name__ == '__main__':
    main()
