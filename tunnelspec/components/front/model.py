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
  under it) is sent once more, through the hold; dropped again it is answered 502 (a request that
  crashes llama-server must not restart it until the hold ends). That count is apart from the hold's
  because the front is two layers in one HAProxy: the outer one retries a drop once, over 0600 unix
  sockets to the inner one, which holds (second tries one at a time). One cut mid-response cannot be retried.
- **Modes**: the launcher (`tunnelspec-draftwatch launch`, llama-server's ExecStart) starts
  llama-server with the draft ("speculative") when the draft node answers the RPC HELLO through its
  tunnel, else with the target alone ("degraded"); the watcher (`tunnelspec-draftwatch.service`)
  restarts llama-server when the draft is lost, and again once the node answered steadily for
  `rejoin_after` seconds and the front shows no request in flight. Nodes with target layers are
  waited for ("waiting"); a cluster without a draft runs one command line ("plain").
"""

from __future__ import annotations

import json

from tunnelspec.core import writable
from tunnelspec.core.constants import ETC_DIR, LOOPBACK
from tunnelspec.components.generation.record import STATUS as GENERATION_STATUS
from tunnelspec.components.server.args import tunnel_unit
from tunnelspec.llama import memory_fit

FRONT_UNIT = "tunnelspec-front.service"
FRONT_CONFIG = f"{ETC_DIR}/front.cfg"
FRONT_RUN_DIR = writable.FRONT_RUN.path  # the front user's (core/writable.py)
FRONT_STATS_NAME = "stats.sock"
FRONT_STATS = f"{FRONT_RUN_DIR}/{FRONT_STATS_NAME}"
FRONT_BACKEND = "llama"  # the inner layer's backend: the hold, the health check, llama-server
# The outer layer (docs/degraded.md, "A request that crashes llama-server"): the API's backend, which
# sends a request llama-server dropped once more, and answers 502 (counted as its denied responses)
# when it is dropped again; it reaches the inner layer's frontend on a 0600 unix socket.
FRONT_RETRY_BACKEND = "retry_once"
FRONT_INNER_FRONTEND = "inner"
FRONT_INNER_SOCKET_NAME = "inner.sock"
# A dropped request's second try takes another way in: its own 0600 socket, which accepts one
# connection at a time, so at the next crash only the request that crashes llama-server has been
# dropped twice (the others in flight with it are first tries).
FRONT_AGAIN_FRONTEND = "inner_again"
FRONT_AGAIN_SOCKET_NAME = "again.sock"
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
METRICS_SOCKET_NAME = "metrics.sock"
METRICS_SOCKET = f"{FRONT_RUN_DIR}/{METRICS_SOCKET_NAME}"
WATCH_HELLO = "/run/tunnelspec-draftwatch/hello.json"  # the watcher's last HELLO of the draft node

WATCH_UNIT = "tunnelspec-draftwatch.service"
HELPER_DIR = "/usr/local/lib/tunnelspec"
DRAFTWATCH = f"{HELPER_DIR}/tunnelspec-draftwatch"
RPC_WAIT = f"{HELPER_DIR}/tunnelspec-rpc-wait"
METRICS_EXPORTER = f"{HELPER_DIR}/tunnelspec-metrics"
MODES_PATH = f"{ETC_DIR}/llama-server.json"
STATE_DIR_NAME = writable.LLAMA_RUN.name  # llama-server's RuntimeDirectory (kept across its restarts; its user's)
STATE_PATH = f"/run/{STATE_DIR_NAME}/mode.json"
WATCH_DIR_NAME = "tunnelspec-draftwatch"  # the watcher's RuntimeDirectory
REJOIN_FLAG = f"/run/{WATCH_DIR_NAME}/rejoin"  # the time the watcher asked for the draft back

SPECULATIVE, DEGRADED, WAITING, PLAIN = "speculative", "degraded", "waiting", "plain"
# A split served from the remaining devices while one target node is away (docs/degraded.md).
SPLIT_DEGRADED = "split-degraded"
# Seconds the launcher waits for a target node it can serve without before it does (a killed ssh
# or rpc-server is back within about two; a node that stopped answering is not worth holding for).
SPLIT_WAIT = 5
# Seconds the launcher gives a draft tunnel at a fresh start (boot, deploy) before serving degraded.
START_GRACE = 10


def front_vars(main, run_dir: str = FRONT_RUN_DIR) -> dict:
    """The front's template variables (templates/tunnelspec-front.cfg.j2). `run_dir`: the front's
    runtime directory, where its sockets are (another one only for a front started by a test)."""
    f = main.front
    return {
        "bind_host": main.server_host,
        "bind_port": main.server_port,
        "internal_port": f.internal_port,
        "loopback": LOOPBACK,
        "hold_port": HOLD_PORT,
        "hold_retries": f.hold_timeout * HOLD_TRIES_PER_S,
        "hold_seconds": f.hold_timeout,
        "stats_socket": f"{run_dir}/{FRONT_STATS_NAME}",
        "backend": FRONT_BACKEND,
        "retry_backend": FRONT_RETRY_BACKEND,
        "inner_frontend": FRONT_INNER_FRONTEND,
        "inner_socket": f"{run_dir}/{FRONT_INNER_SOCKET_NAME}",
        "again_frontend": FRONT_AGAIN_FRONTEND,
        "again_socket": f"{run_dir}/{FRONT_AGAIN_SOCKET_NAME}",
        "front_user": f.user,
        "public_bind": main.public_bind,
        "tls_pem": main.tls.cert_path if main.tls is not None else "",
        "run_dir": run_dir,
        "config": FRONT_CONFIG,
        "haproxy": HAPROXY,
        "metrics": f.metrics is not None,
        "metrics_socket": f"{run_dir}/{METRICS_SOCKET_NAME}",
        "metrics_port": f.metrics.port if f.metrics else 0,
        "metrics_token_file": (f.metrics.token_file or "") if f.metrics else "",
    }


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
        "front": {"socket": METRICS_SOCKET, "retry_backend": FRONT_RETRY_BACKEND},
    }


def metrics_fact(cluster) -> dict | None:
    """The `llama_server.metrics` fact: None with metrics off; else the exporter's configuration and
    its unit's variables."""
    main = cluster.main
    if main.front.metrics is None:
        return None
    return {
        "config_json": json.dumps(metrics_document(cluster), indent=1, sort_keys=True) + "\n",
        "unit": {
            "front_user": main.front.user,
            "loopback": LOOPBACK,
            "exporter": METRICS_EXPORTER,
            "config": METRICS_CONFIG,
            "api_key_file": main.api_key_file or "",
            "port": main.front.metrics.port,
            "front_unit": FRONT_UNIT,
            "llama_unit": "tunnelspec-llama-server.service",
        },
        "token_file": main.front.metrics.token_file or "",
        "api_key_file": main.api_key_file or "",
    }


def skippable_draft(cluster):
    """The draft node when serving can go on without it (it holds no target layers), else None."""
    return cluster.skippable_draft


def modes_document(
    cluster,
    speculative: dict,
    degraded: dict | None,
    expect: str | None,
    wait_timeout: int,
    without: dict | None = None,
) -> dict:
    """What the launcher and the watcher read (/etc/tunnelspec/llama-server.json). `speculative` and
    `degraded` are ServerPlan facts (degraded: the plan with the draft node left out); `without`:
    target node → the plan with that node left out, for the nodes whose loss the remaining devices
    can absorb (split-degraded; only those the fit check said fit)."""
    draft = skippable_draft(cluster) if degraded is not None else None
    required = [n for n in cluster.rpc if draft is None or n.name != draft.name]
    d = cluster.draft_node
    return {
        "schema": 1,
        "unit": "tunnelspec-llama-server.service",
        "state": STATE_PATH,
        "rejoin_flag": REJOIN_FLAG,
        "expect": expect,
        "wait": {
            "nodes": [n.name for n in required],
            "endpoints": [n.endpoint for n in required],
            "timeout": wait_timeout,
        },
        "draft": None
        if d is None
        else {
            "node": d.name,
            "endpoint": d.endpoint,
            "port": d.tunnel_port,
            "tunnel_unit": tunnel_unit(d.name),
            "devices": speculative["draft_devices"],
        },
        "modes": {
            SPECULATIVE: speculative["argv"],
            DEGRADED: degraded["argv"] if draft is not None and degraded is not None else None,
        },
        "rejoin_after": cluster.main.front.rejoin_after,
        "grace": START_GRACE,
        # The outer backend: every request passes there, first try and second (the watcher restarts
        # llama-server only when none is in flight or waiting).
        "front": {"stats": FRONT_STATS, "backend": FRONT_RETRY_BACKEND},
        **(
            {
                "without": {
                    name: {
                        "argv": plan["argv"],
                        "endpoint": n.endpoint,
                        "port": n.tunnel_port,
                        "tunnel_unit": tunnel_unit(n.name),
                    }
                    for n in cluster.rpc
                    for name, plan in sorted((without or {}).items())
                    if n.name == name
                },
                "split_wait": SPLIT_WAIT,
            }
            if without
            else {}
        ),
    }


def modes_json(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def draftwatch_exec() -> str:
    return f"/usr/bin/python3 {DRAFTWATCH} launch {MODES_PATH}"


def split_candidates(cluster) -> list:
    """Target nodes a split could be served without (split-degraded): a split with no draft at all,
    the proportions given (the fit check needs each device's part), more than one target device
    left. Whether the rest holds the model is the fit check's (split_fits)."""
    p = cluster.placement
    if cluster.draft_node is not None or p.weights is None:
        return []
    nodes = cluster.target_nodes
    cpu = (p.weight_of("CPU") or 0) > 0
    return [
        n
        for n in nodes
        if (p.weight_of(n.name) or 0) > 0 and (cpu or any((p.weight_of(m.name) or 0) > 0 for m in nodes if m is not n))
    ]


def split_fits(cluster, absent: str, size: int, shape, served: dict, main_mem: tuple | None) -> tuple[bool | None, str]:
    """(fits, why) for serving the target without `absent`: each remaining device's new part (its
    proportion over what remains, llama/devices.py target_share_need) against the free memory the
    deploy knows — each node's served devices (`served`: node → rpc_served) and main's RAM
    (`main_mem`: (free, total) bytes, for main's CPU share). None: cannot be decided (a figure
    unknown) — the mode is then not offered."""
    p = cluster.placement
    if not size or p.weights is None:
        return None, "the target's size or proportions unknown"
    rest = [(n.name, p.weight_of(n.name) or 0.0) for n in cluster.target_nodes if n.name != absent]
    cpu = p.weight_of("CPU") or 0.0
    total = sum(w for _, w in rest) + cpu
    if total <= 0:
        return False, "no device left with a proportion"
    verdicts = []
    for name, w in rest:
        if w <= 0:
            continue
        devs = served.get(name)
        if not devs:
            return None, f"{name}'s device memory unknown in this run"
        need = memory_fit.target_share_need(size, w, total, shape, None)
        figures = [(d["name"], d["free_mib"] * memory_fit.MIB, d["total_mib"] * memory_fit.MIB) for d in devs]
        verdicts.append(memory_fit.check_fit(name, figures, need, f"{w / total:.0%} of the target"))
    if cpu > 0:
        if not main_mem:
            return None, "main's free memory unknown"
        need = memory_fit.target_share_need(size, cpu, total, shape, None)
        verdicts.append(
            memory_fit.check_fit("main", [("RAM", main_mem[0], main_mem[1])], need, f"{cpu / total:.0%} of the target")
        )
    bad = [v for v in verdicts if v.level == "refuse"]
    if bad:
        return False, "; ".join(v.message for v in bad)
    return True, "; ".join(v.message for v in verdicts)


def add_serving(fact: dict, cluster, degraded_plan, expect: str | None, wait_timeout: int, fits=None) -> None:
    """Complete the `llama_server` fact (the speculative plan) with what the launcher, the watcher
    and the front need. `degraded_plan(absent)` builds the plan with those nodes left out;
    `fits(node)` → (fits, why) says whether the rest holds the model without that target node
    (split_fits; None: not decided, no split-degraded line for it)."""
    draft = skippable_draft(cluster)
    degraded = degraded_plan(frozenset({draft.name})).as_fact() if draft is not None else None
    fact["degraded"] = degraded
    without, fit_notes = {}, {}
    for n in split_candidates(cluster) if fits is not None else []:
        ok_, why = fits(n.name)
        fit_notes[n.name] = {True: "fits", False: "does not fit", None: "not decided"}[ok_] + f": {why}"
        if ok_:
            # The fit's figures (free MiB now) stay out of the document: it changes only with the verdict.
            without[n.name] = degraded_plan(frozenset({n.name})).as_fact()
    fact["without"] = without  # node → the plan without it: what the launcher runs, what verify proves
    fact["split_fit"] = fit_notes
    fact["modes_json"] = modes_json(modes_document(cluster, fact, degraded, expect, wait_timeout, without))
    # The watcher also runs for a split it can serve without a node (it notices the loss, and the return).
    fact["draft_skippable"] = draft is not None or bool(without)
    fact["unit"].update(
        exec_start=draftwatch_exec(),
        state_dir=STATE_DIR_NAME,
        grace=START_GRACE,
        # A node the split can be served without is not PartOf= llama-server's unit (its tunnel
        # reconnecting while the node is away would restart llama-server each time): the watcher
        # restarts llama-server on its loss instead, as for a draft-only node.
        required_tunnel_units=[
            tunnel_unit(n.name)
            for n in cluster.rpc
            if (draft is None or n.name != draft.name) and n.name not in without
        ],
    )
    fact["front"] = front_vars(cluster.main)
    fact["metrics"] = metrics_fact(cluster)
    fact["watch"] = {
        "draft_node": draft.name if draft is not None else "",
        "llama_unit": fact["unit"].get("name", "tunnelspec-llama-server.service"),
        "draftwatch": DRAFTWATCH,
        "modes_path": MODES_PATH,
        "watch_dir": WATCH_DIR_NAME,
    }
    if draft is None and without:
        fact["watch"]["draft_node"] = "/".join(sorted(without))  # the unit's description names them
