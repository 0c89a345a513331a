"""llama-server on the main host: RPC device discovery, the command line from the build's own --help,
and starting it again after `tunnel open`. (The API key file: components/server/api_key.py; model
files: components/models/files.py; the argv rules and the journal evidence: components/server/args.py; the read-only
verify step: components/server/llama_verify.py, its proof components/server/verify.py.)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re

from tunnelspec.connection.base import read_argv
from tunnelspec.core.constants import DEVICES_CACHE, LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts import units
from tunnelspec.facts.files import NOT_EXECUTABLE, executable_id
from tunnelspec.llama import flags, known_bugs
from tunnelspec.components.server import preflight
from tunnelspec.components.server.args import UNIT, build_server_argv, list_devices_argv, tunnel_unit
from tunnelspec.modules.base import Arg, Task, change, ok, register_task
from tunnelspec.components.server.mtp_draft import check_mtp_draft
from tunnelspec.components.rpc import BACKEND_GROUPS, existing_groups
from tunnelspec.components.front.model import add_serving
from tunnelspec.llama.speculative import spec_support
from tunnelspec.llama.memory_fit import gguf_shape, ram_available
from tunnelspec.llama.split_proof import slot_bytes
from tunnelspec.components.server.fit import gguf_header, header_argv
from tunnelspec.components.models.files import MODELS_DIR
from tunnelspec.llama.versions import RPC_HEADER, format_version
from tunnelspec.components.tunnel.tunnels import main_rpc_version
from tunnelspec.components.front import model as front


def version_argv(binary: str) -> list[str]:
    """`llama-server --version` with its stderr (where it prints the version) on stdout: a batch keeps
    only a probe's stdout."""
    return ["sh", "-c", '"$1" --version 2>&1', "sh", binary]


def _nodes_key(cluster, binary_id: str) -> str:
    """What the device map depends on: the build and, per node in --rpc order, tunnel port and devices."""
    nodes = [(n.name, n.tunnel_port, list(n.devices)) for n in cluster.rpc]
    return hashlib.sha256(json.dumps([binary_id, nodes]).encode()).hexdigest()


async def _binary_id(conn, binary: str) -> str:
    fact = executable_id(binary)
    res = await conn.probe(fact.argv)
    if res.rc == NOT_EXECUTABLE:
        raise TaskFailed(f"{binary} is not an executable on the host (did the build play run?)")
    return fact.parse(res.stdout)


@register_task
class RpcDevices(Task):
    """Map each tunnel port to its RPC device names with the built `llama-server --rpc … --list-devices`.

    The rpc-server serves one client at a time: while llama-server is connected, --list-devices would
    wait forever. So the map is cached on the host, keyed by the binary and the nodes; it is
    (re)discovered only when that key changes, and then llama-server is stopped first (the later
    `service` task starts it again). Registers `rpc_devices` = {port: [names]}."""

    module = "rpc_devices"
    reads_cluster = True
    args = {
        "binary": Arg(str, required=True, help="The built llama-server on main."),
        "cache": Arg(str, default=DEVICES_CACHE, help="The device map cached on main."),
        "timeout": Arg(int, default=60, help="Seconds `--list-devices` may take."),
        "service": Arg(str, default=UNIT, help="The llama-server unit stopped before discovery."),
        "discover": Arg(
            bool, default=True, help="Allowed to (re)discover; false: fail when the cached map is not current."
        ),
        "user": Arg(
            str,
            default="",
            help="Runs the listing as this user (llama-server's), never as root: it speaks RPC to the nodes.",
        ),
    }

    def probes(self) -> list[list[str]]:
        return [executable_id(self.p["binary"]).argv, read_argv(self.p["cache"])]

    async def check(self, ctx):
        cluster = ctx.require_cluster()
        key = _nodes_key(cluster, await _binary_id(ctx.conn, self.p["binary"]))
        raw = await ctx.conn.get(self.p["cache"])
        try:
            cached = json.loads(raw) if raw else None
        except ValueError:
            cached = None
        if cached and cached.get("key") == key:
            by_port = {int(p): names for p, names in cached["devices"].items()}
            ctx.register("rpc_devices", by_port)
            return ok("devices " + ", ".join(f"{LOOPBACK}:{p}→{','.join(n)}" for p, n in sorted(by_port.items())))
        if not self.p["discover"]:
            raise TaskFailed(
                f"no current RPC device map in {self.p['cache']} (build or nodes changed since "
                "the last deploy): run `tunnelspec deploy` first"
            )
        if ctx.check_mode:
            # Not discovered yet: predict the modern naming (RPC<i> in --rpc order, one device each)
            # so --check can still render the unit.
            ctx.register("rpc_devices", {n.tunnel_port: [f"RPC{i}"] for i, n in enumerate(cluster.rpc)})
        return change("discover RPC devices (llama-server is stopped for it)", key=key)

    async def apply(self, ctx, ch):
        cluster = ctx.require_cluster()
        await ctx.conn.run(["systemctl", "stop", self.p["service"]])
        argv = [
            "timeout",
            "--kill-after=5",
            str(self.p["timeout"]),
            *list_devices_argv(self.p["binary"], cluster.rpc_endpoints),
        ]
        if self.p["user"]:
            # A node's rpc-server could attack its client: the client is llama-server's user, as when serving.
            u = self.p["user"]
            argv = ["/usr/bin/setpriv", f"--reuid={u}", f"--regid={u}", "--init-groups", "--", *argv]
        res = await ctx.conn.run(argv, timeout=self.p["timeout"] + 15)
        out = res.stdout + res.stderr
        if res.rc == 124:
            raise TaskFailed(
                f"llama-server --list-devices timed out after {self.p['timeout']}s: an rpc-server "
                "serves one client at a time; is another client connected to it?"
            )
        by_port = flags.rpc_devices_by_port(flags.parse_list_devices(out))
        missing = [n for n in cluster.rpc if n.tunnel_port not in by_port]
        if res.rc != 0 or missing:
            tail = "\n".join(out.strip().splitlines()[-12:])
            names = ", ".join(f"{n.name} ({LOOPBACK}:{n.tunnel_port})" for n in missing) or "-"
            raise TaskFailed(f"RPC device discovery failed (rc={res.rc}; no device for {names}):\n{tail}")
        doc = {"key": ch.data["key"], "devices": {str(p): n for p, n in sorted(by_port.items())}}
        await ctx.conn.run(["install", "-d", "-m", "755", "--", os.path.dirname(self.p["cache"])], check=True)
        await ctx.conn.put(json.dumps(doc, indent=1, sort_keys=True) + "\n", self.p["cache"], 0o644)


