#!/usr/bin/env bash
# The whole test suite: unit tests, real sshd tests, and the lab (systemd-nspawn) tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export NO_COLOR=1
exec .venv/bin/python -m pytest -q -rs --durations=15 "$@" tests
