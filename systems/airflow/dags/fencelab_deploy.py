"""The DAG of fencelab's observed Airflow system: one DAG run per job, one task that deploys.

What an Airflow user deploying with Airflow would write: a manually triggered DAG whose run
configuration names the deployment (job, key, steps, step length), and one task, `deploy`,
that runs fencelab's step client against the deployment target. A try that Airflow itself
gives up (its heartbeats stopped, its worker lost) is retried, up to 3 times, 1 s apart; a
try whose deployment the target refused, or whose step got no answer, fails the job
(`AirflowFailException`: a refused or half-known deployment is not deployed again blindly).
The task carries its try's identity to the target:

- attempt `<run id>-t<try number>`, runner = the edge worker's hostname (r1 .. rN);
- fence = the try's generation: the first 64 bits of the try's id. Airflow 3 gives every try
  an id of its own, a UUID version 7 made when the try is set up (its first 48 bits are the
  milliseconds since the epoch on the host clock of the Airflow process that made it, the
  next 16 its version and random bits), so a later try of any task has a larger
  generation. The try number alone is no fence for a target: it counts per task instance, and
  two jobs on one deployment key both have a try 1.

The step client's path and the secret it signs with come from the edge worker's environment
(runner.py sets FENCELAB_BIN, FENCELAB_SECRET and FENCELAB_TARGET_URL, the target through the
worker's own proxy).
"""

import datetime
import os
import subprocess

from airflow.sdk import dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

RETRIES = 3


@dag(
    dag_id='fencelab_deploy',
    schedule=None,
    catchup=False,
    is_paused_upon_creation=False,
    max_active_runs=1000,
    tags=['fencelab'],
)
def fencelab_deploy():
    @task(task_id='deploy', retries=RETRIES, retry_delay=datetime.timedelta(seconds=1))
    def deploy():
        context = get_current_context()
        ti = context['ti']
        conf = context['dag_run'].conf
        generation = ti.id.int >> 64
        runner = os.environ.get('HOSTNAME') or ti.hostname
        command = [
            os.environ['FENCELAB_BIN'], 'step',
            '--secret', os.environ['FENCELAB_SECRET'],
            '--deployment-key', conf['deployment_key'],
            '--job', conf['job'],
            '--attempt', f"{conf['job']}-t{ti.try_number}",
            '--runner', runner,
            '--fence', str(generation),
            '--steps', str(conf['steps']),
            '--step-ms', str(conf['step_ms']),
        ]
        code = subprocess.run(command, check=False).returncode
        if code != 0:
            # 1: the target refused a step; 2: a step got no answer (it may have been applied).
            # Either way the deployment failed and is not deployed again blindly: the job fails
            # with this try (AirflowFailException skips the retries).
            raise AirflowFailException(f'fencelab step exited {code}')

    deploy()


fencelab_deploy()
