"""sshd on the rpc nodes, for the tunnel user: the `Match User` drop-in with its limits (checked
with sshd itself before it stays), sshd's reload, and renewing the sessions that predate it."""

from __future__ import annotations

import fnmatch
import hashlib

from tunnelspec.constants import LOOPBACK
from tunnelspec.engine.templating import render_file
from tunnelspec.errors import TaskFailed
from tunnelspec.facts.files import file_state
from tunnelspec.facts.sshd import effective_settings, sshd_includes
from tunnelspec.inventory.values import USER_NAME
from tunnelspec.tasks.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.tasks.files import template_search_path
from tunnelspec.tasks.tunnel_keys import source_address
from tunnelspec.tunnel_ssh import node_ssh_target

SSHD_CONFIG = "/etc/ssh/sshd_config"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/tunnelspec-tunnel.conf"
SSHD_DROPIN_TEMPLATE = "tunnelspec-tunnel-sshd.conf.j2"
# Keyword → value, in file order; `sshd -T` prints the same pairs (keywords lower-cased), which is
# how the effective policy is checked after install.
SSHD_TUNNEL_POLICY = (
    # sshd probes a silent client every 5 s and drops it after 3 misses: a session orphaned by a cut
    # link would otherwise hold the one-client RPC server until TCP keepalive (hours).
    ("ClientAliveInterval", "5"), ("ClientAliveCountMax", "3"),
    ("AllowTcpForwarding", "local"), ("PermitListen", "none"), ("GatewayPorts", "no"),
    ("X11Forwarding", "no"), ("AllowAgentForwarding", "no"), ("PermitTTY", "no"),
    ("AllowStreamLocalForwarding", "no"), ("PermitTunnel", "no"),
)


async def effective_policy_gaps(conn, user: str, address: str, sshd: str) -> list[str]:
    """Settings of SSHD_TUNNEL_POLICY that sshd would not apply to `user` from `address`."""
    try:
        got = await effective_settings(conn, sshd, user, address)
    except RuntimeError as e:
        return [str(e)]
    return [f"{k} {got.get(k.lower(), '?')} (want {v})" for k, v in SSHD_TUNNEL_POLICY
            if got.get(k.lower(), "").lower() != v.lower()]


@register_task
class TunnelSshdPolicy(Task):
    """`Match User <tunnel user>` drop-in in sshd_config.d on a node (state=present), or gone
    (state=absent). Installed only where the main sshd_config includes sshd_config.d (Debian and
    Ubuntu do); elsewhere it is skipped with a message, never by editing the main config.
    A candidate is put in place, checked with `sshd -t` and `sshd -T`, and rolled back if sshd
    would reject it: an sshd that cannot start locks everyone out. Notify `sshd_reload`
    (and `tunnel_sessions_renew`, so existing tunnel sessions pick the limits up)."""

    module = "tunnel_sshd_policy"
    args = {
        "user": Arg(str, required=True, help="The tunnel user the `Match User` block is for."),
        "path": Arg(str, default=SSHD_DROPIN, help="The drop-in file."),
        "config": Arg(str, default=SSHD_CONFIG, help="The main sshd_config (must include the drop-in directory)."),
        "sshd": Arg(str, default="/usr/sbin/sshd", help="The sshd binary (for `-t` and `-T`)."),
        "state": Arg(str, default="present", choices=("present", "absent"), help="`present` or `absent`."),
    }

    def _render(self, ctx) -> bytes:
        user = self.p["user"]
        if not USER_NAME.match(user):
            raise TaskFailed(f"tunnel user name {user!r} cannot be used in an sshd Match line")
        for d in template_search_path(ctx):
            src = d / SSHD_DROPIN_TEMPLATE
            if src.exists():
                return render_file(src.read_text(), {"user": user, "policy": SSHD_TUNNEL_POLICY}, str(src)).encode()
        raise TaskFailed(f"template {SSHD_DROPIN_TEMPLATE} not found")

    async def check(self, ctx):
        path = self.p["path"]
        st = await file_state(ctx.conn, path)
        if self.p["state"] == "absent":
            return change(f"remove {path}", absent=True) if st.exists else ok(f"{path} absent")
        config = (await ctx.conn.get(self.p["config"]) or b"").decode(errors="replace")
        if not any(fnmatch.fnmatchcase(path, g) for g in sshd_includes(config)):
            return ok(f"skipped: {self.p['config']} has no `Include {path.rsplit('/', 1)[0]}/*.conf` line, and "
                      "tunnelspec does not edit the main sshd config; the tunnel key's authorized_keys "
                      "restrictions still apply, but orphaned tunnel sessions are not reaped by sshd")
        want = self._render(ctx)
        if st.exists and st.type != "file":
            raise TaskFailed(f"{path} exists and is a {st.type}, not a file")
        if st.exists and st.sha256 == hashlib.sha256(want).hexdigest() and (st.mode, st.owner) == ("644", "root"):
            return ok(f"sshd limits for {self.p['user']} in place")
        cur = (await ctx.conn.get(path) or b"").decode(errors="replace") if st.exists else ""
        return change(f"{'update' if st.exists else 'install'} {path}", Diff(cur, want.decode(), path), content=want)

    async def apply(self, ctx, ch):
        path = self.p["path"]
        if ch.data.get("absent"):
            await ctx.conn.run(["rm", "-f", "--", path], check=True)
            return
        before = await ctx.conn.get(path)
        await ctx.conn.put(ch.data["content"], path, 0o644, "root")
        # sshd only reads config at start/reload, and a new connection's re-exec'd child gets it
        # from the listener: the candidate in place is invisible until the reload handler runs.
        problem = None
        res = await ctx.conn.probe([self.p["sshd"], "-t"])
        if res.rc != 0:
            problem = f"sshd -t rejects it: {(res.stderr or res.stdout).strip()}"
        else:
            addr, _ = node_ssh_target(ctx.require_cluster().inventory, ctx.host)
            gaps = await effective_policy_gaps(ctx.conn, self.p["user"], await source_address(ctx, addr) or LOOPBACK,
                                               self.p["sshd"])
            if gaps:
                problem = "an earlier sshd config overrides: " + ", ".join(gaps)
        if problem:
            if before is None:
                await ctx.conn.run(["rm", "-f", "--", path], check=True)
            else:
                await ctx.conn.put(before, path, 0o644, "root")
            raise TaskFailed(f"{path} rolled back ({problem})")


