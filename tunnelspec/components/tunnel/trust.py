"""Tunnel trust: the main host's tunnel-only key, the nodes' host keys pinned on main, and the
restricted authorized_keys line on each node."""

from __future__ import annotations

import base64
import ipaddress
import struct

from tunnelspec.connection.base import read_argv
from tunnelspec.core.errors import ArgumentError, TaskFailed
from tunnelspec.components.tunnel.keypair import (
    TUNNEL_FORCED_COMMAND,
    authorized_keys_line,
    fingerprint,
    generate_ed25519,
    known_hosts_line,
    tunnel_key_options,
)
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.components.tunnel.units import KEY_PATH, KNOWN_HOSTS, NODE_HOME, node_ssh_target, selected_nodes


# ---- main: the tunnel key ---------------------------------------------------------------------
# What --check shows for a tunnel key that the run would generate (never written anywhere): a
# well-formed ed25519 public key of 32 zero bytes, so every later step can parse it as a key.
PLANNED_KEY = base64.b64encode(struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(32)).decode()


@register_task
class TunnelPubkey(Task):
    """Read-only: the public half of main's tunnel key (`tunnel_pubkey`), derived on main, for a
    rollback's key lines on the nodes. No key yet (a deploy that failed before making one): nothing
    registered, and the nodes' key lines stay as they are."""

    module = "tunnel_pubkey"
    read_only = True
    args = {
        "path": Arg(str, default=KEY_PATH, help="The private key on main."),
        "comment": Arg(str, default="tunnelspec-tunnel", help="The key's comment."),
    }

    def probes(self) -> list[list[str]]:
        return [["ssh-keygen", "-y", "-f", self.p["path"]]]

    async def check(self, ctx):
        res = await ctx.conn.probe(["ssh-keygen", "-y", "-f", self.p["path"]])
        pub = res.stdout.strip() if res.rc == 0 and res.stdout.startswith("ssh-ed25519 ") else None
        if pub is None:
            return ok("no tunnel key on main: the nodes' key lines stay as they are")
        ctx.register("tunnel_pubkey", f"{pub} {self.p['comment']}")
        return ok(f"tunnel key {fingerprint(pub)}")


@register_task
class TunnelKeypair(Task):
    """A tunnel-only ed25519 key on main, generated on the controller in memory and written only
    there (0600, owned by the tunnel user). `rotation`: a token; a new token replaces the key once.
    Registers `tunnel_pubkey`."""

    module = "tunnel_keypair"
    args = {
        "path": Arg(str, default=KEY_PATH, help="The private key on main."),
        "owner": Arg(str, required=True, help="The user the key belongs to (the tunnel user on main)."),
        "rotation": Arg(str, default="", help="A token: a new value replaces the key once (`keys rotate`)."),
        "comment": Arg(str, default="tunnelspec-tunnel", help="The key's comment."),
    }

    def probes(self) -> list[list[str]]:
        return [self._public_argv(), read_argv(self.p["path"] + ".rotation"), self._meta_argv()]

    def _public_argv(self) -> list[str]:
        return ["ssh-keygen", "-y", "-f", self.p["path"]]

    def _meta_argv(self) -> list[str]:
        return ["stat", "-c", "%a %U", "--", self.p["path"]]

    async def _current(self, ctx) -> tuple[str | None, str]:
        # The public half is derived on main (ssh-keygen -y), so the private key never travels back.
        res = await ctx.conn.probe(self._public_argv())
        pub = res.stdout.strip() if res.rc == 0 and res.stdout.startswith("ssh-ed25519 ") else None
        token = (await ctx.conn.get(self.p["path"] + ".rotation") or b"").decode().strip()
        return pub, token

    async def check(self, ctx):
        pub, token = await self._current(ctx)
        meta = await ctx.conn.probe(self._meta_argv())
        if pub is None or (self.p["rotation"] and token != self.p["rotation"]):
            if ctx.check_mode:
                # --check: the steps that install this key on the nodes are planned too, with a
                # stand-in for the key the run would generate (it exists only after the apply).
                ctx.register("tunnel_pubkey", f"ssh-ed25519 {PLANNED_KEY} {self.p['comment']}")
            if pub is None:
                return change(f"generate tunnel key {self.p['path']}")
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
    key = conn.server_host_key()
    if key is None:
        raise TaskFailed(
            f"{conn.name}: no verified SSH host key (not an SSH connection?); "
            "its host key cannot be pinned from the controller"
        )
    return key


