"""The RPC server on an rpc node: which binary, and the proofs after start — it listens on
loopback only, its port is unreachable on the node's network address, and it answers HELLO
from the node itself.

These checks are read-only (ok or failed, never changed). They poll with a deadline because the
service was (re)started a moment ago by a handler.
"""

from __future__ import annotations

import asyncio

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.sockets import clients_of, established, listening, listening_sockets, on_port
from tunnelspec.llama.rpc import ProbeStatus, poll, probe_until
from tunnelspec.modules.base import Arg, Task, change, ok, register_task, wait_budget
from tunnelspec.modules.systemd import SystemdUnit
from tunnelspec.components.server.death import last_words
from tunnelspec.llama import devices

RPC_SERVER_NAMES = ("ggml-rpc-server", "rpc-server")  # renamed ≈b98xx (PR #25045)
# GPU runtimes and the video/render groups the RPC unit needs for each backend.
BACKEND_GROUPS = {"cpu": [], "metal": [], "cuda": [], "hip": ["video", "render"], "vulkan": ["video", "render"]}


def rpc_argv(binary: str, port: int, devices, threads, cache: bool) -> list[str]:
    """The server's command line: loopback is not a parameter."""
    argv = [binary, "-H", LOOPBACK, "-p", str(int(port))]
    if devices:
        argv += ["-d", ",".join(devices)]
    if threads:
        argv += ["-t", str(int(threads))]
    if cache:
        argv.append("-c")
    return argv


@register_task
class RpcServerBinary(Task):
    """Find the RPC server binary of the active build and register `rpc_server_bin`."""

    module = "rpc_server_binary"
    read_only = True
    args = {
        "root": Arg(str, required=True, help="tunnelspec's directory on the host (its `current/bin`)."),
        "path": Arg(str, help="An explicit binary instead of the build's."),
        "build_bin": Arg(
            dict,
            help="The build play's binaries (`llama_build.bin`), looked at first; unset: this run's `llama_build`.",
        ),
    }

    def _candidates(self, built: dict) -> list[str]:
        if self.p["path"]:
            return [self.p["path"]]
        out = [built[n] for n in RPC_SERVER_NAMES if built.get(n)]
        return out + [f"{self.p['root']}/current/bin/{n}" for n in RPC_SERVER_NAMES]

    def _argv(self, built: dict) -> list[str]:
        script = 'for p; do [ -x "$p" ] && [ -f "$p" ] && { echo "$p"; exit 0; }; done; exit 1'
        return ["sh", "-c", script, "sh", *self._candidates(built)]

    def probes(self) -> list[list[str]]:
        return [self._argv(self.p["build_bin"])] if self.p["build_bin"] is not None else []

    async def check(self, ctx):
        built = self.p["build_bin"]
        if built is None:
            built = (ctx.vars.get("llama_build") or {}).get("bin") or {}
        cands = self._candidates(built)
        res = await ctx.conn.probe(self._argv(built))
        if res.rc != 0:
            raise TaskFailed(
                f"no RPC server binary on {ctx.host} (looked for {', '.join(cands)}); "
                "run the build play first (tunnelspec deploy)"
            )
        path = res.stdout.strip()
        ctx.register("rpc_server_bin", path)
        return ok(path)


@register_task
class RpcListenCheck(Task):
    """The RPC port is bound, and only on 127.0.0.1 (the listening-sockets fact)."""

    module = "rpc_listen_check"
    read_only = True
    args = {
        "port": Arg(int, required=True, help="The RPC port."),
        "timeout": Arg((int, float), default=30, help="Seconds to wait for the listener."),
    }

    def probes(self) -> list[list[str]]:
        return [listening().argv]

    async def check(self, ctx):
        port = self.p["port"]

        async def attempt():
            found = on_port(await listening_sockets(ctx.conn), port)
            return found or None

        found = await poll(wait_budget(ctx, self.p["timeout"]), attempt)
        if not found:
            raise TaskFailed(
                f"nothing listens on port {port} after {self.p['timeout']}s; "
                f"see journalctl -u tunnelspec-rpc on {ctx.host}{await _last_words(ctx.conn)}"
            )
        exposed = [s for s in found if not s.loopback_only]
        if exposed:
            where = ", ".join(f"{s.address}:{s.port}" for s in exposed)
            raise TaskFailed(
                f"port {port} is bound beyond loopback ({where}): the RPC protocol "
                "must only listen on 127.0.0.1; stop it now"
            )
        procs = sorted({f"{n}[{pid}]" for s in found for n, pid in s.processes})
        return ok(f"{LOOPBACK}:{port} only ({', '.join(procs) or 'process unknown'})")


