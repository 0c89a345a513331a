"""Tunnel trust and tunnels: the main host's tunnel-only key, the nodes' pinned host keys, the
restricted authorized_keys line on each node, one persistent ssh unit per node on main, and the
end-to-end HELLO through each tunnel.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import ipaddress
import re

from tunnelspec.constants import LOOPBACK
from tunnelspec.engine.templating import render_file
from tunnelspec.errors import TaskFailed
from tunnelspec.facts.files import file_state
from tunnelspec.keys import (TUNNEL_FORCED_COMMAND, authorized_keys_line, fingerprint, generate_ed25519,
                             known_hosts_line, tunnel_key_options)
from tunnelspec.llama.rpc import ProbeStatus
from tunnelspec.llama.versions import RPC_HEADER, format_version, rpc_proto_version
from tunnelspec.tasks.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.tasks.files import template_search_path
from tunnelspec.tasks.rpc import probe_until
from tunnelspec.tasks.systemd import Service, SystemdUnit

TUNNEL_DIR = "/etc/tunnelspec/tunnel"          # on main: key (tunnel user, 0600) + known_hosts (root)
KEY_PATH = f"{TUNNEL_DIR}/id_ed25519"
KNOWN_HOSTS = f"{TUNNEL_DIR}/known_hosts"
NODE_HOME = "/var/lib/tunnelspec/tunnel"       # on nodes: the tunnel user's home, root-owned
UNIT_TEMPLATE = "tunnelspec-tunnel.service.j2"
_UNIT_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def unit_name(node: str) -> str:
    if not _UNIT_SAFE.match(node):
        raise TaskFailed(f"rpc node name {node!r} cannot be part of a unit name")
    return f"tunnelspec-tunnel-{node}.service"


def node_ssh_target(inv, node: str) -> tuple[str, int]:
    """Where main's ssh reaches the node: tunnel_ssh_host/port, else the controller's view."""
    hv = inv.host_vars(node)
    host = str(hv.get("tunnel_ssh_host", hv.get("ansible_host", node)))
    port = int(hv.get("tunnel_ssh_port", hv.get("ansible_port", 22)))
    return host, port


def selected_nodes(cluster, nodes) -> list:
    """`nodes`: a list or comma string of node names; empty or "all" means every rpc node."""
    if isinstance(nodes, str):
        nodes = [n for n in nodes.split(",") if n]
    if not nodes or nodes == ["all"]:
        return list(cluster.rpc)
    known = {n.name: n for n in cluster.rpc}
    bad = [n for n in nodes if n not in known]
    if bad:
        raise TaskFailed(f"not rpc node(s): {', '.join(bad)} (rpc nodes: {', '.join(known)})")
    return [known[n] for n in nodes]


# With AES-NI on main, AES-GCM beat OpenSSH's default chacha20-poly1305 through the tunnel here
# (benchmarks/README.md, "Tunnel": bulk +48 %, small-message p50 -23 %, draft decode +12 %).
# Without AES-NI chacha20 is the faster one, so then the default order stays. Both are OpenSSH
# defaults: the set of allowed ciphers is not widened, only the preference changes.
AES_GCM_FIRST = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com"
AES_NI_PROBE = ["grep", "-m1", "-ow", "aes", "/proc/cpuinfo"]


def ssh_argv(node, target: tuple[str, int], user: str, key: str, known_hosts: str, session: bool,
             aes_ni: bool = False) -> list[str]:
    host, port = target
    opts = {
        "BatchMode": "yes", "StrictHostKeyChecking": "yes", "UserKnownHostsFile": known_hosts,
        "GlobalKnownHostsFile": "/dev/null", "CheckHostIP": "no", "UpdateHostKeys": "no",
        "IdentitiesOnly": "yes", "IdentityAgent": "none", "PubkeyAuthentication": "yes",
        "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
        "HostbasedAuthentication": "no", "ExitOnForwardFailure": "yes",
        "ServerAliveInterval": "5", "ServerAliveCountMax": "3", "ConnectTimeout": "10",
        "Compression": "no", "ForwardAgent": "no", "ForwardX11": "no", "PermitLocalCommand": "no",
        "ControlMaster": "no", "ControlPath": "none", "RequestTTY": "no",
    }
    if aes_ni:
        opts["Ciphers"] = AES_GCM_FIRST
    argv = ["/usr/bin/ssh", "-F", "none", "-T"] + (["-N"] if not session else [])
    argv += ["-i", key, "-p", str(port), "-l", user]
    for k, v in opts.items():
        argv += ["-o", f"{k}={v}"]
    argv += ["-L", f"{LOOPBACK}:{node.tunnel_port}:{LOOPBACK}:{node.rpc_port}", host]
    return argv


# ---- main: the tunnel key ---------------------------------------------------------------------
@register_task
class TunnelKeypair(Task):
    """A tunnel-only ed25519 key on main, generated on the controller in memory and written only
    there (0600, owned by the tunnel user). `rotation`: a token; a new token replaces the key once.
    Registers `tunnel_pubkey`."""

    module = "tunnel_keypair"
    args = {"path": Arg(str, default=KEY_PATH), "owner": Arg(str, required=True),
            "rotation": Arg(str, default=""), "comment": Arg(str, default="tunnelspec-tunnel")}

    async def _current(self, ctx) -> tuple[str | None, str]:
        # The public half is derived on main (ssh-keygen -y), so the private key never travels back.
        res = await ctx.conn.run(["ssh-keygen", "-y", "-f", self.p["path"]])
        pub = res.stdout.strip() if res.rc == 0 and res.stdout.startswith("ssh-ed25519 ") else None
        token = (await ctx.conn.get(self.p["path"] + ".rotation") or b"").decode().strip()
        return pub, token

    async def check(self, ctx):
        pub, token = await self._current(ctx)
        meta = await ctx.conn.run(["stat", "-c", "%a %U", "--", self.p["path"]])
        if pub is None:
            return change(f"generate tunnel key {self.p['path']}")
        if self.p["rotation"] and token != self.p["rotation"]:
            return change(f"rotate tunnel key {fingerprint(pub)}")
        if meta.stdout.split() != ["600", self.p["owner"]]:
            return change(f"key mode/owner {meta.stdout.strip()} → 600 {self.p['owner']}", rewrite=True)
        line = f"{pub} {self.p['comment']}"
        ctx.register("tunnel_pubkey", line)
        return ok(f"tunnel key {fingerprint(pub)}")

    async def apply(self, ctx, ch):
        d = self.p["path"].rsplit("/", 1)[0]
        await ctx.conn.run(["install", "-d", "-m", "750", "-o", "root", "-g", self.p["owner"], "--", d], check=True)
        if ch.data.get("rewrite"):
            await ctx.conn.run(["chown", f"{self.p['owner']}:{self.p['owner']}", "--", self.p["path"]], check=True)
            await ctx.conn.run(["chmod", "600", "--", self.p["path"]], check=True)
            return
        pair = generate_ed25519(self.p["comment"])
        ctx.add_secret(pair.private_openssh.reveal())
        await ctx.conn.put(pair.private_openssh.reveal(), self.p["path"], 0o600, self.p["owner"])
        await ctx.conn.put(pair.public_line + "\n", self.p["path"] + ".pub", 0o644)
        await ctx.conn.put(self.p["rotation"] + "\n", self.p["path"] + ".rotation", 0o644)


# ---- main: pinned host keys of the nodes ----------------------------------------------------------
def verified_host_key(conn) -> str:
    """The host key the controller's own SSH connection verified (strict known_hosts)."""
    inner = getattr(conn, "_conn", None)  # tunnelspec.connection.ssh.SSHConnection's asyncssh connection
    if inner is None:
        raise TaskFailed(f"{conn.name}: not an SSH connection; its host key cannot be pinned from the controller")
    key = inner.get_server_host_key()
    if key is None:
        raise TaskFailed(f"{conn.name}: no verified server host key")
    return key.export_public_key().decode().strip()


