#!/usr/bin/env bash
# The whole suite plus the `extended` lab modules (the upstream-builds matrix b9093/b11434 and the
# mixed-release lab): what to run before resolving an issue that touches builds, releases or hosts.
# Cold (no lab images, no ccache) this takes about 80 minutes on 2 cores; warm about 35.
set -euo pipefail
cd "$(dirname "$0")/.."
TUNNELSPEC_EXTENDED=1 exec bash scripts/test.sh "$@"