async def connect_refused_from(conn, address: str, port: int, timeout: float = 5.0) -> str | None:
    """Try a TCP connection from `conn`'s host to address:port. None when it failed (good);
    a message when it connected (the port is exposed)."""
    try:
        reader, writer = await asyncio.wait_for(conn.open_connection(address, port), timeout)
    except TimeoutError:
        return None  # dropped by a firewall: unreachable
    except Exception as exc:  # noqa: BLE001 - refused/unreachable in any form is the expected outcome
        import asyncssh  # lazy: slow import (~0.1 s), error path only

        if isinstance(exc, (OSError, asyncssh.ChannelOpenError)):
            return None
        raise
    writer.close()
    return f"connected to {address}:{port}"


@register_task
class RpcUnreachable(Task):
    """From other hosts (default: the main host), the node's network address does not accept
    connections on the RPC port."""

    module = "rpc_unreachable"
    read_only = True
    args = {
        "port": Arg(int, required=True, help="The RPC port."),
        "address": Arg(str, required=True, help="The node's network address."),
        "from_hosts": Arg(list, required=True, help="Hosts to try connecting from (they must all fail)."),
    }

    async def check(self, ctx):
        if self.p["address"].startswith("127."):
            raise TaskFailed(f"{ctx.host}'s address is loopback ({self.p['address']}); cannot prove isolation")
        for other in self.p["from_hosts"]:
            conn = await ctx.connection_to(other)
            got = await connect_refused_from(conn, self.p["address"], self.p["port"])
            if got:
                raise TaskFailed(f"from {other}: {got}: the RPC port is reachable over the network")
        return ok(f"{self.p['address']}:{self.p['port']} unreachable from {', '.join(self.p['from_hosts'])}")


@register_task
class RpcProbe(Task):
    """RPC HELLO from the node itself (over the node's SSH connection to its own loopback);
    registers `rpc_version` ("major.minor.patch")."""

    module = "rpc_probe"
    read_only = True
    args = {
        "port": Arg(int, required=True, help="The RPC port on the node's loopback."),
        "timeout": Arg((int, float), default=30, help="Seconds to keep trying while the server starts."),
        "allow_busy": Arg(bool, default=True, help="A server serving a client (llama-server) counts as up."),
    }

    def probes(self) -> list[list[str]]:
        return [established(self.p["port"]).argv] if self.p["allow_busy"] else []

    async def check(self, ctx):
        if self.p["allow_busy"]:
            # A held server would only make the probe wait out its busy timeout: say so at once.
            if held := await clients_of(ctx.conn, self.p["port"]):
                ctx.register("rpc_version", None)
                return ok(f"busy: serving a client (llama-server) on port {self.p['port']} ({held} connection(s))")
        result = await probe_until(
            lambda: ctx.conn.open_connection(LOOPBACK, self.p["port"]), wait_budget(ctx, self.p["timeout"])
        )
        if result.status is ProbeStatus.BUSY and self.p["allow_busy"]:
            ctx.register("rpc_version", None)
            return ok(f"busy: a client (llama-server) holds the server on port {self.p['port']}")
        if not result.ok:
            raise TaskFailed(f"RPC probe of {LOOPBACK}:{self.p['port']} on {ctx.host}: {result}")
        ctx.register("rpc_version", result.version_str)
        return ok(str(result))


RPC_UNIT = "tunnelspec-rpc.service"


