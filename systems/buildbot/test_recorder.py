# Tests that the recorder of control_plane.py decides nothing: records of one job written into a
# real Buildbot 4.3.0 database (Buildbot's own schema, made by `buildbot create-master`; no master
# is started) are read by the recorder's own code into ledger entries, and fencelab's checkers
# judge that ledger from outside (`fencelab evidence --lacks lease`, `fencelab check`).
#
#   systems/buildbot/.venv/bin/python -m unittest systems/buildbot/test_recorder.py
#
# FENCELAB_BIN names the fencelab binary (default: target/debug/fencelab of this repository).
"""The Buildbot recorder maps what Buildbot recorded, and fencelab judges what it mapped."""

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'observed'))

import control_plane  # noqa: E402 (the recorder under test, from this directory)
import judge  # noqa: E402 (systems/observed/judge.py: fencelab's checkers on the ledger)
from buildbot.process.results import RETRY, SUCCESS  # noqa: E402 (Buildbot's own codes, not the recorder's)
from buildbot.util.sautils import hash_columns  # noqa: E402 (Buildbot's own name and stamp hashes)

BUILDBOT = os.path.join(HERE, '.venv', 'bin', 'buildbot')
WORKERS = ('r1', 'r2', 'r3')
# What control_plane.py's Submitter sends as the try call's properties for one job.
JOB = {'job': 'j', 'project': 'fencelab', 'deployment_key': 'k1', 'steps': 3, 'step_ms': 100}


class Buildbot:
    """Writes rows as Buildbot 4.3.0's own database connectors (buildbot/db/*.py) write them
    for a try submission and its builds, one transaction per thing Buildbot does, with
    SQLite's foreign keys enforced. Every *_at column is Unix seconds, as Buildbot keeps it."""

    def __init__(self, path, at):
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute('PRAGMA foreign_keys = ON')
        self.workers = {}
        with self.transaction():
            # masters.findMasterId + setMasterState, builders.findBuilderId + addBuilderMaster,
            # workers.findWorkerId + workerConfigured: what a starting master records.
            name = 'fencelab-master:/fencelab/master'
            self.masterid = self.insert('masters', name=name, name_hash=hash_columns(name), active=1, last_active=at)
            self.builderid = self.insert('builders', name='deploy', name_hash=hash_columns('deploy'))
            buildermasterid = self.insert('builder_masters', builderid=self.builderid, masterid=self.masterid)
            for worker in WORKERS:
                workerid = self.insert('workers', name=worker, info='{}', paused=0, graceful=0)
                self.workers[worker] = workerid
                self.insert('configured_workers', buildermasterid=buildermasterid, workerid=workerid)

    def close(self):
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self):
        self.conn.execute('BEGIN')
        try:
            yield
        except BaseException:
            self.conn.execute('ROLLBACK')
            raise
        self.conn.execute('COMMIT')

    def insert(self, table, **row):
        names = ', '.join(row)
        marks = ', '.join('?' for _ in row)
        return self.conn.execute(f'INSERT INTO {table} ({names}) VALUES ({marks})', tuple(row.values())).lastrowid

    def worker_connected(self, worker):
        with self.transaction():  # workers.workerConnected
            self.insert('connected_workers', masterid=self.masterid, workerid=self.workers[worker])

    def worker_disconnected(self, worker):
        with self.transaction():  # workers.workerDisconnected
            self.conn.execute('DELETE FROM connected_workers WHERE masterid = ? AND workerid = ?',
                              (self.masterid, self.workers[worker]))

    def try_submitted(self, at, properties):
        """Try_Userpass's perspective_try: sourcestamps.findSourceStampId (no patch body, so no
        patch row) and buildsets.addBuildset with the properties sourced "try build" and the
        scheduler's own; returns the build request's id."""
        with self.transaction():
            ss_hash = hash_columns(None, None, '', '', '', None)
            ssid = self.insert('sourcestamps', ss_hash=ss_hash, branch=None, revision=None, patchid=None,
                               repository='', codebase='', project='', created_at=at)
            bsid = self.insert('buildsets', external_idstring=None, reason=f"'try' job by user fencelab ({properties['job']})",
                               submitted_at=at, complete=0, complete_at=None, results=-1, parent_buildid=None,
                               parent_relationship=None, rebuilt_buildid=None)
            sourced = [(name, value, 'try build') for name, value in properties.items()]
            for name, value, source in sourced + [('scheduler', 'fencelab-submit', 'Scheduler')]:
                self.insert('buildset_properties', buildsetid=bsid, property_name=name,
                            property_value=json.dumps([value, source]))
            self.insert('buildset_sourcestamps', buildsetid=bsid, sourcestampid=ssid)
            return self.insert('buildrequests', buildsetid=bsid, builderid=self.builderid, priority=0, complete=0,
                               results=-1, submitted_at=at, complete_at=None, waited_for=0)

    def build_started(self, brid, worker, at):
        """buildrequests.claimBuildRequests, then builds.addBuild; returns the build's id."""
        with self.transaction():
            self.insert('buildrequest_claims', brid=brid, masterid=self.masterid, claimed_at=at)
            number = self.conn.execute('SELECT MAX(number) FROM builds WHERE builderid = ?', (self.builderid,)).fetchone()[0]
            return self.insert('builds', number=(number or 0) + 1, builderid=self.builderid, buildrequestid=brid,
                               workerid=self.workers[worker], masterid=self.masterid, started_at=at, complete_at=None,
                               locks_duration_s=0, state_string='created', results=None)

    def build_finished(self, buildid, results, at):
        with self.transaction():  # builds.finishBuild
            self.conn.execute('UPDATE builds SET complete_at = ?, results = ?, state_string = ? WHERE id = ?',
                              (at, results, 'finished', buildid))

    def request_unclaimed(self, brid):
        """A RETRY build's request goes back to the queue: buildrequests.unclaimBuildRequests."""
        with self.transaction():
            self.conn.execute('DELETE FROM buildrequest_claims WHERE brid = ? AND masterid = ?', (brid, self.masterid))

    def request_completed(self, brid, results, at):
        """buildrequests.completeBuildRequests, then buildsets.completeBuildset."""
        with self.transaction():
            self.conn.execute('UPDATE buildrequests SET complete = 1, results = ?, complete_at = ? WHERE id = ?',
                              (results, at, brid))
            self.conn.execute('UPDATE buildsets SET complete = 1, results = ?, complete_at = ? '
                              'WHERE id = (SELECT buildsetid FROM buildrequests WHERE id = ?)', (results, at, brid))


