#!/usr/bin/env python3
"""fencelab's runner role for the observed Buildbot 4.3.0 system: one unmodified Buildbot worker.

Makes the worker's basedir (DIR/worker-rK, with Buildbot's own `buildbot-worker create-worker`)
when it is absent, puts the deployment target's URL in the environment its commands inherit
(FENCELAB_TARGET_URL, read by `fencelab step`), and then replaces itself with the worker
(`buildbot-worker start --nodaemon`, which runs twistd in this very process), so that the
process the harness started, pauses, kills and starts again is the worker itself.

The worker's keepalive is Buildbot's default (600 s): it only sends traffic, it has no timeout
of its own, so a shorter one would not make either side notice a silent link sooner. A worker
notices a lost master only when its connection closes, and reconnects with Twisted's backoff
(1 s, growing 1.5 times, at most 60 s).
"""

import argparse
import os
import subprocess
import sys

BIN = os.path.dirname(os.path.abspath(sys.executable))
KEEPALIVE_S = 600  # buildbot-worker's default


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--id', required=True)
    parser.add_argument('--password', required=True)
    parser.add_argument('--master', required=True, help='HOST:PORT of the master PB port (through its proxy)')
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--target-url', required=True)
    options = parser.parse_args()

    basedir = os.path.join(os.path.abspath(options.data_dir), f'worker-{options.id}')
    identity = f'{options.master} {options.id} {options.password}\n'
    marker = os.path.join(basedir, '.fencelab-created')
    made = None
    if os.path.exists(marker):
        with open(marker, encoding='utf-8') as f:
            made = f.read()
    if made != identity:  # absent, cut short, or for another master or password
        os.makedirs(options.data_dir, exist_ok=True)
        subprocess.run(
            [os.path.join(BIN, 'buildbot-worker'), 'create-worker', '--force', '--quiet',
             f'--keepalive={KEEPALIVE_S}', basedir, options.master, options.id, options.password],
            check=True, stdout=sys.stderr,
        )
        with open(marker, 'w', encoding='utf-8') as f:
            f.write(identity)

    os.environ['FENCELAB_TARGET_URL'] = options.target_url
    program = os.path.join(BIN, 'buildbot-worker')
    os.execv(program, [program, 'start', '--nodaemon', basedir])


if __name__ == '__main__':
    main()
