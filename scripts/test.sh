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
# The unit tier first, in pytest-xdist workers (nothing in it shares a resource: docs/ci.md, "Test
# tiers"); then the sshd, build and lab tiers in one process, in order (one lab, one build at a time).
# Every test runs; the exit status is the first failing part's (5, "no test selected", counts as none
# failed: arguments such as -k may leave one part empty).
rc=0
.venv/bin/python -m pytest -q -rs -m unit -p no:cacheprovider -n 2 --dist worksteal "$@" tests || rc=$?
[ "$rc" = 5 ] && rc=0
rest=0
.venv/bin/python -m pytest -q -rs --durations=15 -m "not unit" "$@" tests || rest=$?
[ "$rest" = 5 ] && rest=0
if [ "$rc" = 0 ]; then rc=$rest; fi
exit "$rc"
