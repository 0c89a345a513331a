"""systemd: unit files (verified before install), service state, and the handlers that cannot be
idempotent (daemon-reload, restart)."""

from __future__ import annotations

from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.units import service, service_state, unit_values, values
from tunnelspec.modules.base import Arg, Task, change, ok, register_task
from tunnelspec.modules.files import Copy, Template

UNIT_DIR = "/etc/systemd/system"
# Units the `service` task started in this run and no restart handler has consumed yet.
STARTED_FACT = "services_started"


def _unit_path(name: str) -> str:
    if "/" in name or not name.endswith((".service", ".socket", ".timer", ".target", ".path")):
        raise TaskFailed(f"bad unit name {name!r}")
    return f"{UNIT_DIR}/{name}"


@register_task
class SystemdUnit(Task):
    """Install a unit file from a template (or content). Notify a `daemon_reload` handler."""

    module = "systemd_unit"
    args = {
        "name": Arg(str, required=True, help="The unit's name (in /etc/systemd/system)."),
        "src": Arg(str, help="A template (from the inventory's directory or tunnelspec's templates)."),
        "content": Arg(str, help="The unit's text, when there is no template."),
        "vars": Arg(dict, default={}, help="Extra template variables."),
        "verify": Arg(bool, default=True, help="Check a candidate with `systemd-analyze verify` before installing it."),
    }

    def _inner(self):
        p = {"dest": _unit_path(self.p["name"]), "mode": "644"}
        if self.p["src"]:
            return Template.build({**p, "src": self.p["src"], "vars": self.p["vars"]})
        return Copy.build({**p, "content": self.p["content"] or ""})

    def probes(self) -> list[list[str]]:
        return self._inner().probes()

    async def check(self, ctx):
        return await self._inner().check(ctx)

    async def apply(self, ctx, ch):
        inner = self._inner()
        data = await inner.desired(ctx)
        if self.p["verify"]:
            # Verify a candidate with the real unit name in a scratch dir, so a broken unit is never installed.
            res = await ctx.conn.run(["mktemp", "-d", "/tmp/tunnelspec-unit.XXXXXX"], check=True)
            tmpdir = res.stdout.strip()
            try:
                cand = f"{tmpdir}/{self.p['name']}"
                await ctx.conn.put(data, cand, 0o644)
                v = await ctx.conn.run(["systemd-analyze", "verify", "--man=no", cand])
                if v.rc != 0:
                    out = "\n".join((v.stderr + v.stdout).strip().splitlines()[-10:])
                    raise TaskFailed(f"systemd-analyze verify rejected {self.p['name']}:\n{out}")
            finally:
                await ctx.conn.run(["rm", "-rf", "--", tmpdir])
        await inner.apply(ctx, ch)


@register_task
class SystemdUnitAbsent(Task):
    """A unit stopped, disabled and its file removed."""

    module = "systemd_unit_absent"
    args = {
        "name": Arg(str, required=True, help="The unit to stop, disable and delete."),
    }

    def probes(self) -> list[list[str]]:
        return [self._state_argv()]

    def _state_argv(self) -> list[str]:
        return [
            "sh",
            "-c",
            'systemctl is-active -q "$1" && echo active; [ -e "$2" ] && echo file || :',
            "sh",
            self.p["name"],
            _unit_path(self.p["name"]),
        ]

    async def check(self, ctx):
        res = await ctx.conn.probe(self._state_argv())
        state = set(res.stdout.split())
        if not state:
            return ok("unit absent")
        return change(f"stop and remove {self.p['name']}")

    async def apply(self, ctx, ch):
        name = self.p["name"]
        await ctx.conn.run(["systemctl", "disable", "--now", name])
        await ctx.conn.run(["rm", "-f", "--", _unit_path(name)], check=True)
        await daemon_reload(ctx.conn)
        await ctx.conn.run(["systemctl", "reset-failed", name])