@register_task
class LlamaServerPlan(Task):
    """Read-only: parse the built llama-server's --version and --help, and register `llama_server`,
    the command line (spellings this build accepts, options it lacks refused by name) and the unit
    template's variables."""

    module = "llama_server_plan"
    reads_cluster = True
    read_only = True
    args = {
        "binary": Arg(str, required=True, help="The built llama-server on main."),
        "model": Arg(str, required=True, help="The target model's path on main."),
        "draft_model": Arg(
            str, default="", help="The draft model's path on main; empty: no draft (a target split with no draft)."
        ),
        "rpc_wait_timeout": Arg(
            int, default=90, help="Seconds llama-server's launcher waits for the nodes with target layers."
        ),
    }

    def cluster_probes(self, cluster) -> list[list[str]]:
        """What check reads before anything it reads decides more (the MTP draft's headers, a header
        read again larger): the build's --version and --help, the target's header (proportions
        given), main's RPC header, the groups the backend needs, MemAvailable (a split's modes)."""
        binary = self.p["binary"]
        out = [version_argv(binary), [binary, "--help"]]
        if cluster is None:
            return out
        if cluster.placement.weights is not None:
            out.append(header_argv(self.p["model"]))
        out.append(read_argv(f"{cluster.main.root}/src/llama.cpp/{RPC_HEADER}"))
        if groups := BACKEND_GROUPS[cluster.main.build.backend]:
            out.append(["getent", "group", *groups])
        return [*out, *([read_argv("/proc/meminfo")] if front.split_candidates(cluster) else [])]

    async def check(self, ctx):
        cluster = ctx.require_cluster()
        conn, binary = ctx.conn, self.p["binary"]
        # Both are read-only and each loads the whole binary: run them side by side.
        ver, helped = await asyncio.gather(
            conn.probe(version_argv(binary), timeout=60), conn.probe([binary, "--help"], timeout=60)
        )
        try:
            label = flags.parse_version(ver.stdout + ver.stderr).label
        except TaskFailed:
            label = f"{binary} (version unknown)"
        if helped.rc != 0 or "--rpc" not in helped.stdout:
            raise TaskFailed(f"{binary} --help failed or shows no --rpc (built without GGML_RPC?)")
        help_ = flags.parse_help(helped.stdout, build=label)
        # The controller keeps this build's --help: the next deploy of the same source checks the
        # inventory's llama-server settings against it before touching any host (components/server/preflight.py).
        preflight.save_record(cluster, label, helped.stdout)
        by_port = ctx.vars.get("rpc_devices")
        if not by_port:
            raise TaskFailed("no RPC device map: the rpc_devices task must run first")
        # The target's block count: -ngl for a CPU share of main, and the layers each device should
        # hold (verify compares them with the load lines); read only when proportions are given.
        target = await target_header(conn, self.p["model"]) if cluster.placement.weights is not None else None
        n_layer, slots = layout_of(target)
        plan = build_server_argv(
            cluster,
            help_,
            {int(k): v for k, v in by_port.items()},
            binary,
            self.p["model"],
            self.p["draft_model"] or None,
            n_layer=n_layer,
        )
        # draft-mtp: a draft file that is no MTP head of this target makes llama-server exit or abort at
        # every start: refused here, before the unit (components/server/mtp_draft.py).
        mtp_notes = (
            await check_mtp_draft(conn, self.p["model"], self.p["draft_model"], label)
            if plan.spec_type == "draft-mtp" and self.p["draft_model"]
            else []
        )
        # Exact major.minor.patch of main's own tree: llama-server aborts on another major or a newer
        # minor and silently computes wrong results on another patch (ops renumbered), so its launcher
        # never starts it against a node of another build (e.g. mid-upgrade; the modes file's `expect`).
        proto = await _main_proto(ctx, cluster)
        fact = plan.as_fact()
        fact["slot_bytes"] = slots if slots and len(slots) == (n_layer or 0) + 1 else None
        fact["build"] = label
        fact["rpc_proto"] = proto
        fact["unit"] = {
            "exec_start": fact["exec_start"],
            "rpc_wait_timeout": self.p["rpc_wait_timeout"],
            "llama_user": cluster.main.users.llama,
            "tunnel_units": [tunnel_unit(n.name) for n in cluster.rpc],
            "draft_node": plan.draft_node,
            "draft_devices": plan.draft_devices,
            "target_devices": plan.target_devices,
            "backend": cluster.main.build.backend,
            "public_bind": cluster.main.public_bind,
            "tls": cluster.main.tls is not None,
        }
        # GPU device nodes are group-owned (hip, vulkan: video, render); groups the host lacks are
        # left out, as in the RPC unit (a missing group stops a unit from starting).
        groups, missing = await existing_groups(conn, BACKEND_GROUPS[cluster.main.build.backend])
        fact["unit"].update(supplementary_groups=groups, missing_groups=missing)

        add_serving(
            fact,
            cluster,
            lambda absent: build_server_argv(
                cluster,
                help_,
                {int(k): v for k, v in by_port.items()},
                binary,
                self.p["model"],
                None,
                absent=absent,
                n_layer=n_layer,
            ),
            proto,
            self.p["rpc_wait_timeout"],
            fits=await _split_fits(ctx, cluster, target),
        )
        ctx.register("llama_server", fact)

        if plan.draft_node is None:
            return ok(f"{label}: {describe_split(plan)}{_split_note(fact)}{_known_bug_note(cluster, help_, label)}")
        return ok(
            f"{label} (draft types: {spec_support(help_).describe()}): {plan.spec_type} draft on "
            f"{plan.draft_node} ({','.join(plan.draft_devices)}), -dev {plan.target_devices}"
            f"{_known_bug_note(cluster, help_, label)}{''.join(f'; WARNING {w}' for w in mtp_notes)}"
        )


