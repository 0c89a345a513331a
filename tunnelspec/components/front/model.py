"""The front of llama-server and the draft's absence, as data (docs/degraded.md).

- **The front**: HAProxy (`tunnelspec-front.service`, its own user) listens where users talk to the
  API (`llama_server_host:llama_server_port`); llama-server listens on `127.0.0.1:<internal port>`,
  closed by the loopback isolation to everyone but the front's user. The front holds requests
  while llama-server is down or loading, with stock HAProxy: a health check on `/health` (200 only
  once the model is loaded), `retries` with `option redispatch` and a `backup` server named `hold`
  on a privileged loopback port where nothing listens. While llama-server is not UP, requests go
  to `hold`, whose connection fails at once; HAProxy waits its turn-around (timeout connect, 250 ms)
  and redispatches: the request waits up to `hold_timeout` seconds and goes to llama-server
  as soon as its health check passes. A request that got no response at all (llama-server aborted
  under it) is retried the same way (`retry-on empty-response`); one cut mid-response cannot be.
- **Modes**: the launcher (`tunnelspec-draftwatch launch`, llama-server's ExecStart) starts
  llama-server with the draft ("speculative") when the draft node answers the RPC HELLO through its
  tunnel, else with the target alone ("degraded"); the watcher (`tunnelspec-draftwatch.service`)
  restarts llama-server when the draft is lost, and again once the node answered steadily for
  `rejoin_after` seconds and the front shows no request in flight. Nodes with target layers are
  waited for ("waiting"); a cluster without a draft runs one command line ("plain").
"""

from __future__ import annotations

import json

from tunnelspec.core.constants import ETC_DIR, LOOPBACK
from tunnelspec.components.generation.record import STATUS as GENERATION_STATUS
from tunnelspec.components.server.args import tunnel_unit

FRONT_UNIT = "tunnelspec-front.service"
FRONT_CONFIG = f"{ETC_DIR}/front.cfg"
FRONT_RUN_DIR = "/run/tunnelspec-front"
FRONT_STATS = f"{FRONT_RUN_DIR}/stats.sock"
FRONT_BACKEND = "llama"
# The `hold` backup server: a privileged port (only root could listen there) on loopback, where
# nothing listens. Deploy refuses a host where something does (components/front/checks.py).
HOLD_PORT = 1
# The front's attempts per second while it holds a request (its turn-around = timeout connect, 250 ms).
HOLD_TRIES_PER_S = 4
HAPROXY = "/usr/sbin/haproxy"

# metrics=true (docs/metrics.md): the exporter next to the draft watch, its configuration, and the
# front's own exporter on a unix socket in the front's runtime directory.
METRICS_UNIT = "tunnelspec-metrics.service"
METRICS_CONFIG = f"{ETC_DIR}/metrics.json"
METRICS_SOCKET = f"{FRONT_RUN_DIR}/metrics.sock"
WATCH_HELLO = "/run/tunnelspec-draftwatch/hello.json"  # the watcher's last HELLO of the draft node

WATCH_UNIT = "tunnelspec-draftwatch.service"
HELPER_DIR = "/usr/local/lib/tunnelspec"
DRAFTWATCH = f"{HELPER_DIR}/tunnelspec-draftwatch"
RPC_WAIT = f"{HELPER_DIR}/tunnelspec-rpc-wait"
METRICS_EXPORTER = f"{HELPER_DIR}/tunnelspec-metrics"
MODES_PATH = f"{ETC_DIR}/llama-server.json"
STATE_DIR_NAME = "tunnelspec-llama"  # llama-server's RuntimeDirectory (kept across its restarts)
STATE_PATH = f"/run/{STATE_DIR_NAME}/mode.json"
WATCH_DIR_NAME = "tunnelspec-draftwatch"  # the watcher's RuntimeDirectory
REJOIN_FLAG = f"/run/{WATCH_DIR_NAME}/rejoin"  # the time the watcher asked for the draft back

SPECULATIVE, DEGRADED, WAITING, PLAIN = "speculative", "degraded", "waiting", "plain"
# Seconds the launcher gives a draft tunnel at a fresh start (boot, deploy) before serving degraded.
START_GRACE = 10


def front_vars(main) -> dict:
    """The front's template variables (templates/tunnelspec-front.cfg.j2)."""
    f = main.front
    return {"bind_host": main.server_host, "bind_port": main.server_port, "internal_port": f.internal_port,
            "loopback": LOOPBACK, "hold_port": HOLD_PORT, "hold_retries": f.hold_timeout * HOLD_TRIES_PER_S,
            "hold_seconds": f.hold_timeout,
            "stats_socket": FRONT_STATS, "backend": FRONT_BACKEND, "front_user": f.user,
            "public_bind": main.public_bind, "tls_pem": main.tls.cert_path if main.tls is not None else "",
            "run_dir": FRONT_RUN_DIR, "config": FRONT_CONFIG, "haproxy": HAPROXY,
            "metrics": f.metrics is not None, "metrics_socket": METRICS_SOCKET,
            "metrics_port": f.metrics.port if f.metrics else 0,
            "metrics_token_file": (f.metrics.token_file or "") if f.metrics else ""}


