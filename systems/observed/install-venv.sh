#!/usr/bin/env bash
# Installs an observed system's pinned requirements into its virtualenv: `install-venv.sh DIR
# NAME` makes DIR/.venv from DIR/requirements.txt (PyPI, every package pinned). Idempotent: a
# stamp holding the requirements' hash skips a second install, and a changed requirements.txt
# makes a fresh venv. Nothing else is downloaded.
set -euo pipefail
here="$(cd "$1" && pwd)"
name="$2"
venv="$here/.venv"
stamp="$venv/.fencelab-requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-input -r "$here/requirements.txt"
echo "$want" > "$stamp"
echo "$name installed in $venv" >&2