def entry(seq, kind, attempt=None, runner=None, fence=None, received_ms=None, **more):
    """A ledger entry as the contract spells it (mono_ns and a submit's received_ms aside)."""
    found = {'seq': seq, 'kind': kind, 'project': JOB['project'], 'job': JOB['job']}
    if attempt is not None:
        found.update(attempt=attempt, runner=runner, fence=fence)
    found['deployment_key'] = JOB['deployment_key']
    found.update(more)
    if received_ms is not None:
        found['received_ms'] = received_ms
    return found


class RecorderTest(unittest.TestCase):
    """Each test writes one job's records into a copy of a fresh Buildbot database, polling the
    recorder after each thing Buildbot does, as its thread does every 100 ms."""

    @classmethod
    def setUpClass(cls):
        cls.template = tempfile.mkdtemp(prefix='fencelab-buildbot-schema-')
        basedir = os.path.join(cls.template, 'master')
        # Buildbot's own schema, as control_plane.py's Master.prepare makes it; no master runs.
        subprocess.run([BUILDBOT, 'create-master', '--quiet', '--db=sqlite:///state.sqlite', basedir],
                       check=True, stdout=subprocess.DEVNULL)
        cls.schema = os.path.join(basedir, 'state.sqlite')

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.template, ignore_errors=True)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix='fencelab-buildbot-recorder-')
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.db_path = os.path.join(self.dir, 'state.sqlite')
        shutil.copyfile(self.schema, self.db_path)
        self.ledger_path = os.path.join(self.dir, 'ledger.jsonl')
        self.ledger = self.recorder()
        # Buildbot's clock: the submission is now, as in a run (the submit's received_ms is the
        # recorder's own clock when it first sees the buildset).
        self.t0 = int(time.time())
        self.buildbot = Buildbot(self.db_path, self.t0)
        self.addCleanup(self.buildbot.close)

    def recorder(self):
        ledger = control_plane.Ledger(self.ledger_path, self.db_path)
        self.addCleanup(ledger.file.close)
        return ledger

    def step(self, *changes):
        """Buildbot does `changes`; then the recorder polls once; returns what it appended."""
        for change in changes:
            change()
        before = len(self.ledger.entries)
        self.ledger.poll()
        return self.ledger.entries[before:]

    def lost_worker(self):
        """(a) build 1 on r1 is lost with its worker (RETRY, the request back in the queue), and
        build 2 of the same request on r2 succeeds."""
        bb, t0 = self.buildbot, self.t0
        self.assertEqual(self.step(lambda: bb.worker_connected('r1'), lambda: bb.worker_connected('r2')), [])
        brid = bb.try_submitted(t0, JOB)
        self.assertEqual([e['kind'] for e in self.step()], ['submit'])
        first = None

        def start_first():
            nonlocal first
            first = bb.build_started(brid, 'r1', t0 + 1)

        self.assertEqual([e['kind'] for e in self.step(start_first)], ['claim'])
        self.assertEqual(first, 1)
        closed = self.step(lambda: bb.build_finished(first, RETRY, t0 + 4), lambda: bb.request_unclaimed(brid),
                           lambda: bb.worker_disconnected('r1'))
        self.assertEqual([e['kind'] for e in closed], ['expire'])
        second = None

        def start_second():
            nonlocal second
            second = bb.build_started(brid, 'r2', t0 + 5)

        self.assertEqual([e['kind'] for e in self.step(start_second)], ['claim'])
        self.assertEqual(second, 2)
        done = self.step(lambda: bb.build_finished(second, SUCCESS, t0 + 8),
                         lambda: bb.request_completed(brid, SUCCESS, t0 + 8))
        self.assertEqual([e['kind'] for e in done], ['result'])

    def no_loss(self):
        """(b) build 1 on r1 succeeds; there is no build 2."""
        bb, t0 = self.buildbot, self.t0
        self.step(lambda: bb.worker_connected('r1'), lambda: bb.worker_connected('r2'))
        brid = bb.try_submitted(t0, JOB)
        self.step()
        self.step(lambda: bb.build_started(brid, 'r1', t0 + 1))
        self.step(lambda: bb.build_finished(1, SUCCESS, t0 + 4), lambda: bb.request_completed(brid, SUCCESS, t0 + 4))

    def assert_ledger(self, expected):
        """The recorder's entries, in memory and in ledger.jsonl, are exactly `expected`, with a
        submit's received_ms the recorder's own clock and mono_ns never decreasing."""
        with open(self.ledger_path, encoding='utf-8') as f:
            written = [json.loads(line) for line in f]
        self.assertEqual(written, self.ledger.entries)
        found = []
        mono = 0
        for got in written:
            got = dict(got)
            self.assertGreaterEqual(got['mono_ns'], mono)
            mono = got.pop('mono_ns')
            if got['kind'] == 'submit':
                self.assertIsInstance(got.pop('received_ms'), int)
            found.append(got)
        self.assertEqual(found, expected)

    def test_a_worker_lost_mid_build_is_recorded_as_buildbot_requeued_it(self):
        self.lost_worker()
        ms = 1000 * self.t0
        self.assert_ledger([
            entry(1, 'submit'),
            entry(2, 'claim', 'j-b1', 'r1', 1, decision='accepted', received_ms=ms + 1000),
            entry(3, 'expire', 'j-b1', 'r1', 1, recorded_as='requeued', received_ms=ms + 4000),
            entry(4, 'claim', 'j-b2', 'r2', 2, decision='accepted', received_ms=ms + 5000),
            entry(5, 'result', 'j-b2', 'r2', 2, decision='accepted', outcome='succeeded', received_ms=ms + 8000),
        ])
        # A restarted recorder reads its file back and finds nothing new in the same records.
        again = self.recorder()
        again.poll()
        self.assertEqual(again.entries, self.ledger.entries)

    def test_a_build_that_ran_once_is_a_claim_and_its_result(self):
        self.no_loss()
        ms = 1000 * self.t0
        self.assert_ledger([
            entry(1, 'submit'),
            entry(2, 'claim', 'j-b1', 'r1', 1, decision='accepted', received_ms=ms + 1000),
            entry(3, 'result', 'j-b1', 'r1', 1, decision='accepted', outcome='succeeded', received_ms=ms + 4000),
        ])

    def test_the_same_records_read_at_once_give_the_same_facts(self):
        self.lost_worker()
        fresh = control_plane.Ledger(os.path.join(self.dir, 'at-once.jsonl'), self.db_path)
        self.addCleanup(fresh.file.close)
        fresh.poll()
        facts = lambda entries: [{k: v for k, v in e.items() if k != 'mono_ns' and not (e['kind'] == 'submit' and k == 'received_ms')} for e in entries]  # noqa: E731
        self.assertEqual(facts(fresh.entries), facts(self.ledger.entries))

    # ---------------------------------------------------------------- fencelab, from outside

    def judged(self):
        return judge.judged(self, self.ledger_path, os.path.join(self.dir, 'evidence'))

    def test_fencelab_finds_the_requeue_of_a_lost_worker(self):
        self.lost_worker()
        verdicts, text = self.judged()
        uncertainty = verdicts['explicit-uncertainty']
        self.assertEqual(uncertainty['verdict'], 'invalid', text)
        kinds = {(a['kind'], tuple(a['attempts'])) for a in uncertainty['anomalies']}
        self.assertIn(('expiry-not-uncertain', ('j-b1',)), kinds, text)
        self.assertEqual(verdicts['rules-model']['verdict'], 'invalid', text)
        self.assertEqual(verdicts['fence-order']['verdict'], 'valid', text)

    def test_fencelab_finds_nothing_wrong_with_a_build_that_ran_once(self):
        self.no_loss()
        verdicts, text = self.judged()
        self.assertEqual(verdicts['explicit-uncertainty']['verdict'], 'valid', text)
        self.assertEqual(verdicts['fence-order']['verdict'], 'valid', text)
        # The rules model re-decides every entry it can; the ones that need what a ledger alone
        # lacks (leases, finals, the operator) are named, and the rest found nothing.
        model = verdicts['rules-model']
        self.assertEqual(model['verdict'], 'unknown', text)
        self.assertIn('the rest found nothing', model['reason'], text)


if __name__ == '__main__':
    unittest.main()