@register_task
class KnownHostsPin(Task):
    """known_hosts on main with each rpc node's host key as the controller verified it."""

    module = "known_hosts_pin"
    reads_cluster = True
    args = {
        "path": Arg(str, default=KNOWN_HOSTS, help="The known_hosts file on main the tunnels trust."),
        "nodes": Arg(
            (list, str),
            default="all",
            help="Kept for compatibility: every rpc node's key is always pinned (one file for all tunnels).",
        ),
    }

    async def _content(self, ctx) -> str:
        lines = []
        cluster = ctx.require_cluster()
        for node in selected_nodes(cluster, []):  # every node: one file for all tunnels
            conn = await ctx.connection_to(node.name)
            addr, port = node_ssh_target(cluster.inventory, node.name)
            lines.append(known_hosts_line(addr, port, verified_host_key(conn)))
        return "\n".join(lines) + "\n"

    def probes(self) -> list[list[str]]:
        return [read_argv(self.p["path"])]

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
def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def route_argv(node_address: str) -> list[str]:
    """What main runs to learn the source address its routing picks for a node."""
    return ["ip", "-o", "route", "get", node_address]


async def source_address(ctx, node_address: str) -> str | None:
    """Main's address as the node sees it: the source main's routing picks for the node's IP.
    None when the node is addressed by name (no DNS from here) or main cannot tell."""
    try:
        ipaddress.ip_address(node_address)
    except ValueError:
        return None
    conn = await ctx.connection_to(ctx.require_cluster().main.name)
    res = await conn.probe(route_argv(node_address))
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
    reads_cluster = True
    args = {
        "user": Arg(str, required=True, help="The tunnel user on the node."),
        "pubkey": Arg(str, required=True, help="Main's tunnel public key (`tunnel_pubkey`)."),
        "rpc_port": Arg(int, required=True, help="The only port the key may forward to (on the node's loopback)."),
        "from_address": Arg(str, help="Where the key may be used from; default: main's address as the node sees it."),
        "home": Arg(str, default=NODE_HOME, help="The tunnel user's root-owned home."),
    }

    async def _line(self, ctx) -> str:
        frm = self.p["from_address"]
        if not frm:
            addr, _ = node_ssh_target(ctx.require_cluster().inventory, ctx.host)
            frm = await source_address(ctx, addr)
            if not frm:
                # Never a line without from=: the stolen key would then work from anywhere.
                why = (
                    f"it is addressed by name ({addr})"
                    if not _is_ip(addr)
                    else f"`ip route get {addr}` on main names no source address"
                )
                raise TaskFailed(
                    f"{ctx.host}: the tunnel key's from= (main's address as {ctx.host} sees it) cannot "
                    f"be computed: {why}. Set tunnel_from=<that IP address> for {ctx.host} in the inventory"
                )
        try:
            opts = tunnel_key_options(self.p["rpc_port"], frm, TUNNEL_FORCED_COMMAND)
            return authorized_keys_line(self.p["pubkey"], opts, "tunnelspec-tunnel") + "\n"
        except ValueError as e:  # a port, address or key the line cannot carry: the arguments' fault
            raise ArgumentError(str(e)) from None

    @property
    def _path(self) -> str:
        return f"{self.p['home']}/.ssh/authorized_keys"

    def _meta_argv(self) -> list[str]:
        return ["stat", "-c", "%a %U", "--", self._path]

    def probes(self) -> list[list[str]]:
        return [read_argv(self._path), self._meta_argv()]

    def remote_probes(self, cluster, host: str) -> dict[str, list[list[str]]]:
        # Main's `ip route get` (from_address unset), read on main's connection (`source_address`).
        if self.p["from_address"] or cluster is None:
            return {}
        addr, _ = node_ssh_target(cluster.inventory, host)
        return {cluster.main.name: [route_argv(addr)]} if _is_ip(addr) else {}

    async def check(self, ctx):
        path = self._path
        want = await self._line(ctx)
        cur = (await ctx.conn.get(path) or b"").decode()
        meta = await ctx.conn.probe(self._meta_argv())
        if cur == want and meta.stdout.split() == ["644", "root"]:
            return ok("restricted tunnel key present")
        return change("install restricted tunnel key", Diff(cur, want, path), content=want)

    async def apply(self, ctx, ch):
        home = self.p["home"]
        await ctx.conn.run(
            ["install", "-d", "-m", "755", "-o", "root", "-g", "root", "--", home, f"{home}/.ssh"], check=True
        )
        await ctx.conn.put(ch.data["content"], f"{home}/.ssh/authorized_keys", 0o644, "root")
