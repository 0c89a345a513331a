"""sshd on the rpc nodes, for the tunnel user: the `Match User` drop-in with its limits (checked
with sshd itself before it stays), sshd's reload, and renewing the sessions that predate it."""

from __future__ import annotations

import fnmatch
import hashlib
from typing import Any

from tunnelspec.connection.base import read_argv
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.templating import render_file
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.files import file_state
from tunnelspec.facts.sshd import effective_settings, sshd_includes
from tunnelspec.inventory.values import USER_NAME
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.modules.files import template_search_path
from tunnelspec.components.tunnel.trust import source_address
from tunnelspec.components.tunnel.units import node_ssh_target

SSHD_CONFIG = "/etc/ssh/sshd_config"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/tunnelspec-tunnel.conf"
SSHD_DROPIN_TEMPLATE = "tunnelspec-tunnel-sshd.conf.j2"
# Keyword → value, in file order; `sshd -T` prints the same pairs (keywords lower-cased), which is
# how the effective policy is checked after install.
SSHD_TUNNEL_POLICY = (
    # sshd probes a silent client every 5 s and drops it after 3 misses: a session orphaned by a cut
    # link would otherwise hold the one-client RPC server until TCP keepalive (hours).
    ("ClientAliveInterval", "5"),
    ("ClientAliveCountMax", "3"),
    ("AllowTcpForwarding", "local"),
    ("PermitListen", "none"),
    ("GatewayPorts", "no"),
    ("X11Forwarding", "no"),
    ("AllowAgentForwarding", "no"),
    ("PermitTTY", "no"),
    ("AllowStreamLocalForwarding", "no"),
    ("PermitTunnel", "no"),
)


# Where sshd_config includes no sshd_config.d, the same block goes at the end of sshd_config itself,
# between these lines (a Match block runs to the next Match or the end of the file): there is no
# authorized_keys option that turns off stream-local (Unix socket) forwarding, which the key's
# `port-forwarding` turns back on, so only sshd's own config can.
BLOCK_BEGIN = "# BEGIN tunnelspec: limits for the tunnel user (managed block, do not edit)"
BLOCK_END = "# END tunnelspec"


def without_block(config: str) -> str:
    out, inside = [], False
    for line in config.splitlines(keepends=True):
        if line.rstrip("\n") == BLOCK_BEGIN:
            inside = True
        elif inside and line.rstrip("\n") == BLOCK_END:
            inside = False
        elif not inside:
            out.append(line)
    text = "".join(out)
    return text.rstrip("\n") + "\n" if text.strip() else ""


def with_block(config: str, block: str) -> str:
    return without_block(config) + "\n" + BLOCK_BEGIN + "\n" + block.rstrip("\n") + "\n" + BLOCK_END + "\n"


async def effective_policy_gaps(conn, user: str, address: str, sshd: str, config: str | None = None) -> list[str]:
    """Settings of SSHD_TUNNEL_POLICY that sshd would not apply to `user` from `address`."""
    try:
        got = await effective_settings(conn, sshd, user, address, config)
    except RuntimeError as e:
        return [str(e)]
    return [
        f"{k} {got.get(k.lower(), '?')} (want {v})"
        for k, v in SSHD_TUNNEL_POLICY
        if got.get(k.lower(), "").lower() != v.lower()
    ]


