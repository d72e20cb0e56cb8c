#!/usr/bin/env python3
"""fencelab's runner role for the observed Airflow system: one unmodified Airflow edge worker.

An edge worker (apache-airflow-providers-edge3) is Airflow's own remote worker: it pulls the
tries queued for it from the API server over HTTP (the edge API), runs each under Airflow's
task supervisor, whose heartbeats and state changes go to the API server's Execution API. Both
URLs are this worker's own fault proxy (`{control_host}:{control_port}`), so every fault on
the runner's link hits exactly this worker and the tries it runs. The worker runs one try at
a time (`--concurrency 1`), as a runner of the contract runs one deployment at a time, under
the hostname `rK` (the task instance's `hostname`, which the recorder reads as the runner).

The worker runs in a PID namespace of its own (`unshare --pid --fork --kill-child
--mount-proc`), a machine of its own: an edge worker starts each try's supervisor in a new
process group, out of reach of a signal to the worker's group, so that without the namespace
a killed worker would leave its tries running with nobody to stop them, unlike a lost
machine. Killing the namespace's first process kills everything in it, as a machine's loss
does; pausing the worker's group pauses the worker but not its tries' supervisors (a paused
process, not a paused machine).

This program stays as the worker's service manager: when the worker exits with an error (the
API server refuses a worker whose name is still active, for up to 5 missed edge heartbeats
after a kill) it is started again 4 s later, as a service manager's restart-on-failure would.
Its working directory is the runner's folder, so every process of it names the run there.
"""

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import airflow_env  # noqa: E402

BIN = os.path.dirname(os.path.abspath(sys.executable))
RESTART_S = 4.0


def die_with_parent():
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--id', required=True)
    parser.add_argument('--token', required=True, help="the deployment's JWT secret, as the recorder's registration gave it")
    parser.add_argument('--control-host', required=True)
    parser.add_argument('--control-port', required=True, type=int)
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--target-url', required=True)
    parser.add_argument('--fencelab', required=True)
    parser.add_argument('--secret', required=True)
    parser.add_argument('--lease-ms', required=True, type=int)
    options = parser.parse_args()

    # Every runner is given the same folder: each worker keeps its own Airflow home in it.
    data_dir = os.path.join(os.path.abspath(options.data_dir), options.id)
    home = os.path.join(data_dir, 'airflow')
    os.makedirs(home, exist_ok=True)
    os.chdir(data_dir)
    env = dict(os.environ)
    env.update(airflow_env.runner(options.secret, options.lease_ms, home, options.control_host, options.control_port))
    if env['AIRFLOW__API_AUTH__JWT_SECRET'] != options.token:
        parser.error('--token is not the JWT secret this deployment derives from --secret')
    env.update({
        'FENCELAB_BIN': options.fencelab,
        'FENCELAB_SECRET': options.secret,
        'FENCELAB_TARGET_URL': options.target_url,
        'HOSTNAME': options.id,
    })
    pid_file = os.path.join(home, 'edge-worker.pid')
    command = [
        'unshare', '--pid', '--fork', '--kill-child', '--mount-proc',
        os.path.join(BIN, 'airflow'), 'edge', 'worker', '--edge-hostname', options.id, '--concurrency', '1',
        '--pid', pid_file,
    ]
    while True:
        if os.path.exists(pid_file):  # a killed worker's: the worker refuses to start over it
            os.unlink(pid_file)
        worker = subprocess.Popen(command, env=env, stdout=sys.stderr, preexec_fn=die_with_parent)
        code = worker.wait()
        if code == 0:
            return 0
        sys.stderr.write(f'runner {options.id}: the edge worker exited ({code}); starting it again in {RESTART_S} s\n')
        sys.stderr.flush()
        time.sleep(RESTART_S)


if __name__ == '__main__':
    sys.exit(main())