def _split_note(fact: dict) -> str:
    """`; split-degraded without rpc-a; rpc-b: waits (does not fit: …)` — which target node's loss the
    rest absorbs (docs/degraded.md)."""
    notes = fact.get("split_fit") or {}
    if not notes:
        return ""
    offered = sorted(fact.get("without") or {})
    rest = [f"{n}: waits ({why[:160]})" for n, why in sorted(notes.items()) if n not in offered]
    return "; " + "; ".join(([f"split-degraded without {', '.join(offered)}"] if offered else []) + rest)


async def _split_fits(ctx, cluster, target: tuple[int, bytes] | None):
    """fits(node) for add_serving: can the remaining devices hold the target without that target node
    (docs/degraded.md, split-degraded)? From the target's size and shape (its header on main, as the
    plan read it: `target_header`), each node's served device memory as this run read it
    (`rpc_served`) and main's MemAvailable. None when no target node could be left out (a draft, no
    proportions)."""
    if not front.split_candidates(cluster):
        return None
    size, shape = 0, None  # unknown: the mode is not offered
    if target is not None:
        try:
            size, shape = target[0], gguf_shape(target[1])
        except Exception:  # noqa: BLE001 - a malformed header: the size alone is no figure to trust
            size, shape = 0, None
    hostvars = ctx.vars.get("hostvars", {})
    served = {n.name: (hostvars.get(n.name) or {}).get("rpc_served") for n in cluster.rpc}
    try:
        main_mem = ram_available(((await ctx.conn.get("/proc/meminfo")) or b"").decode())
    except (OSError, ValueError, TaskFailed):
        main_mem = None
    return lambda node: front.split_fits(cluster, node, size, shape, {k: v for k, v in served.items() if v}, main_mem)


