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

from tunnelspec.inventory.values import USER_NAME

DEFAULT_INTERNAL_PORT = 18080
DEFAULT_HOLD_TIMEOUT = 180
DEFAULT_REJOIN_AFTER = 20
DEFAULT_FRONT_USER = "tunnelspec-front"
VARS = ("llama_server_internal_port", "llama_server_hold_timeout", "draft_rejoin_after", "front_user")


@dataclass(frozen=True)
class FrontSettings:
    internal_port: int   # llama-server's own port (127.0.0.1 only), behind the front
    hold_timeout: int    # seconds a request may wait for llama-server to come (back) up
    rejoin_after: int    # seconds of steady HELLO answers before the draft comes back
    user: str            # the front's system user (the only one let through to internal_port)


def front_of(hv, server_port: int) -> FrontSettings:
    internal = hv.port("llama_server_internal_port", DEFAULT_INTERNAL_PORT)
    if internal == server_port:
        raise hv.fail("llama_server_internal_port",
                      f"{internal} is llama_server_port too: llama-server listens behind the front on its own "
                      f"port (default {DEFAULT_INTERNAL_PORT})")
    user = hv.string("front_user", DEFAULT_FRONT_USER)
    if not USER_NAME.match(user) or user == "root":
        raise hv.fail("front_user", f"{user!r} is not a valid unprivileged system user name "
                      f"(e.g. {DEFAULT_FRONT_USER})")
    return FrontSettings(
        internal_port=internal,
        hold_timeout=hv.integer("llama_server_hold_timeout", DEFAULT_HOLD_TIMEOUT, minimum=5),
        rejoin_after=hv.integer("draft_rejoin_after", DEFAULT_REJOIN_AFTER, minimum=1),
        user=user,
    )
