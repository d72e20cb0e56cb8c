#!/usr/bin/env bash
# Installs the observed Airflow (core, the edge executor, requirements.txt) into systems/airflow/.venv
# from PyPI, pinned. Idempotent: a stamp holding the requirements' hash skips a second install,
# and a changed requirements.txt makes a fresh venv. Nothing else is downloaded
# (systems/observed/install-venv.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../observed/install-venv.sh" "$here" airflow
