"""The derivation of an observed system's secrets from the run's: on its own, light to import,
for the processes that need a secret and none of the recorder (systems/airflow/runner.py
through airflow_env.py)."""

import hashlib
import hmac


def derive(secret, purpose):
    """A deterministic password, token or secret for `purpose`, from the run's secret."""
    return hmac.new(secret.encode(), purpose.encode(), hashlib.sha256).hexdigest()[:48]