@register_task
class Service(Task):
    """A unit started or stopped, enabled or disabled."""

    module = "service"
    args = {
        "name": Arg(str, required=True, help="The unit."),
        "state": Arg(str, default="started", choices=("started", "stopped"), help="`started` or `stopped`."),
        "enabled": Arg(bool, help="Enabled at boot (true/false); unset: left as is."),
        "installed_only": Arg(
            bool, default=False, help="A unit that is not installed is left alone (ok) instead of failing to start."
        ),
    }

    def probes(self) -> list[list[str]]:
        return [service(self.p["name"]).argv]

    async def _observe(self, ctx) -> tuple[str, str]:
        return await service_state(ctx.conn, self.p["name"])

    async def check(self, ctx):
        active, enabled = await self._observe(ctx)
        if self.p["installed_only"] and enabled in ("", "not-found"):
            return ok(f"{self.p['name']} is not installed: left alone")
        want_active = self.p["state"] == "started"
        diffs = []
        if want_active and active != "active":
            diffs.append(f"start ({active})")
        if not want_active and active in ("active", "activating", "reloading"):
            diffs.append("stop")
        if self.p["enabled"] is not None:
            is_enabled = enabled in ("enabled", "enabled-runtime", "alias", "static", "indirect", "generated")
            if self.p["enabled"] and enabled not in ("enabled", "static", "alias", "indirect", "generated"):
                diffs.append(f"enable ({enabled or 'not-found'})")
            if not self.p["enabled"] and is_enabled and enabled != "static":
                diffs.append("disable")
        return change(", ".join(diffs)) if diffs else ok(f"{active}, {enabled or 'n/a'}")

    async def apply(self, ctx, ch):
        name = self.p["name"]
        if self.p["enabled"] is True:
            await ctx.conn.run(["systemctl", "enable", "--quiet", name], check=True)
        elif self.p["enabled"] is False:
            await ctx.conn.run(["systemctl", "disable", "--quiet", name], check=True)
        if self.p["state"] == "started":
            res = await ctx.conn.run(["systemctl", "start", name])
            if res.rc != 0:
                j = await ctx.conn.run(["journalctl", "-u", name, "-n", "20", "--no-pager", "-o", "cat"])
                raise TaskFailed(f"{name} failed to start:\n{res.stderr.strip()}\n{j.stdout.strip()}")
            # Started now, after every change notified earlier in the play: a restart handler for
            # it would only start it a second time (llama-server reloads its models for nothing).
            ctx.register(STARTED_FACT, sorted({*ctx.facts.get(STARTED_FACT, []), name}))
        else:
            await ctx.conn.run(["systemctl", "stop", name], check=True)


async def daemon_reload(conn) -> None:
    await conn.run(["systemctl", "daemon-reload"], check=True)


@register_task
class DaemonReload(Task):
    """`systemctl daemon-reload`. With `units`: a task, changed only when systemd says one of their
    files changed on disk (so a changed unit is loaded before a `service` task starts it). Without:
    a handler, reloading whenever notified."""

    module = "daemon_reload"
    args = {
        "units": Arg(
            list,
            default=[],
            help="Reload only when systemd reports one of these units' files changed on disk (a task); empty: reload whenever notified (a handler).",
        ),
    }

    @classmethod
    def is_handler_only(cls, params: dict) -> bool:
        return not params.get("units")

    def probes(self) -> list[list[str]]:
        return [values("NeedDaemonReload", list(self.p["units"])).argv] if self.p["units"] else []

    async def _stale(self, ctx) -> list[str]:
        units = list(self.p["units"])
        values = await unit_values(ctx.conn, "NeedDaemonReload", units)
        # An older systemd's layout may give fewer values (facts/units.py): those units are not stale.
        return [u for u, v in zip(units, values, strict=False) if v == "yes"]

    async def check(self, ctx):
        if not self.p["units"]:
            return change("daemon-reload")
        stale = await self._stale(ctx)
        return change(f"daemon-reload ({', '.join(stale)} changed on disk)") if stale else ok("units loaded")

    async def apply(self, ctx, ch):
        await daemon_reload(ctx.conn)


@register_task
class ServiceRestart(Task):
    """Restart a unit (a handler: a restart cannot be idempotent)."""

    module = "service_restart"
    args = {
        "name": Arg(str, required=True, help="The unit to restart."),
    }
    handler_only = True

    async def check(self, ctx):
        started = ctx.facts.get(STARTED_FACT, [])
        if self.p["name"] in started:
            ctx.register(STARTED_FACT, [n for n in started if n != self.p["name"]])
            return ok(f"{self.p['name']} was started after the change by this play: no second start")
        return change(f"restart {self.p['name']}")

    async def apply(self, ctx, ch):
        res = await ctx.conn.run(["systemctl", "restart", self.p["name"]])
        if res.rc != 0:
            raise TaskFailed(f"restart of {self.p['name']} failed: {res.stderr.strip()}")


@register_task
class ServiceReload(Task):
    """Reload a unit (`systemctl reload`: its ExecReload=, e.g. HAProxy re-reading its configuration
    without dropping a connection). A handler: a reload cannot be idempotent."""

    module = "service_reload"
    args = {
        "name": Arg(str, required=True, help="The unit to reload."),
    }
    handler_only = True

    async def check(self, ctx):
        started = ctx.facts.get(STARTED_FACT, [])
        if self.p["name"] in started:
            return ok(f"{self.p['name']} was started after the change by this play: it read the new configuration")
        return change(f"reload {self.p['name']}")

    async def apply(self, ctx, ch):
        res = await ctx.conn.run(["systemctl", "reload-or-restart", self.p["name"]])
        if res.rc != 0:
            j = await ctx.conn.run(["journalctl", "-u", self.p["name"], "-n", "20", "--no-pager", "-o", "cat"])
            raise TaskFailed(f"reload of {self.p['name']} failed: {res.stderr.strip()}\n{j.stdout.strip()}")