@register_task
class KnownHostsPin(Task):
    """known_hosts on main with each rpc node's host key as the controller verified it."""

    module = "known_hosts_pin"
    args = {"path": Arg(str, default=KNOWN_HOSTS), "nodes": Arg((list, str), default="all")}

    async def _content(self, ctx) -> str:
        lines = []
        for node in selected_nodes(ctx.controller.cluster, []):  # every node: one file for all tunnels
            conn = await ctx.controller.connection(node.name)
            addr, port = node_ssh_target(ctx.controller.inventory, node.name)
            lines.append(known_hosts_line(addr, port, verified_host_key(conn)))
        return "\n".join(lines) + "\n"

    async def check(self, ctx):
        want = await self._content(ctx)
        cur = (await ctx.conn.get(self.p["path"]) or b"").decode()
        if cur == want:
            return ok(f"{len(want.splitlines())} host key(s) pinned")
        return change("pin node host keys", Diff(cur, want, self.p["path"]), content=want)

    async def apply(self, ctx, ch):
        d = self.p["path"].rsplit("/", 1)[0]
        await ctx.conn.run(["install", "-d", "-m", "755", "--", d], check=True)
        await ctx.conn.put(ch.data["content"], self.p["path"], 0o644)


# ---- nodes: the restricted key line ----------------------------------------------------------------
async def source_address(ctx, node_address: str) -> str | None:
    """Main's address as the node sees it: the source main's routing picks for the node's IP.
    None when the node is addressed by name (no DNS from here) or main cannot tell."""
    try:
        ipaddress.ip_address(node_address)
    except ValueError:
        return None
    main = ctx.controller.cluster.main.name
    conn = await ctx.controller.connection(main)
    res = await conn.run(["ip", "-o", "route", "get", node_address])
    words = res.stdout.split()
    if res.rc == 0 and "src" in words:
        src = words[words.index("src") + 1]
        try:
            ipaddress.ip_address(src)
            return src
        except ValueError:
            return None
    return None