@register_task
class RpcUnit(Task):
    """`tunnelspec-rpc.service` for this node, rendered from templates/tunnelspec-rpc.service.j2
    with the node's settings from the inventory (verified by systemd-analyze before install).
    Notify a daemon-reload and a restart."""

    module = "rpc_unit"
    reads_cluster = True
    args = {
        "binary": Arg(str, required=True, help="The RPC server binary the unit runs."),
    }

    async def _unit(self, ctx):
        node = ctx.require_cluster().node(ctx.host)
        if node.bind != LOOPBACK:  # the cluster model already refuses this; never render it
            raise TaskFailed(f"rpc bind {node.bind!r} is not {LOOPBACK}")
        argv = rpc_argv(self.p["binary"], node.rpc_port, node.devices, node.threads, node.cache)
        groups, missing = await existing_groups(ctx.conn, BACKEND_GROUPS[node.build.backend])
        return SystemdUnit.build(
            {
                "name": RPC_UNIT,
                "src": "tunnelspec-rpc.service.j2",
                "verify": True,
                "vars": {
                    "loopback": LOOPBACK,
                    "rpc_port": node.rpc_port,
                    "rpc_user": node.users.rpc,
                    "cache": node.cache,
                    "backend": node.build.backend,
                    "rpc_argv": argv,
                    "supplementary_groups": groups,
                    "missing_groups": missing,
                    "env": list(node.env),
                },
            }
        )

    def probes(self) -> list[list[str]]:
        # The unit file's state (SystemdUnit's own probe); the groups a GPU backend needs are the
        # node's, which the cluster alone does not name without the host.
        return SystemdUnit.build({"name": RPC_UNIT, "src": "tunnelspec-rpc.service.j2"}).probes()

    async def check(self, ctx):
        return await (await self._unit(ctx)).check(ctx)

    async def apply(self, ctx, ch):
        await (await self._unit(ctx)).apply(ctx, ch)


async def existing_groups(conn, wanted: list[str]) -> tuple[list[str], list[str]]:
    """(the groups of `wanted` that exist on the host, those that do not). A group named in
    SupplementaryGroups= that does not exist stops the unit from starting (status 216/GROUP); a host
    without one has no device nodes owned by it either (`render` comes with udev and a GPU driver, and
    is absent from minimal systems), so it is left out, and the device check after start says whether
    the node serves its GPU."""
    if not wanted:
        return [], []
    res = await conn.probe(["getent", "group", *wanted])
    have = {line.split(":", 1)[0] for line in res.stdout.splitlines()}
    return [g for g in wanted if g in have], [g for g in wanted if g not in have]


async def _last_words(conn, lines: int = 8) -> str:
    """The RPC unit's last journal lines (a server that exits at start says why there: an unknown
    device, a GPU runtime's exception), for a failure message."""
    res = await conn.probe(["journalctl", "--no-pager", "-o", "cat", "-u", RPC_UNIT, "-n", "200"], timeout=30)
    # A server killed by a signal in a restart loop: its own last line (an abort's message) is far
    # above systemd's restart lines, so it is named first.
    said = last_words(res.stdout)
    text = "\n".join([line for line in res.stdout.splitlines() if line.strip()][-lines:])
    return (f"; it died: {said}" if said else "") + (f"; its last lines:\n{text}" if text else "")


# The first lines of a unit's current run (its InvocationID): the RPC server's start banner, before
# the long tail of connection lines. One round trip. Also read by `status`.
START_OF_RUN_SCRIPT = r"""
inv=$(systemctl show -p InvocationID --value "$1")
if [ -n "$inv" ]; then
  journalctl --no-pager -o cat -u "$1" "_SYSTEMD_INVOCATION_ID=$inv" | head -n 200
else
  journalctl --no-pager -o cat -n 500 -u "$1"
fi
"""


def start_of_run_argv(unit: str) -> list[str]:
    return ["sh", "-c", START_OF_RUN_SCRIPT, "sh", unit]


async def start_of_run(conn, unit: str) -> str:
    return (await conn.probe(start_of_run_argv(unit), timeout=60)).stdout


