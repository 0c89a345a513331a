#!/usr/bin/env bash
# The whole test suite: unit tests, real sshd tests, llama.cpp build tests and the lab (systemd-nspawn)
# tests. `--fast`: the unit tier alone (pure tests, no set-up beyond the virtualenv), in 4 pytest-xdist
# workers (docs/ci.md, "Test tiers").
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_COLOR=1
if [ "${1:-}" = "--fast" ]; then
  shift
  if [ ! -x .venv/bin/python ]; then bash scripts/setup.sh; fi
  exec .venv/bin/python -m pytest -q -m unit -p no:cacheprovider -n 4 --dist worksteal "$@" tests
fi
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -rs --durations=15 "$@" tests