def metrics_document(cluster) -> dict:
    """What the exporter reads (/etc/tunnelspec/metrics.json): where each figure is. No secret: the API
    key reaches the exporter through systemd (LoadCredential=), never through this file."""
    main = cluster.main
    return {
        "schema": 1,
        "listen": [LOOPBACK, main.front.metrics.port],
        "state": STATE_PATH,
        "watch_state": WATCH_HELLO,
        "generation": GENERATION_STATUS,
        "llama_unit": "tunnelspec-llama-server.service",
        "tunnels": {n.name: f"tunnelspec-tunnel-{n.name}.service" for n in cluster.rpc},
        "nodes": [n.name for n in cluster.rpc],
        "certificate": main.tls.cert_path if main.tls is not None else None,
        "llama_server": {"address": f"{LOOPBACK}:{main.front.internal_port}", "api_key": bool(main.api_key_file)},
        "front": {"socket": METRICS_SOCKET},
    }


def metrics_fact(cluster) -> dict | None:
    """The `llama_server.metrics` fact: None with metrics off; else the exporter's configuration and
    its unit's variables."""
    main = cluster.main
    if main.front.metrics is None:
        return None
    return {"config_json": json.dumps(metrics_document(cluster), indent=1, sort_keys=True) + "\n",
            "unit": {"front_user": main.front.user, "loopback": LOOPBACK, "state_path": STATE_PATH, "exporter": METRICS_EXPORTER, "config": METRICS_CONFIG,
                     "api_key_file": main.api_key_file or "", "port": main.front.metrics.port,
                     "front_unit": FRONT_UNIT, "llama_unit": "tunnelspec-llama-server.service"},
            "token_file": main.front.metrics.token_file or "", "api_key_file": main.api_key_file or ""}


def skippable_draft(cluster):
    """The draft node when serving can go on without it (it holds no target layers), else None."""
    return cluster.skippable_draft


def modes_document(cluster, speculative: dict, degraded: dict | None, expect: str | None,
                   wait_timeout: int) -> dict:
    """What the launcher and the watcher read (/etc/tunnelspec/llama-server.json). `speculative` and
    `degraded` are ServerPlan facts (degraded: the plan with the draft node left out)."""
    draft = skippable_draft(cluster) if degraded is not None else None
    required = [n for n in cluster.rpc if draft is None or n.name != draft.name]
    d = cluster.draft_node
    return {
        "schema": 1,
        "unit": "tunnelspec-llama-server.service",
        "state": STATE_PATH,
        "rejoin_flag": REJOIN_FLAG,
        "expect": expect,
        "wait": {"nodes": [n.name for n in required], "endpoints": [n.endpoint for n in required],
                 "timeout": wait_timeout},
        "draft": None if d is None else {
            "node": d.name, "endpoint": d.endpoint, "port": d.tunnel_port,
            "tunnel_unit": f"tunnelspec-tunnel-{d.name}.service", "devices": speculative["draft_devices"]},
        "modes": {SPECULATIVE: speculative["argv"], DEGRADED: degraded["argv"] if draft is not None and degraded is not None else None},
        "rejoin_after": cluster.main.front.rejoin_after,
        "grace": START_GRACE,
        "front": {"stats": FRONT_STATS, "backend": FRONT_BACKEND},
    }


def modes_json(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def draftwatch_exec() -> str:
    return f"/usr/bin/python3 {DRAFTWATCH} launch {MODES_PATH}"


def add_serving(fact: dict, cluster, degraded_plan, expect: str | None, wait_timeout: int) -> None:
    """Complete the `llama_server` fact (the speculative plan) with what the launcher, the watcher
    and the front need. `degraded_plan(absent)` builds the plan with those nodes left out."""
    draft = skippable_draft(cluster)
    degraded = degraded_plan(frozenset({draft.name})).as_fact() if draft is not None else None
    fact["degraded"] = degraded
    fact["modes_json"] = modes_json(modes_document(cluster, fact, degraded, expect, wait_timeout))
    fact["draft_skippable"] = draft is not None
    fact["unit"].update(
        exec_start=draftwatch_exec(), state_dir=STATE_DIR_NAME, grace=START_GRACE,
        required_tunnel_units=[tunnel_unit(n.name) for n in cluster.rpc if draft is None or n.name != draft.name])
    fact["front"] = front_vars(cluster.main)
    fact["metrics"] = metrics_fact(cluster)
    fact["watch"] = {"draft_node": draft.name if draft is not None else "", "llama_unit": fact["unit"].get(
        "name", "tunnelspec-llama-server.service"), "draftwatch": DRAFTWATCH, "modes_path": MODES_PATH,
        "watch_dir": WATCH_DIR_NAME}
