"""The Airflow configuration of fencelab's observed Airflow system, as environment variables.

Airflow runs unmodified; this is what an Airflow user deploying with it would configure, and
nothing more: the EdgeExecutor (each runner is an edge worker that pulls its tries over HTTP,
with an Execution API URL of its own), a PostgreSQL metadata database, the DAG folder next to
this file, every address on 127.0.0.1, and timings scaled down so that a run of a minute sees
heartbeat timeouts. control_plane.py (scheduler, API server, DAG processor) and runner.py (an
edge worker) both take their settings from here, so that the two sides agree on the secrets
they share.

Timings (whole seconds: Airflow's settings are integers), from the run's `{lease_ms}`:
- `[scheduler] task_instance_heartbeat_timeout` = the lease, rounded up to whole seconds and
  at least 3: a running try whose supervisor has not heartbeaten for that long is failed by
  the scheduler (then retried: up_for_retry). Default 300.
- `[scheduler] task_instance_heartbeat_timeout_detection_interval` = 1 s: how often the
  scheduler looks for such tries. Default 10.
- `[workers] min_heartbeat_interval` = 1 s: how often a try's supervisor heartbeats. Default 5.
  `[workers] max_failed_heartbeats` keeps its default, 3: a supervisor whose heartbeats fail
  that many times in a row kills its task.
- `[edge] heartbeat_interval` = 2 s (a worker silent for 5 of them is marked unknown) and
  `[edge] job_poll_interval` = 1 s: how often an idle edge worker asks for a try. Defaults 30, 5.
- `[scheduler] orphaned_tasks_check_interval` = 5 s: how often the scheduler adopts or resets
  tries queued by a scheduler that is gone (after a restart of the control plane). Default 300.
"""

import base64
import hashlib
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'observed'))
from keys import derive  # noqa: E402 (systems/observed/keys.py: a secret for a purpose, from the run's)

DAGS = os.path.join(HERE, 'dags')
DAG_ID = 'fencelab_deploy'
TASK_ID = 'deploy'
EXECUTOR = 'airflow.providers.edge3.executors.EdgeExecutor'


def jwt_secret(secret):
    """`[api_auth] jwt_secret`: the API server signs the Execution API's task tokens with it,
    and an edge worker signs its own requests to the edge API with it."""
    return derive(secret, 'airflow-jwt')


def heartbeat_timeout_s(lease_ms):
    return max(3, math.ceil(lease_ms / 1000))


def common(secret, lease_ms, home):
    """What every Airflow process of the deployment is configured with."""
    fernet = base64.urlsafe_b64encode(hashlib.sha256(f'{secret}:fernet'.encode()).digest()).decode()
    return {
        'AIRFLOW_HOME': home,
        'AIRFLOW__CORE__DAGS_FOLDER': DAGS,
        'AIRFLOW__CORE__EXECUTOR': EXECUTOR,
        'AIRFLOW__CORE__LOAD_EXAMPLES': 'False',
        'AIRFLOW__CORE__FERNET_KEY': fernet,
        'AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION': 'False',
        'AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS': 'True',
        'AIRFLOW__API_AUTH__JWT_SECRET': jwt_secret(secret),
        'AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL': '1',
        'AIRFLOW__EDGE__HEARTBEAT_INTERVAL': '2',
        'AIRFLOW__EDGE__JOB_POLL_INTERVAL': '1',
        'AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT': str(heartbeat_timeout_s(lease_ms)),
        'AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL': '1',
        'AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL': '5',
        'AIRFLOW__LOGGING__COLORED_CONSOLE_LOG': 'False',
        'AIRFLOW__CORE__UNIT_TEST_MODE': 'False',
    }


def control_plane(secret, lease_ms, home, database_url, api_port):
    """The scheduler's, the API server's and the DAG processor's environment."""
    env = common(secret, lease_ms, home)
    api = f'http://127.0.0.1:{api_port}'
    env.update({
        'AIRFLOW__DATABASE__SQL_ALCHEMY_CONN': database_url,
        'AIRFLOW__API__HOST': '127.0.0.1',
        'AIRFLOW__API__PORT': str(api_port),
        'AIRFLOW__API__WORKERS': '1',
        'AIRFLOW__API__BASE_URL': api,
        'AIRFLOW__CORE__EXECUTION_API_SERVER_URL': f'{api}/execution/',
        'AIRFLOW__EDGE__API_ENABLED': 'True',
        'AIRFLOW__EDGE__API_URL': f'{api}/edge_worker/v1/rpcapi',
        # Enough slots that the scheduler queues every ready try: the edge workers' own
        # concurrency (one try each) is what bounds how many run.
        'AIRFLOW__CORE__PARALLELISM': '64',
        'AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG': '1000',
        'AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG': '64',
        'AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL': '5',
        'AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL': '60',
        'AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK': 'False',
    })
    return env


def runner(secret, lease_ms, home, control_host, control_port):
    """An edge worker's environment: both of its links to the API server (the edge API it pulls
    tries from and the Execution API its tries' supervisors report to) go to its own proxy."""
    env = common(secret, lease_ms, home)
    api = f'http://{control_host}:{control_port}'
    env.update({
        'AIRFLOW__EDGE__API_URL': f'{api}/edge_worker/v1/rpcapi',
        'AIRFLOW__CORE__EXECUTION_API_SERVER_URL': f'{api}/execution/',
        # Nothing on the worker's side reaches the metadata database; a local file stands in
        # for the setting Airflow's configuration insists on.
        'AIRFLOW__DATABASE__SQL_ALCHEMY_CONN': f"sqlite:///{os.path.join(home, 'unused.db')}",
    })
    return env
