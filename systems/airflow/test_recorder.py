#!/usr/bin/env python3
# The recorder decides nothing: given what Airflow recorded about one job — its DAG run, the
# task instance's tries (the live row and task_instance_history), the event log's rows and the
# API server's access-log lines — the recorder's own code (Ledger.poll, ReportLog, job_view)
# gives exact ledger entries and job views, and fencelab's checkers judge that ledger from
# outside (`fencelab evidence --lacks lease`, `fencelab check`). The records are the shapes the
# runs in docs/analyses/airflow.md read from Airflow 3.3.2 (a try failed by the scheduler's
# heartbeat timeout and retried; a try that reported its own end), given to the recorder as a
# snapshot; reading them out of PostgreSQL is held by the runs.
#
#   .venv/bin/python -m unittest -v test_recorder.py
#
# FENCELAB_BIN names the fencelab binary (default: target/debug/fencelab of this repository).

import datetime
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'observed'))
import control_plane  # noqa: E402
import judge  # noqa: E402 (systems/observed/judge.py: fencelab's checkers on the ledger)

T0 = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.timezone.utc)
# Two UUIDv7 try ids, the second made 5 s after the first (its generation is higher).
TRY1 = '01a24c9e-d723-758a-aae8-bbc883ab8c80'
TRY2 = '01a24c9e-fb76-7684-b9c4-89b119eef54e'


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def ms(seconds):
    return int(at(seconds).timestamp() * 1000)


def access_line(seconds, ti_id, status):
    """The API server's access-log line for a try's own end report, as Airflow 3.3.2 writes it."""
    stamp = at(seconds).strftime('%Y-%m-%dT%H:%M:%S.%fZ')
    return (f'{stamp} [info     ] request finished               [http.access] client_addr=127.0.0.1:40000 '
            f'duration_us=20000 loc=http_access_log.py:130 method=PATCH path=/execution/task-instances/{ti_id}/state '
            f'query= status_code={status}\n')


class Records:
    """What Airflow recorded about one job, as the recorder's Snapshot holds it."""

    def __init__(self):
        self.job = {'job': 'j1', 'project': 'p', 'deployment_key': 'k', 'steps': 3, 'step_ms': 100,
                    'submitted_at': at(0), 'state': 'queued', 'tries': {}, 'current': None}
        self.jobs = [self.job]
        self.by_job = {'j1': self.job}

    def add_try(self, ti_id, number, state, runner, start, end, past, events):
        tried = control_plane.try_of(ti_id, number, state, runner, at(start), None if end is None else at(end), past)
        tried['events'] = {name: at(when) for name, when in events.items()}
        self.job['tries'][number] = tried


class RecorderTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix='airflow-recorder-')
        self.ledger_path = os.path.join(self.dir, 'ledger.jsonl')
        self.access_log = os.path.join(self.dir, 'api-server.log')
        open(self.access_log, 'w').close()
        self.records = Records()
        self.now_s = 100.0
        original = control_plane.Snapshot
        control_plane.Snapshot = lambda dsn: self.records
        self.addCleanup(setattr, control_plane, 'Snapshot', original)
        original_time = control_plane.time.time
        control_plane.time.time = lambda: T0.timestamp() + self.now_s
        self.addCleanup(setattr, control_plane.time, 'time', original_time)
        self.ledger = control_plane.Ledger(self.ledger_path, 'unused', control_plane.ReportLog(self.access_log))
        self.addCleanup(self.ledger.file.close)

    def log(self, line):
        with open(self.access_log, 'a', encoding='utf-8') as f:
            f.write(line)

    def facts(self):
        return [{k: v for k, v in entry.items() if k not in ('mono_ns', 'project', 'deployment_key')} for entry in self.ledger.entries]

    # ---------------------------------------------------------------- the two shapes

    def heartbeat_timeout_then_retry(self):
        """Try 1 on r1 ran from 2 s; the scheduler logged its heartbeat timeout at 8 s and the
        DAG processor failed it at 9 s (up_for_retry, a new id for try 2); try 2 ran on r2 from
        12 s and reported its own success at 15 s."""
        self.records.add_try(TRY1, 1, 'failed', 'r1', 1.5, 9, past=True, events={'running': 2, 'heartbeat timeout': 8})
        self.records.add_try(TRY2, 2, 'success', 'r2', 11.5, 14.9, past=False, events={'running': 12, 'success': 15})
        self.records.job['current'] = {'id': TRY2, 'try_number': 2, 'state': 'success'}
        self.records.job['state'] = 'success'
        self.log(access_line(15, TRY2, 204))
        # Try 1's own end report, sent after it was given up: refused, as its id is history.
        self.log(access_line(16, TRY1, 404))

    def ran_once(self, outcome):
        state = 'success' if outcome == 'succeeded' else 'failed'
        self.records.add_try(TRY1, 1, state, 'r1', 1.5, 4.9, past=False, events={'running': 2, state: 5})
        self.records.job['current'] = {'id': TRY1, 'try_number': 1, 'state': state}
        self.records.job['state'] = state
        self.log(access_line(5, TRY1, 204))

    # ---------------------------------------------------------------- the recorder's entries

    def test_a_try_failed_by_the_heartbeat_timeout_and_retried_is_an_expire_requeued(self):
        self.heartbeat_timeout_then_retry()
        self.ledger.poll()
        claim1 = {'job': 'j1', 'attempt': 'j1-t1', 'runner': 'r1', 'fence': control_plane.generation(TRY1)}
        claim2 = {'job': 'j1', 'attempt': 'j1-t2', 'runner': 'r2', 'fence': control_plane.generation(TRY2)}
        self.assertEqual(self.facts(), [
            {'seq': 1, 'kind': 'submit', 'job': 'j1', 'received_ms': ms(0)},
            {'seq': 2, 'kind': 'claim', **claim1, 'decision': 'accepted', 'received_ms': ms(2)},
            {'seq': 3, 'kind': 'expire', **claim1, 'recorded_as': 'requeued', 'received_ms': ms(9)},
            {'seq': 4, 'kind': 'claim', **claim2, 'decision': 'accepted', 'received_ms': ms(12)},
            {'seq': 5, 'kind': 'result', **claim2, 'decision': 'accepted', 'outcome': 'succeeded', 'received_ms': ms(15)},
        ])
        self.assertEqual(self.ledger.reports.refused, {TRY1: [404]})
        view = control_plane.job_view(self.records.job, True, self.ledger)
        self.assertEqual(view['state'], 'succeeded')
        self.assertEqual([(a['id'], a['closed_by'], a['current']) for a in view['attempts']],
                         [('j1-t1', 'expired-requeued', False), ('j1-t2', 'result', True)])
        self.assertNotIn('lease_expires_ms', json.dumps(view))

    def test_a_try_that_reported_its_own_failure_is_a_result(self):
        self.ran_once('failed')
        self.ledger.poll()
        self.assertEqual([(e['kind'], e.get('outcome'), e['received_ms']) for e in self.ledger.entries],
                         [('submit', None, ms(0)), ('claim', None, ms(2)), ('result', 'failed', ms(5))])
        self.assertEqual(control_plane.job_view(self.records.job, False, self.ledger)['state'], 'failed')

    def test_a_failed_try_without_its_own_report_waits_then_is_airflows_decision(self):
        self.records.add_try(TRY1, 1, 'failed', 'r1', 1.5, 9, past=False, events={'running': 2})
        self.records.job['current'] = {'id': TRY1, 'try_number': 1, 'state': 'failed'}
        self.records.job['state'] = 'failed'
        self.now_s = 9.5  # the access log may not show the try's own report yet
        self.ledger.poll()
        self.assertEqual([e['kind'] for e in self.ledger.entries], ['submit', 'claim'])
        self.assertEqual(control_plane.job_view(self.records.job, False, self.ledger)['state'], 'running')
        self.now_s = 10.5
        self.ledger.poll()
        self.assertEqual([(e['kind'], e.get('recorded_as')) for e in self.ledger.entries][-1], ('expire', 'failed'))
        self.assertEqual(control_plane.job_view(self.records.job, False, self.ledger)['state'], 'failed')

    def test_a_ledger_read_again_after_a_restart_gives_the_same_facts(self):
        self.heartbeat_timeout_then_retry()
        self.ledger.poll()
        again = control_plane.Ledger(self.ledger_path, 'unused', control_plane.ReportLog(self.access_log))
        self.addCleanup(again.file.close)
        again.poll()
        self.assertEqual(again.entries, self.ledger.entries)

    # ---------------------------------------------------------------- fencelab, from outside

    def judged(self):
        return judge.judged(self, self.ledger_path, os.path.join(self.dir, 'evidence'))

    def test_fencelab_finds_the_retry_of_a_try_airflow_gave_up(self):
        self.heartbeat_timeout_then_retry()
        self.ledger.poll()
        verdicts, text = self.judged()
        uncertainty = verdicts['explicit-uncertainty']
        self.assertEqual(uncertainty['verdict'], 'invalid', text)
        kinds = {(a['kind'], tuple(a['attempts'])) for a in uncertainty['anomalies']}
        self.assertIn(('expiry-not-uncertain', ('j1-t1',)), kinds, text)
        self.assertEqual(verdicts['fence-order']['verdict'], 'valid', text)

    def test_fencelab_finds_nothing_wrong_with_a_try_that_ran_once(self):
        self.ran_once('succeeded')
        self.ledger.poll()
        verdicts, text = self.judged()
        self.assertEqual(verdicts['explicit-uncertainty']['verdict'], 'valid', text)
        self.assertEqual(verdicts['fence-order']['verdict'], 'valid', text)


if __name__ == '__main__':
    unittest.main()