@register_task
class TunnelAuthorizedKey(Task):
    """The tunnel user's authorized_keys on a node: exactly one line,
    `restrict,port-forwarding,permitopen="127.0.0.1:<rpc_port>"[,from=…],command="exec /usr/bin/setpriv --pdeathsig KILL /bin/sleep infinity"` (keys.TUNNEL_FORCED_COMMAND).
    Root-owned and 0644 in a root-owned directory, so the tunnel user cannot widen it."""

    module = "tunnel_authorized_key"
    args = {"user": Arg(str, required=True), "pubkey": Arg(str, required=True), "rpc_port": Arg(int, required=True),
            "from_address": Arg(str), "home": Arg(str, default=NODE_HOME)}

    async def _line(self, ctx) -> str:
        frm = self.p["from_address"]
        if frm is None:
            addr, _ = node_ssh_target(ctx.controller.inventory, ctx.host)
            frm = await source_address(ctx, addr)
        opts = tunnel_key_options(self.p["rpc_port"], frm or None, TUNNEL_FORCED_COMMAND)
        return authorized_keys_line(self.p["pubkey"], opts, "tunnelspec-tunnel") + "\n"

    async def check(self, ctx):
        path = f"{self.p['home']}/.ssh/authorized_keys"
        want = await self._line(ctx)
        cur = (await ctx.conn.get(path) or b"").decode()
        meta = await ctx.conn.run(["stat", "-c", "%a %U", "--", path])
        if cur == want and meta.stdout.split() == ["644", "root"]:
            return ok("restricted tunnel key present")
        return change("install restricted tunnel key", Diff(cur, want, path), content=want)

    async def apply(self, ctx, ch):
        home = self.p["home"]
        await ctx.conn.run(["install", "-d", "-m", "755", "-o", "root", "-g", "root", "--", home, f"{home}/.ssh"],
                           check=True)
        await ctx.conn.put(ch.data["content"], f"{home}/.ssh/authorized_keys", 0o644, "root")


