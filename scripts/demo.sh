#!/usr/bin/env bash
# The main job on the built-in local lab: lab up → deploy → tunnel → a completion using the remote draft.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ts=.venv/bin/tunnelspec
$ts lab up
$ts deploy lab/inventory.ini
$ts tunnel status lab/inventory.ini
$ts verify lab/inventory.ini