@register_task
class TunnelSshdPolicy(Task):
    """`Match User <tunnel user>` drop-in in sshd_config.d on a node (state=present), or gone
    (state=absent). Where the main sshd_config includes no sshd_config.d, the same block is appended
    to sshd_config itself between marker lines (and taken out again by state=absent).
    A candidate is put in place, checked with `sshd -t` and `sshd -T`, and rolled back if sshd
    would reject it: an sshd that cannot start locks everyone out. Notify `sshd_reload`
    (and `tunnel_sessions_renew`, so existing tunnel sessions pick the limits up)."""

    module = "tunnel_sshd_policy"
    reads_cluster = True
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
        for src in template_search_path(ctx, SSHD_DROPIN_TEMPLATE):
            if src.exists():
                return render_file(src.read_text(), {"user": user, "policy": SSHD_TUNNEL_POLICY}, str(src)).encode()
        raise TaskFailed(f"template {SSHD_DROPIN_TEMPLATE} not found")

    def probes(self) -> list[list[str]]:
        return [file_state(self.p["path"]).argv, read_argv(self.p["config"])]

    async def check(self, ctx):
        path = self.p["path"]
        st = await file_state(path).gather(ctx.conn, check=True)
        raw = await ctx.conn.get(self.p["config"])
        config = (raw or b"").decode(errors="replace")
        if self.p["state"] == "absent":
            todo: list[str] = []
            data: dict[str, Any] = {"absent": st.exists}
            if st.exists:
                todo.append(f"remove {path}")
            if BLOCK_BEGIN in config.splitlines():
                todo.append(f"remove the tunnel user's block from {self.p['config']}")
                data["main_config"] = without_block(config)
            return change(", ".join(todo), **data) if todo else ok(f"{path} absent")
        if raw is not None and not any(fnmatch.fnmatchcase(path, g) for g in sshd_includes(config)):
            new = with_block(config, self._render(ctx).decode())
            if new == config:
                return ok(
                    f"sshd limits for {self.p['user']} in place (in {self.p['config']}: it includes no "
                    f"{path.rsplit('/', 1)[0]})"
                )
            return change(
                f"add the tunnel user's Match block to {self.p['config']} (it has no `Include "
                f"{path.rsplit('/', 1)[0]}/*.conf` line)",
                Diff(config, new, self.p["config"]),
                main_config=new,
            )
        want = self._render(ctx)
        if st.exists and st.type != "file":
            raise TaskFailed(f"{path} exists and is a {st.type}, not a file")
        if st.exists and st.sha256 == hashlib.sha256(want).hexdigest() and (st.mode, st.owner) == ("644", "root"):
            return ok(f"sshd limits for {self.p['user']} in place")
        cur = (await ctx.conn.get(path) or b"").decode(errors="replace") if st.exists else ""
        return change(f"{'update' if st.exists else 'install'} {path}", Diff(cur, want.decode(), path), content=want)

    async def apply(self, ctx, ch):
        path = self.p["path"]
        if self.p["state"] == "absent":
            if ch.data.get("absent"):
                await ctx.conn.run(["rm", "-f", "--", path], check=True)
            if "main_config" in ch.data:
                await ctx.conn.put(ch.data["main_config"], self.p["config"], 0o644, "root")
            return
        if "main_config" in ch.data:
            await self._apply_main_config(ctx, ch.data["main_config"])
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
            gaps = await effective_policy_gaps(
                ctx.conn, self.p["user"], await source_address(ctx, addr) or LOOPBACK, self.p["sshd"]
            )
            if gaps:
                problem = "an earlier sshd config overrides: " + ", ".join(gaps)
        if problem:
            if before is None:
                await ctx.conn.run(["rm", "-f", "--", path], check=True)
            else:
                await ctx.conn.put(before, path, 0o644, "root")
            raise TaskFailed(f"{path} rolled back ({problem})")

    async def _apply_main_config(self, ctx, new: str) -> None:
        config = self.p["config"]
        before = await ctx.conn.get(config)
        await ctx.conn.put(new, config, 0o644, "root")
        problem = await _main_config_problem(ctx, self, config)
        if problem:
            await ctx.conn.put(before, config, 0o644, "root")
            raise TaskFailed(f"{config}: the tunnel user's block was taken out again ({problem})")


async def _main_config_problem(ctx, task, config: str) -> str | None:
    res = await ctx.conn.probe([task.p["sshd"], "-t", "-f", config])
    if res.rc != 0:
        return f"sshd -t rejects it: {(res.stderr or res.stdout).strip()}"
    addr, _ = node_ssh_target(ctx.require_cluster().inventory, ctx.host)
    gaps = await effective_policy_gaps(
        ctx.conn, task.p["user"], await source_address(ctx, addr) or LOOPBACK, task.p["sshd"], config
    )
    return "an earlier setting in the config overrides: " + ", ".join(gaps) if gaps else None


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
