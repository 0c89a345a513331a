#!/usr/bin/env bash
# The main job on the built-in local lab: lab up → deploy (source, build, RPC services, tunnels,
# llama-server with the draft on the remote RPC device) → one completion printed with its draft
# statistics → the one-screen status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ts=.venv/bin/tunnelspec
$ts lab up
$ts deploy lab/inventory.ini
$ts tunnel status lab/inventory.ini
# Read-only proof: /health, a completion (printed with draft_n / draft_n_accepted), and the
# llama-server log line placing the draft's weights on RPC0 (the rpc-a node, through its tunnel).
$ts verify lab/inventory.ini
$ts status lab/inventory.ini