async def _run_as(ctx, user: str, argv: list[str], env=(), timeout: float = 60):
    """argv as the RPC server's user with its groups (the devices it may open are what counts) and the
    unit's rpc_env."""
    envs = [f"{k}={v}" for k, v in env]
    return await ctx.conn.probe(
        [
            "/usr/bin/setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--init-groups",
            "--reset-env",
            *(["/usr/bin/env", *envs] if envs else []),
            *argv,
        ],
        timeout=timeout,
    )


async def node_device_list(ctx, node, binary: str):
    """Every device the node's build finds, as its RPC server user: `-d` with a name no device has
    makes the server print them all and exit before it binds (llama/devices.py)."""
    res = await _run_as(ctx, node.users.rpc, devices.merged_output_argv(devices.list_devices_argv(binary)), node.env)
    return devices.node_devices(res.stdout + "\n" + res.stderr)


@register_task
class RpcRequestedDevices(Task):
    """Before the RPC unit changes: every `rpc_devices` name is a device of this node, so a wrong
    name stops the deploy here, listing the node's devices, instead of a server that exits and
    restarts forever. Nothing to do without rpc_devices (the server's own default choice)."""

    module = "rpc_requested_devices"
    reads_cluster = True
    read_only = True
    args = {"binary": Arg(str, required=True, help="The RPC server binary the unit will run.")}

    async def check(self, ctx):
        node = ctx.require_cluster().node(ctx.host)
        if not node.devices:
            return ok("rpc_devices unset: the server serves every non-CPU device, else the CPU")
        available = await node_device_list(ctx, node, self.p["binary"])
        return ok(devices.check_requested(ctx.host, list(node.devices), available))


@register_task
class RpcServedDevices(Task):
    """After start: the RPC server serves what the node's build and inventory ask for — a node built
    for cuda / hip / vulkan that serves only the CPU (a missing driver, no device permission) is
    refused, naming the node, what it serves and what to check. Read from the server's start banner
    in the unit's journal (this run only); when the journal no longer has it, from the node's device
    list and the server's rule (rpc_devices, else every non-CPU device, else the CPU). Registers
    `rpc_served` (the devices, name/description/memory).

    A server that started before its GPU was usable (a driver installed or fixed since, modules
    loaded late at boot) is restarted once, then checked again: a fixed node heals on the next
    deploy; a node still serving the wrong device is refused."""

    module = "rpc_served_devices"
    reads_cluster = True
    args = {
        "binary": Arg(str, required=True, help="The RPC server binary the unit runs."),
        "timeout": Arg((int, float), default=60, help="Seconds to wait for the banner after a restart."),
        "restart": Arg(
            bool,
            default=True,
            help="Restart a server serving the wrong device once (deploy); false: refuse at once (verify).",
        ),
    }

    def probes(self) -> list[list[str]]:
        # The banner of the current run; the device list only when the journal no longer has it.
        return [start_of_run_argv(RPC_UNIT)]

    async def _served(self, ctx):
        node = ctx.require_cluster().node(ctx.host)
        backend, requested = node.build.backend, list(node.devices)
        log = devices.parse_node_log(await start_of_run(ctx.conn, RPC_UNIT))
        if log.banner is None and log.unknown is None:
            listed = await node_device_list(ctx, node, self.p["binary"])
            served = devices.served_by_rule(listed, requested)
            log = devices.NodeLog(devices.Banner((0, 0, 0), tuple(served)), None, log.hints)
        summary = devices.check_served(ctx.host, backend, requested, log, user=node.users.rpc)
        return summary, log

    async def check(self, ctx):
        try:
            summary, log = await self._served(ctx)
        except devices.DeviceError as e:
            if getattr(self, "_restarted", False) or ctx.check_mode or not self.p["restart"]:
                raise
            return change(f"restart the RPC server once (it may have started before its device was usable): {e}")
        ctx.register("rpc_served", [d.as_fact() for d in log.banner.devices])
        return ok(summary)

    async def apply(self, ctx, ch):
        self._restarted = True
        await ctx.conn.run(["systemctl", "restart", RPC_UNIT], check=True, timeout=120)

        async def banner():
            log = devices.parse_node_log(await start_of_run(ctx.conn, RPC_UNIT))
            return (log.banner or log.unknown) and log

        await poll(wait_budget(ctx, self.p["timeout"]), banner)
