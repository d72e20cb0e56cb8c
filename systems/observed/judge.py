"""fencelab's checkers on a recorder's ledger, from outside: what each observed system's
test_recorder.py asks of the ledger its recorder wrote.

FENCELAB_BIN names the fencelab binary (default: target/debug/fencelab of this repository).
"""

import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FENCELAB = os.environ.get('FENCELAB_BIN') or os.path.join(REPO, 'target', 'debug', 'fencelab')


def judged(test, ledger_path, out):
    """fencelab's checkers on the ledger.jsonl at `ledger_path`, said to be of a system that
    grants no lease (`evidence --lacks lease --out OUT`, then `check OUT`), each step asserted
    on `test` (a unittest.TestCase): results.json's verdicts by checker, and what `check`
    printed."""
    test.assertTrue(os.access(FENCELAB, os.X_OK), f'no fencelab binary at {FENCELAB} (cargo build -p harness, or set FENCELAB_BIN)')
    made = subprocess.run([FENCELAB, 'evidence', '--ledger', ledger_path, '--lacks', 'lease', '--out', out],
                          capture_output=True, text=True, timeout=120)
    test.assertEqual(made.returncode, 0, made.stdout + made.stderr)
    checked = subprocess.run([FENCELAB, 'check', out], capture_output=True, text=True, timeout=120)
    text = checked.stdout + checked.stderr
    # 1 invalid, 2 unknown (a ledger alone leaves most rules unjudged); never an error.
    test.assertIn(checked.returncode, (0, 1, 2), text)
    with open(os.path.join(out, 'results.json'), encoding='utf-8') as f:
        results = json.load(f)
    verdicts = {checker['checker']: checker for checker in results['checkers']}
    for name, checker in verdicts.items():
        test.assertNotIn('malformed', json.dumps(checker), f'{name} found the ledger malformed:\n{text}')
    test.assertEqual(verdicts['single-owner']['verdict'], 'unknown', text)  # no lease to judge owners by
    return verdicts, text
