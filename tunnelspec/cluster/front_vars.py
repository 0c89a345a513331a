"""The front of llama-server on main (docs/degraded.md): the settings the inventory gives it.

Users talk to `llama_server_host:llama_server_port`, where HAProxy (tunnelspec-front.service)
listens; llama-server itself listens on `127.0.0.1:llama_server_internal_port`, which the loopback
isolation closes to everyone but the front's user. The front holds a request while llama-server
restarts (a switch between speculative and degraded, a crash, a deploy) for up to
`llama_server_hold_timeout` seconds, and a draft node that comes back must answer steadily for
`draft_rejoin_after` seconds before llama-server is restarted with the draft again.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnelspec.cluster.vars_main import DEFAULT_INTERNAL_PORT, DEFAULT_METRICS_PORT

# bench's baseline llama-server (commands/bench): a registered, guarded port of its own (cluster/ports.py),
# never the first free one on the host (a local user who bound that first would get the API key of its
# requests). Default: the first port above llama_server_internal_port that no other port of the front
# takes (18081 with the defaults); the inventory's port collisions judge it like any other.
DEFAULT_BENCH_PORT = DEFAULT_INTERNAL_PORT + 1
VARS = (
    "llama_server_internal_port",
    "llama_server_hold_timeout",
    "draft_rejoin_after",
    "front_user",
    "metrics",
    "metrics_port",
    "metrics_token_file",
    "metrics_readers",
    "bench_port",
)


@dataclass(frozen=True)
class MetricsSettings:
    """`metrics=true` (docs/metrics.md): the exporter on 127.0.0.1:port; with public bind the front
    also serves /metrics over its TLS, to holders of the token in `token_file` (a file on main)."""

    port: int
    token_file: str | None  # public bind only (required then)
    # Users besides root and the front's that may connect to the exporter's port (a local Prometheus):
    # the port is guarded like every other (cluster/ports.py).
    readers: tuple[str, ...] = ()


@dataclass(frozen=True)
class FrontSettings:
    internal_port: int  # llama-server's own port (127.0.0.1 only), behind the front
    hold_timeout: int  # seconds a request may wait for llama-server to come (back) up
    rejoin_after: int  # seconds of steady HELLO answers before the draft comes back
    user: str  # the front's system user (the only one let through to internal_port)
    metrics: MetricsSettings | None = None  # None: metrics off (nothing installed, nothing listens)
    bench_port: int = DEFAULT_BENCH_PORT  # bench's baseline llama-server, 127.0.0.1, root's connections only


def front_of(hv, server_port: int) -> FrontSettings:
    internal = hv.get("llama_server_internal_port")
    if internal == server_port:
        raise hv.fail(
            "llama_server_internal_port",
            f"{internal} is llama_server_port too: llama-server listens behind the front on its own "
            f"port (default {DEFAULT_INTERNAL_PORT})",
        )
    metrics = metrics_of(hv, (server_port, internal))
    taken = {server_port, internal, *((metrics.port,) if metrics else ())}
    bench = hv.get("bench_port")
    if bench is None:
        bench = internal + 1
        while bench in taken and bench < 65535:
            bench += 1
    return FrontSettings(
        internal_port=internal,
        bench_port=bench,
        hold_timeout=hv.get("llama_server_hold_timeout"),
        rejoin_after=hv.get("draft_rejoin_after"),
        user=hv.get("front_user"),
        metrics=metrics,
    )


def metrics_of(hv, taken: tuple[int, ...]) -> MetricsSettings | None:
    if not hv.get("metrics"):
        for var in ("metrics_port", "metrics_token_file", "metrics_readers"):
            if hv.raw(var, None) is not None:
                raise hv.fail(var, "is set but metrics is not: add metrics=true (docs/metrics.md), or remove it")
        return None
    port = hv.get("metrics_port")
    if port in taken:
        raise hv.fail(
            "metrics_port",
            f"{port} is already llama-server's or the front's port; pick another (default {DEFAULT_METRICS_PORT})",
        )
    token = hv.get("metrics_token_file")
    public = hv.get("llama_server_public_bind")
    if public and token is None:
        raise hv.fail(
            "metrics",
            "with llama_server_public_bind=true the front serves /metrics over TLS to holders "
            "of a scrape token: set metrics_token_file=<path on main of a file holding it, one line> "
            "(its own token, never the API key)",
        )
    if token is not None:
        if not public:
            raise hv.fail(
                "metrics_token_file",
                "only used with llama_server_public_bind=true (on loopback the "
                "metrics are scraped through SSH); remove it",
            )
        if token == hv.get("llama_server_api_key_file"):
            raise hv.fail(
                "metrics_token_file",
                "is the API key's file: the scrape token is a credential of its "
                "own (a leaked scrape config must not give the API); write another file",
            )
    return MetricsSettings(port=port, token_file=token, readers=tuple(hv.get("metrics_readers")))