def describe_split(plan) -> str:
    """`split, no draft: -dev RPC0,RPC1 -ts 1,3 -ngl 8; layers CPU 4, RPC0 2, RPC1 6`."""
    out = f"split, no draft: -dev {plan.target_devices}"
    if plan.tensor_split:
        out += " -ts " + ",".join(f"{w:g}" for _, w in plan.tensor_split)
    if plan.gpu_layers is not None:
        out += f" -ngl {plan.gpu_layers}"
    if plan.layers:
        out += "; layers " + ", ".join(f"{d} {n}" for d, n in plan.layers)
    return out


async def target_header(conn, model: str) -> tuple[int, bytes] | None:
    """(size, first bytes) of the target GGUF on main, enough for its tensor infos; None when
    unreadable. `model` may be the inventory's own path (the verify playbook has no upload fact): a
    file not on main is looked for where model_file puts uploads."""
    for path in dict.fromkeys([model, f"{MODELS_DIR}/{model.rstrip('/').rsplit('/', 1)[-1]}"]):
        size, header, note = await gguf_header(conn, path, lambda h, n: slot_bytes(h, n) is not None)
        if not note and size:
            return size, header
    return None


def layout_of(target: tuple[int, bytes] | None) -> tuple[int | None, list[int] | None]:
    """The target's block count and the bytes of each layer slot (llama/split_proof.py) from its
    header; (None, None) when unreadable."""
    if target is None:
        return None, None
    size, header = target
    try:
        return gguf_shape(header).n_layer, slot_bytes(header, size)
    except (ValueError, IndexError, KeyError):
        return None, None


async def _main_proto(ctx, cluster) -> str | None:
    try:
        return format_version(await main_rpc_version(ctx.conn, f"{cluster.main.root}/src/llama.cpp"))
    except TaskFailed:
        if not ctx.check_mode:
            raise
        return None  # --check before the first source checkout: nothing to compare yet


def _known_bug_note(cluster, help_, label: str) -> str:
    """Plan-time warnings for build bugs the inventory's settings would trip (llama/known_bugs.py)."""
    np_opt = help_.pick("-np", "--parallel")
    np_default = None
    if np_opt and (m := re.search(r"\(default:\s*(-?\d+)", help_.option(np_opt).help)):
        np_default = float(m.group(1))
    warnings = known_bugs.draft_n_max_warnings(
        cluster.main.spec_draft_n_max, known_bugs.n_parallel(list(cluster.main.extra_args), np_default), label
    )
    return "".join(f"; WARNING {w}" for w in warnings)


@register_task
class LlamaServerResume(Task):
    """`tunnel open` after `tunnel close`: the llama-server unit is PartOf= its tunnels, so closing one
    stopped it, and nothing starts it again. Started here when deploy installed it, it is enabled
    (enabled means "should run"; `systemctl disable` keeps it down), it is not running, and every
    tunnel it wants is active — with a node left closed (`tunnel open --limit`), starting it would
    pull that tunnel up through Wants=, against the user's close."""

    module = "llama_server_resume"
    args = {}

    async def _state(self, ctx) -> tuple[str, list[str]]:
        props = await units.show(ctx.conn, UNIT, ["LoadState", "UnitFileState", "ActiveState", "Wants"])
        if props.get("LoadState") != "loaded":
            return "absent", []
        if props.get("UnitFileState") != "enabled":
            return "disabled", []
        if props.get("ActiveState") in ("active", "activating", "reloading"):
            return "running", []
        tunnels = sorted(u for u in props.get("Wants", "").split() if u.startswith("tunnelspec-tunnel-"))
        if not tunnels:
            return "stopped", []
        states = await units.unit_values(ctx.conn, "ActiveState", tunnels)
        # An older systemd's layout may give fewer values (facts/units.py): those units are not listed.
        return "stopped", [u for u, st in zip(tunnels, states, strict=False) if st != "active"]

    async def check(self, ctx):
        state, closed = await self._state(ctx)
        if state == "absent":
            return ok("llama-server is not deployed here")
        if state == "disabled":
            return ok("llama-server unit is disabled: left stopped")
        if state == "running":
            return ok("llama-server running")
        if closed:
            return ok(f"llama-server stays stopped: its tunnel(s) {', '.join(closed)} are closed")
        return change("start llama-server (it stopped with its tunnels)")

    async def apply(self, ctx, ch):
        await ctx.conn.run(["systemctl", "start", UNIT], check=True, timeout=300)