@register_task
class SshdReload(Task):
    """Reload sshd after its config changed, only if `sshd -t` accepts the whole config."""

    module = "sshd_reload"
    args = {
        "sshd": Arg(str, default="/usr/sbin/sshd", help="The sshd binary (for `sshd -t` before the reload)."),
    }
    handler_only = True

    async def check(self, ctx):
        return change("reload sshd")

    async def apply(self, ctx, ch):
        res = await ctx.conn.probe([self.p["sshd"], "-t"])
        if res.rc != 0:
            raise TaskFailed(f"sshd config invalid, not reloading: {res.stderr.strip()}")
        # Debian/Ubuntu name the unit ssh.service, most others sshd.service.
        for unit in ("ssh.service", "sshd.service"):
            state = await ctx.conn.probe(["systemctl", "show", "-p", "LoadState", "--value", unit])
            if state.stdout.strip() == "loaded":
                await ctx.conn.run(["systemctl", "reload", unit], check=True)
                return
        raise TaskFailed("no ssh.service or sshd.service unit to reload")


@register_task
class TunnelSessionsRenew(Task):
    """End the tunnel user's current sessions on a node, so the main host's tunnel units (which
    restart by themselves in a second) reconnect under sshd's new limits: a running sshd session
    keeps the config it started with. llama-server restarts with them (it aborts on RPC errors)."""

    module = "tunnel_sessions_renew"
    args = {
        "user": Arg(str, required=True, help="The tunnel user whose sessions end."),
    }
    handler_only = True

    async def check(self, ctx):
        return change(f"renew {self.p['user']} sessions")

    async def apply(self, ctx, ch):
        # The session's unprivileged sshd child runs as the tunnel user; ending it ends the session
        # (and its forced sleep, which has sshd as parent and its parent-death signal set). Then the
        # forced commands left over by sessions started before that signal was set (`sh -c sleep`,
        # `sleep`, orphaned): the user runs nothing else. Never the user's systemd manager.
        # Forced commands first, sshd second: a session whose command is gone ends too, and main's
        # tunnels reconnect only after their restart delay, so no new session's sleep is hit.
        user = self.p["user"]
        await ctx.conn.run(["pkill", "-KILL", "-u", user, "-x", "sleep|sh"])
        # OpenSSH >= 9.8 (Debian 13, Ubuntu >= 24.10) runs a session as `sshd-session`, older ones
        # as `sshd`: both names, so the renewal works on every release.
        res = await ctx.conn.probe(["pgrep", "-u", user, "-x", "sshd|sshd-session"])
        pids = [p for p in res.stdout.split() if p.isdigit()]
        if pids:
            await ctx.conn.run(["kill", "-TERM", "--", *pids])


