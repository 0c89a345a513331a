"""The read-only tasks around loopback isolation (components/isolation.py): the preflight that nftables
can work here (`local_isolation_available`), the verify step (`local_isolation_verify`) and the proof
that what listens is guarded by the rules in force (`listeners_guarded`)."""

from __future__ import annotations

from tunnelspec.components.isolation import GUARDS_ARG, LocalIsolation, expand_guards
from tunnelspec.components.isolation_host import OPT_OUT, cap_reason, kernel_check, opted_in, warning
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts import nft, port_owners
from tunnelspec.modules.base import Arg, Task, ok, register_task
from tunnelspec.reporting import events

_PROBE_RULES = (
    "table inet tunnelspec_probe {\n\tchain output {\n"
    "\t\ttype filter hook output priority filter; policy accept;\n\t}\n}\n"
)


@register_task
class LocalIsolationAvailable(Task):
    """Read-only preflight, first on every host: can this host hold the rules? Stops the host
    (naming the reason) before anything is touched, or warns when the inventory opted out."""

    module = "local_isolation_available"
    read_only = True
    args = {
        "enabled": Arg(
            (str, bool),
            default=True,
            help="The inventory's rpc_local_isolation: false skips the check and warns instead.",
        ),
        "what": Arg(str, default="the guarded ports", help="What the warning says is exposed."),
        "listeners": Arg(
            list,
            default=[],
            help="As local_isolation's: a guarded port held by anyone else stops the run here, "
            "before anything is touched (also when opted out).",
        ),
        "guards": GUARDS_ARG,
    }

    @classmethod
    def validate(cls, params: dict) -> dict:
        guards = params.get("guards")
        if isinstance(guards, dict):
            params = {
                **{k: v for k, v in params.items() if k != "guards"},
                "listeners": params.get("listeners") or guards.get("listeners") or [],
            }
        return super().validate(params)

    def probes(self) -> list[list[str]]:
        out = nft.probes([])
        if self.p["listeners"]:
            guard = LocalIsolation(LocalIsolation.validate({"listeners": self.p["listeners"]}))
            out += [*nft.probes(guard.all_users()), port_owners.listeners().argv]
        return out

    async def check(self, ctx):
        if self.p["listeners"]:
            guard = LocalIsolation(LocalIsolation.validate({"listeners": self.p["listeners"]}))
            await guard.refuse_squatters(ctx, await nft.observe(ctx.conn, guard.all_users()))
        if not opted_in(self.p["enabled"]):
            msg = warning(ctx.host, self.p["what"])
            ctx.emit(events.message(msg))
            return ok(msg)
        seen = await nft.observe(ctx.conn, [])
        if not seen.net_admin:
            raise TaskFailed(cap_reason(ctx.host))
        if seen.nft and seen.table.present:
            # nft listed our table from this kernel just now: it holds rules of this kind, and the
            # listing itself needs CAP_NET_ADMIN. No trial load needed (one nft run less per host).
            return ok("nftables usable (CAP_NET_ADMIN, nf_tables: the isolation table is loaded)")
        if seen.nft:
            why = await kernel_check(ctx, _PROBE_RULES)
            if why:
                raise TaskFailed(
                    f"{ctx.host}: local isolation unavailable: nftables cannot load rules here "
                    f"({why}). Fix the kernel (nf_tables), or set {OPT_OUT}=false for this host"
                )
            return ok("nftables usable (CAP_NET_ADMIN, nf_tables)")
        return ok("CAP_NET_ADMIN present; nftables will be installed")


@register_task
class LocalIsolationVerify(Task):
    """Read-only (verify): the live table holds exactly the rules a deploy would load."""

    module = "local_isolation_verify"
    read_only = True
    args = {k: v for k, v in LocalIsolation.args.items() if k not in ("state", "install")}

    @classmethod
    def validate(cls, params: dict) -> dict:
        return super().validate(expand_guards(params))

    async def check(self, ctx):
        if not opted_in(self.p["enabled"]):
            msg = warning(ctx.host, self.p["label"].split(":")[0])
            ctx.emit(events.message(msg))
            return ok(msg)
        inner = LocalIsolation({**self.p, "state": "present", "install": False})
        seen = await nft.observe(ctx.conn, inner.all_users())
        await inner.refuse_squatters(ctx, seen)
        rules, _, _ = inner._desired(seen)
        if seen.table_error:
            raise TaskFailed(f"cannot read the isolation rules: {seen.table_error}")
        if not nft.matches(seen.table, rules):
            live = nft.describe(seen.table.rules) if seen.table.present else "no table inet tunnelspec"
            raise TaskFailed(
                f"isolation rules missing or changed (live: {live}; want: {nft.describe(rules)}): "
                "run `tunnelspec deploy`"
            )
        return ok(f"{self.p['label']} ({nft.describe(rules)}; {seen.table.rejected} connection(s) refused so far)")


@register_task
class ListenersGuarded(Task):
    """Read-only, after services started (deploy, verify, rollback): every TCP socket that an account
    tunnelspec created listens on is guarded by the rules in force now — a listen guard that lets its
    owner answer and a connect guard (the API at the front: anyone may connect). The registry of
    listeners (cluster/ports.py) makes the rules; this holds the running services to them, whatever
    generation or code started them: a listener added without its registry entry, or a generation
    restored without its rules, fails here instead of serving unguarded."""

    module = "listeners_guarded"
    read_only = True
    args = {
        "open_ports": Arg(
            list,
            default=[],
            help="Ports anyone may connect to (the API at the front): only their listen guard is required.",
        ),
        "enabled": Arg((str, bool), default=True, help="The inventory's rpc_local_isolation: false warns instead."),
    }

    def probes(self) -> list[list[str]]:
        return [port_owners.listeners().argv, *nft.probes([])]

    async def check(self, ctx):
        if not opted_in(self.p["enabled"]):
            msg = warning(ctx.host, "every port its services listen on")
            ctx.emit(events.message(msg))
            return ok(msg)
        owned = [x for x in await port_owners.observe(ctx.conn) if x.ours]
        seen = await nft.observe(ctx.conn, [])
        if seen.table_error:
            raise TaskFailed(f"cannot read the isolation rules: {seen.table_error}")
        open_ports = {int(p) for p in self.p["open_ports"]}
        bad = []
        for x in owned:
            if x.port in open_ports:  # the API: anyone may connect; a public one answers off loopback
                continue
            gaps = nft.guard_gaps(seen.table, x.port, x.uid)
            if gaps:
                bad.append(f"{x.describe()}: {', '.join(gaps)}")
        if bad:
            raise TaskFailed(
                f"{ctx.host}: listening without the isolation's guards: "
                + "; ".join(bad)
                + ". Every port a tunnelspec service listens on must be in the registry of listeners "
                "(cluster/ports.py) and its rules loaded: run `tunnelspec deploy`"
            )
        ports = sorted({x.port for x in owned})
        return ok(
            f"{len(ports)} port(s) tunnelspec's accounts listen on, each guarded"
            + (f" ({', '.join(map(str, ports))})" if ports else "")
        )
