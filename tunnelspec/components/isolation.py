"""Loopback isolation: only the one user that needs a guarded loopback port may connect to it.

On an rpc node the guarded port is the rpc-server's (only the tunnel user's sshd session, which
carries main's forward, may connect); on main the guarded ports are the tunnels' local ends (only
llama-server's user, and its rpc-wait helper running as that user). root always passes: it runs
tunnelspec's own probes, and could change any rule anyway. The rules live in nftables table
`inet tunnelspec` (facts/nft.py has them as data), loaded from a file by a oneshot unit ordered
before, and required by, the units it guards — so they are in place at boot before those units
accept a connection, and those units do not start when the rules cannot be loaded.

Fail closed: where nftables cannot work (no CAP_NET_ADMIN in a container, no nf_tables in the
kernel), the host stops with the reason, unless the inventory sets `rpc_local_isolation=false`;
then every run warns.

What it needs of the host and its files there (the unit, the include line in /etc/nftables.conf):
isolation_host.py; the read-only
tasks around this one (the preflight, the verify step, listeners_guarded): isolation_checks.py.
"""

from __future__ import annotations

import re
import shlex

from tunnelspec.components.isolation_host import (
    APT_INSTALL,
    OPT_OUT,
    CONF_DROP,
    CONF_INCLUDE,
    CONF_MARK,
    NFT_CONF,
    cap_reason,
    kernel_check,
    opted_in,
    unit_text,
    warning,
)
from tunnelspec.connection.base import read_argv
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts import nft, port_owners
from tunnelspec.reporting import events
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task

_UNIT_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


GUARDS_ARG = Arg(
    dict,
    default=None,
    help="Everything else at once, as cluster/ports.py derives it for this host from the registry of "
    "listeners (`cluster.guards(inventory_hostname)`): how the playbooks call it.",
)


def expand_guards(params: dict) -> dict:
    """`guards` (the registry's view of one host) spread into the task's own arguments; an argument
    given beside it wins."""
    guards = params.get("guards")
    if not isinstance(guards, dict):
        return params
    return {**{k: v for k, v in guards.items() if k != "what"}, **{k: v for k, v in params.items() if k != "guards"}}