# ---- nodes: sshd limits for the tunnel user ---------------------------------------------------------
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
_USER_SAFE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def sshd_includes(config_text: str) -> list[str]:
    """Globs of the unconditional `Include` lines (before the first `Match`) of an sshd_config,
    made absolute the way sshd does (relative to /etc/ssh)."""
    globs = []
    for raw in config_text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        key = words[0].lower()
        if key == "match":
            break  # an Include inside a Match block is conditional: not ours to rely on
        if key == "include":
            globs += [w if w.startswith("/") else f"/etc/ssh/{w}" for w in words[1:]]
    return globs


def parse_sshd_T(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and key not in out:
            out[key] = value.strip()
    return out


async def effective_policy_gaps(conn, user: str, address: str, sshd: str) -> list[str]:
    """Settings of SSHD_TUNNEL_POLICY that sshd would not apply to `user` from `address`."""
    res = await conn.run([sshd, "-T", "-C", f"user={user},host=tunnelspec-check,addr={address}"])
    if res.rc != 0:
        return [f"sshd -T failed: {res.stderr.strip()}"]
    got = parse_sshd_T(res.stdout)
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
    args = {"user": Arg(str, required=True), "path": Arg(str, default=SSHD_DROPIN),
            "config": Arg(str, default=SSHD_CONFIG), "sshd": Arg(str, default="/usr/sbin/sshd"),
            "state": Arg(str, default="present", choices=("present", "absent"))}

    def _render(self, ctx) -> bytes:
        user = self.p["user"]
        if not _USER_SAFE.match(user):
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
        res = await ctx.conn.run([self.p["sshd"], "-t"])
        if res.rc != 0:
            problem = f"sshd -t rejects it: {(res.stderr or res.stdout).strip()}"
        else:
            addr, _ = node_ssh_target(ctx.controller.inventory, ctx.host)
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
    args = {"sshd": Arg(str, default="/usr/sbin/sshd")}
    handler_only = True

    async def check(self, ctx):
        return change("reload sshd")

    async def apply(self, ctx, ch):
        res = await ctx.conn.run([self.p["sshd"], "-t"])
        if res.rc != 0:
            raise TaskFailed(f"sshd config invalid, not reloading: {res.stderr.strip()}")
        # Debian/Ubuntu name the unit ssh.service, most others sshd.service.
        for unit in ("ssh.service", "sshd.service"):
            state = await ctx.conn.run(["systemctl", "show", "-p", "LoadState", "--value", unit])
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
    args = {"user": Arg(str, required=True)}
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
        res = await ctx.conn.run(["pgrep", "-u", user, "-x", "sshd"])
        pids = [p for p in res.stdout.split() if p.isdigit()]
        if pids:
            await ctx.conn.run(["kill", "-TERM", "--", *pids])


# ---- main: one unit per node ------------------------------------------------------------------------
@register_task
class TunnelUnits(Task):
    """Install, start and enable `tunnelspec-tunnel-<node>.service` on main (state=started), or
    stop and disable them (state=stopped). A unit whose file changed is restarted."""

    module = "tunnel_units"
    args = {"nodes": Arg((list, str), default="all"), "key": Arg(str, default=KEY_PATH),
            "known_hosts": Arg(str, default=KNOWN_HOSTS), "session": Arg(bool, default=True),
            "state": Arg(str, default="started", choices=("started", "stopped"))}

    def probes(self) -> list[list[str]]:
        return [AES_NI_PROBE]

    async def _aes_ni(self, ctx) -> bool:
        return (await ctx.conn.probe(AES_NI_PROBE)).stdout.strip() == "aes"

    def _parts(self, ctx, node, aes_ni: bool = False):
        cluster = ctx.controller.cluster
        name = unit_name(node.name)
        key_fp = "?"
        pub = ctx.vars.get("tunnel_pubkey")
        if pub:
            key_fp = fingerprint(pub)
        target = node_ssh_target(cluster.inventory, node.name)
        argv = ssh_argv(node, target, node.users.tunnel, self.p["key"], self.p["known_hosts"], self.p["session"],
                        aes_ni)
        unit = SystemdUnit({"name": name, "src": UNIT_TEMPLATE, "content": None, "verify": True, "vars": {
            "node": node.name, "loopback": LOOPBACK, "tunnel_port": node.tunnel_port, "rpc_port": node.rpc_port,
            "tunnel_user": cluster.main.users.tunnel, "ssh_argv": argv, "session": self.p["session"],
            "forced_command": TUNNEL_FORCED_COMMAND, "key_fingerprint": key_fp}})
        want = self.p["state"] == "started"
        svc = Service({"name": name, "state": self.p["state"], "enabled": want})
        return name, unit, svc

    async def check(self, ctx):
        from tunnelspec.tasks.systemd import stale_units

        todo, plan = [], []
        aes_ni = await self._aes_ni(ctx)
        nodes = selected_nodes(ctx.controller.cluster, self.p["nodes"])
        # A run killed between writing a unit and restarting it left the old ssh running.
        stale = await stale_units(ctx.conn, [unit_name(n.name) for n in nodes]) \
            if self.p["state"] == "started" else {}
        for node in nodes:
            name, unit, svc = self._parts(ctx, node, aes_ni)
            u = await unit.check(ctx) if self.p["state"] == "started" else ok("unit kept")
            s = await svc.check(ctx)
            if not u.changed and not s.changed and name in stale:
                u = change(f"restart ({stale[name]})")
            if u.changed or s.changed:
                todo.append(f"{name}: {', '.join(c.msg for c in (u, s) if c.changed)}")
                plan.append((node.name, u.changed, s.changed))
        if not todo:
            return ok(f"tunnels {self.p['state']}")
        return change("; ".join(todo), plan=plan)

    async def apply(self, ctx, ch):
        nodes = {n.name: n for n in ctx.controller.cluster.rpc}
        aes_ni = await self._aes_ni(ctx)
        parts = {n: self._parts(ctx, nodes[n], aes_ni) for n, _, _ in ch.data["plan"]}
        changed_units = []
        for node, unit_changed, _ in ch.data["plan"]:
            name, unit, _ = parts[node]
            if unit_changed:
                await unit.apply(ctx, await unit.check(ctx))
                changed_units.append(name)
        if changed_units:
            await ctx.conn.run(["systemctl", "daemon-reload"], check=True)
        for node, _, _ in ch.data["plan"]:
            name, _, svc = parts[node]
            if name in changed_units and self.p["state"] == "started":
                await ctx.conn.run(["systemctl", "enable", "--quiet", name], check=True)
                res = await ctx.conn.run(["systemctl", "restart", name])
                if res.rc != 0:
                    raise TaskFailed(f"{name} failed to start: {res.stderr.strip()}")
            else:
                await svc.apply(ctx, await svc.check(ctx))


# ---- main: HELLO through each tunnel -------------------------------------------------------------------
async def main_rpc_version(conn, source_dir: str) -> tuple[int, int, int]:
    data = await conn.get(f"{source_dir}/{RPC_HEADER}")
    if data is None:
        raise TaskFailed(f"{source_dir}/{RPC_HEADER} not found on the main host: the tunnel check compares "
                         "each node's RPC version with the main host's source (run the source play)")
    return rpc_proto_version(data.decode(errors="replace"))


async def probe_tunnel(conn, node, deadline_s: float, expected=None, busy_timeout: float = 3.0):
    """HELLO (+ device memory) through `node`'s tunnel, from main's own loopback."""
    return await probe_until(lambda: conn.open_connection(LOOPBACK, node.tunnel_port), deadline_s, expected,
                             busy_timeout)


@register_task
class TunnelProbe(Task):
    """Each tunnel answers HELLO with exactly the main build's RPC protocol version."""

    module = "tunnel_probe"
    read_only = True
    args = {"nodes": Arg((list, str), default="all"), "source_dir": Arg(str, required=True),
            "timeout": Arg((int, float), default=30), "allow_busy": Arg(bool, default=True)}

    async def check(self, ctx):
        from tunnelspec.facts.sockets import clients_of

        expected = await main_rpc_version(ctx.conn, self.p["source_dir"])
        nodes = selected_nodes(ctx.controller.cluster, self.p["nodes"])

        async def one(node):
            # llama-server connected through the tunnel holds the one-client server: busy, no wait.
            if self.p["allow_busy"] and await clients_of(ctx.conn, node.tunnel_port):
                return "busy: serving a client (llama-server)", True
            res = await probe_tunnel(ctx.conn, node, self.p["timeout"], expected)
            return str(res), res.ok or (res.status is ProbeStatus.BUSY and self.p["allow_busy"])

        results = await asyncio.gather(*(one(n) for n in nodes))
        out, bad = [], []
        for node, (text, good) in zip(nodes, results):
            (out if good else bad).append(f"{node.name} via {LOOPBACK}:{node.tunnel_port}: {text}")
        if bad:
            raise TaskFailed(f"tunnel check (expected RPC v{format_version(expected)}): " + "; ".join(bad))
        return ok("; ".join(out))


# ---- `tunnelspec tunnel status` -------------------------------------------------------------------------
async def tunnel_status(inventory_path: str, nodes, connect_options, probe_timeout: float = 3.0) -> list[dict]:
    """Per tunnel: unit state, local port, remote RPC version and device memory (or busy/refused),
    observed over the controller's SSH connection to main. Changes nothing."""
    from tunnelspec.connection import connect
    from tunnelspec.inventory import load_inventory
    from tunnelspec.inventory.cluster import Cluster

    from tunnelspec.facts.sockets import clients_of

    inv = load_inventory(inventory_path)
    cluster = Cluster.from_inventory(inv)
    conn = await connect(cluster.main.name, inv.host_vars(cluster.main.name), connect_options, inv.path.parent)

    async def one(node) -> dict:
        name = unit_name(node.name)
        res = await conn.run(["systemctl", "is-active", name])
        state = res.stdout.strip() or "unknown"
        row = {"node": node.name, "unit": name, "state": state, "local": f"{LOOPBACK}:{node.tunnel_port}",
               "remote": f"{LOOPBACK}:{node.rpc_port}", "rpc": None, "version": None, "devices": []}
        if state != "active":
            return row
        if await clients_of(conn, node.tunnel_port):
            # The normal state under llama-server: it holds the one-client server through this tunnel,
            # so a HELLO would only wait for its timeout. (`tunnelspec status` reads the version from
            # the node's rpc-server log.)
            row["rpc"], row["detail"] = ProbeStatus.BUSY.value, "serving a client (llama-server)"
            return row
        r = await probe_tunnel(conn, node, 0, None, probe_timeout)
        row["rpc"] = r.status.value
        row["version"] = r.version_str if r.version else None
        row["devices"] = [{"free": d.free, "total": d.total} for d in r.devices]
        row["detail"] = r.detail
        return row

    try:
        return list(await asyncio.gather(*(one(n) for n in selected_nodes(cluster, nodes))))
    finally:
        await conn.close()


def format_status(rows: list[dict]) -> str:
    out = [f"{'NODE':<12} {'UNIT':<8} {'LOCAL':<17} {'RPC':<8} {'VERSION':<8} DEVICES"]
    for r in rows:
        devs = ", ".join(f"{d['free'] // 2**20}/{d['total'] // 2**20} MiB free" for d in r["devices"])
        out.append(f"{r['node']:<12} {r['state']:<8} {r['local']:<17} {r['rpc'] or '-':<8} "
                   f"{r['version'] or '-':<8} {devs or r.get('detail') or '-'}")
    return "\n".join(out)