@register_task
class LocalIsolation(Task):
    """The rules file, the unit, and the live table (state present), or none of them (absent).

    `ports`: the guarded loopback ports; `users`: who may connect besides root; `guarded`: the
    units that must not run without the rules; `label`: what status and verify print."""

    module = "local_isolation"
    args = {
        "ports": Arg(list, default=[], help="Loopback TCP ports to guard."),
        "users": Arg(list, default=[], help="Users (names) that may connect besides root; uids resolved on the host."),
        "guarded": Arg(list, default=[], help="Units ordered after, and requiring, the rules unit."),
        "guarded_tunnels": Arg(
            list, default=[], help="rpc node names: main's tunnelspec-tunnel-<node>.service units, guarded too."
        ),
        "more": Arg(
            list,
            default=[],
            help="More guarded ports with their own users: a list of {ports, users} (main: llama-server's "
            "own port, for the front's user only).",
        ),
        "listeners": Arg(
            list,
            default=[],
            help="Who may listen (answer connections) on guarded ports besides root: a list of "
            "{ports, users}, each the port's own service user (none: only root).",
        ),
        "label": Arg(str, default="guarded ports", help="What status and verify print when the rules are in place."),
        "enabled": Arg(
            (str, bool),
            default=True,
            help="The inventory's rpc_local_isolation: false removes tunnelspec's rules and warns.",
        ),
        "state": Arg(
            str,
            default="present",
            choices=("present", "absent"),
            help="absent: table, unit, links and file removed (teardown).",
        ),
        "install": Arg(bool, default=True, help="Install Debian's nftables package where /usr/sbin/nft is missing."),
        "guards": GUARDS_ARG,
    }

    @classmethod
    def validate(cls, params: dict) -> dict:
        return super().validate(expand_guards(params))

    def _want_present(self) -> bool:
        return self.p["state"] == "present" and opted_in(self.p["enabled"])

    def _guarded(self) -> list[str]:
        """The units that require the rules: `guarded`, plus main's tunnel unit of each node in
        `guarded_tunnels` (named as components/tunnel/tunnels.py names them)."""
        units = [str(u) for u in self.p["guarded"]]
        for node in self.p["guarded_tunnels"]:
            if not _UNIT_SAFE.match(str(node)):
                raise TaskFailed(f"rpc node name {node!r} cannot be part of a unit name")
            units.append(f"tunnelspec-tunnel-{node}.service")
        return units

    def _links_wanted(self) -> set[str]:
        return {
            f"/etc/systemd/system/multi-user.target.wants/{nft.UNIT}",
            *(f"/etc/systemd/system/{u}.requires/{nft.UNIT}" for u in self._guarded()),
        }

    def groups(self) -> list[tuple[list[int], list[str]]]:
        """(ports, users) of every guard: the main one, then `more`."""
        out = [([int(p) for p in self.p["ports"]], [str(u) for u in self.p["users"]])]
        for g in self.p["more"]:
            if not isinstance(g, dict) or set(g) != {"ports", "users"}:
                raise TaskFailed(f"more: each entry is {{ports, users}}, got {g!r}")
            out.append(([int(p) for p in g["ports"]], [str(u) for u in g["users"]]))
        return out

    def listen_groups(self) -> list[tuple[list[int], list[str]]]:
        out = []
        for g in self.p["listeners"]:
            if not isinstance(g, dict) or set(g) != {"ports", "users"}:
                raise TaskFailed(f"listeners: each entry is {{ports, users}}, got {g!r}")
            out.append(([int(p) for p in g["ports"]], [str(u) for u in g["users"]]))
        return out

    def all_users(self) -> list[str]:
        return list(dict.fromkeys(u for _, users in self.groups() + self.listen_groups() for u in users))

    def _desired(self, seen: nft.HostIsolation) -> tuple[tuple, str, str]:
        missing = [u for u, uid in seen.uids.items() if uid is None]
        if missing:
            raise TaskFailed(f"{', '.join(missing)}: no such user (create it before the isolation rules)")
        lines = [f"Managed by tunnelspec: {self.p['label']}."]
        for ports, users in self.groups():
            lines.append(
                f"Only root and {', '.join(f'{u} (uid {seen.uids[u]})' for u in users) or 'nobody else'} "
                f"may connect to loopback port(s) {', '.join(str(p) for p in sorted(set(ports)))}."
            )
        for ports, users in self.listen_groups():
            lines.append(
                f"Only root and {', '.join(f'{u} (uid {seen.uids[u]})' for u in users) or 'nobody else'} "
                f"may listen on loopback port(s) {', '.join(str(p) for p in sorted(set(ports)))}."
            )
        rules = self.rules(seen.uids)
        return rules, nft.ruleset_text(rules, "\n".join(lines)), unit_text(self.p["label"], self._guarded())

    def rules(self, uids: dict) -> tuple:
        """The connect and listen guards, ordered, for the uids resolved on the host (a user without one
        is left out: `status` reports such a table as changed, deploy refuses before)."""
        rules: tuple = ()
        for ports, users in self.groups():
            rules += nft.rules_for(ports, [uids[u] for u in users if uids.get(u) is not None], self.p["label"])
        for ports, users in self.listen_groups():
            rules += nft.listen_rules_for(ports, [uids[u] for u in users if uids.get(u) is not None], self.p["label"])
        return nft.ordered(rules)

    async def refuse_squatters(self, ctx, seen: nft.HostIsolation) -> None:
        """A guarded port held by anyone but its service's user (or root) stops the run, naming what
        holds it: deploying through it would hand the squatter the tunnel's, the front's or
        llama-server's traffic the moment the rules are gone, and shows someone is trying."""
        allowed: dict[int, set[int]] = {}
        for ports, users in self.listen_groups():
            for port in ports:
                allowed.setdefault(port, set()).update(uid for u in users if (uid := seen.uids.get(u)) is not None)
        if not allowed:
            return
        bad = port_owners.squatters(await port_owners.observe(ctx.conn), allowed)
        if bad:
            raise TaskFailed(
                f"{ctx.host}: guarded port(s) taken by another user: "
                + "; ".join(f"port {b.port}: {b.describe()}" for b in bad)
                + ". Only root and the port's own service user may listen there: stop that process "
                "(and find out who started it), then deploy again"
            )

    def probes(self) -> list[list[str]]:
        owners = [port_owners.listeners().argv] if self.p["state"] == "present" and self.p["listeners"] else []
        if not self._want_present():
            return [*nft.probes(self.all_users()), *owners]
        return [
            *nft.probes(self.all_users()),
            read_argv(nft.RULES_PATH),
            read_argv(nft.UNIT_PATH),
            read_argv(NFT_CONF),
            *owners,
        ]

    async def check(self, ctx):
        seen = await nft.observe(ctx.conn, self.all_users())
        if not self._want_present():
            if self.p["state"] == "present":  # opted out: still no deploy through a squatter
                await self.refuse_squatters(ctx, seen)
            return await self._check_absent(ctx, seen)
        if not seen.net_admin:
            raise TaskFailed(cap_reason(ctx.host))
        await self.refuse_squatters(ctx, seen)
        rules, text, unit = self._desired(seen)
        cur_file = (await ctx.conn.get(nft.RULES_PATH) or b"").decode()
        cur_unit = (await ctx.conn.get(nft.UNIT_PATH) or b"").decode()
        todo = []
        if not seen.nft:
            todo.append("install nftables")
        if cur_file != text:
            todo.append(f"write {nft.RULES_PATH}")
        if cur_unit != unit:
            todo.append(f"write {nft.UNIT}")
        if set(seen.links) != self._links_wanted():
            todo.append("enable the unit (before and required by " + (", ".join(self._guarded()) or "nothing") + ")")
        if seen.table_error:
            todo.append(f"load rules (nft: {seen.table_error})")
        elif not nft.matches(seen.table, rules):
            todo.append(
                "load rules (live: "
                + (
                    nft.describe(seen.table.rules) + (f", {seen.table.foreign} foreign" if seen.table.foreign else "")
                    if seen.table.present
                    else "no table"
                )
                + ")"
            )
        if seen.active != "active":
            todo.append(f"start {nft.UNIT} ({seen.active or 'inactive'})")
        conf = await ctx.conn.get(NFT_CONF)
        include = conf is not None and CONF_INCLUDE not in conf.decode(errors="replace").splitlines()
        if include:
            todo.append(f"include the rules in {NFT_CONF}")
        if not todo:
            return ok(f"{self.p['label']} ({nft.describe(rules)})")
        diff = (
            Diff(cur_file, text, nft.RULES_PATH)
            if cur_file != text
            else Diff(cur_unit, unit, nft.UNIT_PATH)
            if cur_unit != unit
            else Diff(
                nft.describe(seen.table.rules) + "\n", nft.describe(rules) + "\n", "nft list table inet tunnelspec"
            )
        )
        return change(
            ", ".join(todo),
            diff,
            text=text,
            unit=unit,
            install=not seen.nft,
            write_file=cur_file != text,
            write_unit=cur_unit != unit,
            relink=set(seen.links) != self._links_wanted(),
            active=seen.active == "active",
            include=include,
        )

    async def _check_absent(self, ctx, seen: nft.HostIsolation):
        present = []
        for path in (nft.RULES_PATH, nft.UNIT_PATH):
            if (await ctx.conn.probe(["test", "-e", path])).rc == 0:
                present.append(path)
        present += seen.links + seen.requires_dirs
        conf = await ctx.conn.get(NFT_CONF)
        if conf is not None and CONF_INCLUDE in conf.decode(errors="replace").splitlines():
            present.append(f"the include line in {NFT_CONF}")
        if seen.table.present:
            present.append("table inet tunnelspec")
        if seen.active in ("active", "failed", "activating"):
            present.append(f"{nft.UNIT} ({seen.active})")
        if self.p["state"] == "present":  # opted out: nothing of ours may stay, and say so
            msg = warning(ctx.host, self.p["label"].split(":")[0])
            ctx.emit(events.message(msg))
            if not present:
                return ok(msg)
            return change(f"{msg}; remove " + ", ".join(present), table=seen.table.present)
        if not present:
            return ok("no isolation rules, unit or file")
        return change("remove " + ", ".join(present), table=seen.table.present)

    async def apply(self, ctx, ch):
        if not self._want_present():
            await self._remove(ctx, ch.data["table"])
            return
        if ch.data["install"]:
            if not self.p["install"]:
                raise TaskFailed("nftables (/usr/sbin/nft) is not installed")
            if (await ctx.conn.probe(["sh", "-c", "command -v apt-get"])).rc != 0:
                raise TaskFailed("nftables (/usr/sbin/nft) is not installed and there is no apt-get to install it")
            res = await ctx.conn.run(APT_INSTALL, timeout=600)
            if res.rc != 0:
                tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-8:])
                raise TaskFailed(f"installing nftables failed: {shlex.join(APT_INSTALL)}\n{tail}")
        text = ch.data["text"]
        why = await kernel_check(ctx, text)
        if why:
            raise TaskFailed(
                f"{ctx.host}: local isolation unavailable: nftables refused the rules ({why}); "
                f"set {OPT_OUT}=false for this host to run without the protection"
            )
        await ctx.conn.run(["install", "-d", "-m", "755", "--", nft.RULES_PATH.rsplit("/", 1)[0]], check=True)
        if ch.data["write_file"]:
            await ctx.conn.put(text, nft.RULES_PATH, 0o644)
        if ch.data["write_unit"]:
            await ctx.conn.put(ch.data["unit"], nft.UNIT_PATH, 0o644)
        if ch.data["write_unit"] or ch.data["relink"]:
            await ctx.conn.run(["systemctl", "daemon-reload"], check=True)
            # reenable: the links follow the unit's current [Install] (a node added or removed).
            res = await ctx.conn.run(["systemctl", "reenable", "--quiet", nft.UNIT])
            if res.rc != 0:
                raise TaskFailed(f"systemctl reenable {nft.UNIT} failed: {res.stderr.strip()}")
            await self._prune_requires_dirs(ctx)
        # One transaction replaces only our table: no moment without rules. Never a restart of the
        # unit: the guarded units require it and would be restarted with it.
        res = await ctx.conn.run([nft.NFT, "-f", nft.RULES_PATH], timeout=30)
        if res.rc != 0:
            raise TaskFailed(f"nft -f {nft.RULES_PATH} failed: {res.stderr.strip()}")
        if ch.data.get("include"):
            await self._include(ctx)
        if not ch.data["active"]:
            res = await ctx.conn.run(["systemctl", "start", nft.UNIT])
            if res.rc != 0:
                j = await ctx.conn.run(["journalctl", "-u", nft.UNIT, "-n", "10", "--no-pager", "-o", "cat"])
                raise TaskFailed(f"{nft.UNIT} failed to start:\n{res.stderr.strip()}\n{j.stdout.strip()}")

    async def _include(self, ctx) -> None:
        """Append the include line to /etc/nftables.conf; taken back if the file no longer loads."""
        before = (await ctx.conn.run([nft.NFT, "-c", "-f", NFT_CONF], timeout=30)).rc
        await ctx.conn.run(
            ["sh", "-c", 'printf "\n%s\n%s\n" "$1" "$2" >> "$3"', "sh", CONF_MARK, CONF_INCLUDE, NFT_CONF], check=True
        )
        res = await ctx.conn.run([nft.NFT, "-c", "-f", NFT_CONF], timeout=30)
        if res.rc != 0 and before == 0:
            await ctx.conn.run(CONF_DROP, check=True)
            raise TaskFailed(
                f"{NFT_CONF} no longer loads with tunnelspec's include line (taken back): {res.stderr.strip()}"
            )

    async def _prune_requires_dirs(self, ctx) -> None:
        await ctx.conn.run(
            [
                "find",
                "/etc/systemd/system",
                "-mindepth",
                "1",
                "-maxdepth",
                "1",
                "-type",
                "d",
                "-name",
                "tunnelspec-*.requires",
                "-empty",
                "-delete",
            ]
        )

    async def _remove(self, ctx, table: bool) -> None:
        # Links first, then stop: a guarded unit that still required this one would be stopped with it
        # (in teardown they are gone already; with the opt-out they keep running).
        await ctx.conn.run(["systemctl", "disable", "--quiet", nft.UNIT])
        await ctx.conn.run(
            ["find", "/etc/systemd/system", "-mindepth", "2", "-maxdepth", "2", "-name", nft.UNIT, "-delete"],
            check=True,
        )
        await self._prune_requires_dirs(ctx)
        await ctx.conn.run(["systemctl", "daemon-reload"], check=True)
        await ctx.conn.run(["systemctl", "stop", nft.UNIT])
        await ctx.conn.run(["sh", "-c", 'f=$1; shift; [ ! -f "$f" ] || exec "$@"', "sh", NFT_CONF, *CONF_DROP])
        await ctx.conn.run(["rm", "-f", "--", nft.UNIT_PATH, nft.RULES_PATH], check=True)
        await ctx.conn.run(["systemctl", "daemon-reload"], check=True)
        await ctx.conn.run(["systemctl", "reset-failed", nft.UNIT])
        if table:
            res = await ctx.conn.run([nft.NFT, "delete", "table", "inet", nft.TABLE])
            if res.rc != 0:
                raise TaskFailed(f"nft delete table inet {nft.TABLE} failed: {res.stderr.strip()}")
        await ctx.conn.run(["sh", "-c", 'rmdir -- "$1" 2>/dev/null || :', "sh", nft.RULES_PATH.rsplit("/", 1)[0]])
