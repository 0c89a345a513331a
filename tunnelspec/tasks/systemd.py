"""systemd: unit files (verified before install), service state, and the handlers that cannot be
idempotent (daemon-reload, restart)."""

from __future__ import annotations

from tunnelspec.errors import TaskFailed
from tunnelspec.tasks.base import Arg, Task, change, ok, register_task
from tunnelspec.tasks.files import Copy, Template

UNIT_DIR = "/etc/systemd/system"
# Units the `service` task started in this run and no restart handler has consumed yet.
STARTED_FACT = "services_started"


# Per unit, one round trip: does systemd still run it from an older version of its file? (its file is
# newer than its last start: a run was killed between writing the unit and restarting it). Prints
# `<unit> <NeedDaemonReload> <ActiveEnterTimestamp, unix s or empty> <file mtime, unix s>`.
_STALE_SCRIPT = r"""
for u; do
  f=/etc/systemd/system/$u
  r=$(systemctl show -P NeedDaemonReload -- "$u" 2>/dev/null)
  t=$(systemctl show --timestamp=unix -P ActiveEnterTimestamp -- "$u" 2>/dev/null)
  m=$(stat -c %Y -- "$f" 2>/dev/null)
  echo "$u ${r:-no} ${t#@} ${m:-0}" | tr -s ' '
done
"""


async def stale_units(conn, names: list[str]) -> dict[str, str]:
    """Units running from an older file than the one installed: {unit: why}."""
    if not names:
        return {}
    res = await conn.run(["sh", "-c", _STALE_SCRIPT, "sh", *names])
    out = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            unit, reload, started, mtime = parts[0], parts[1], int(parts[2]), int(parts[3])
            if reload == "yes":
                out[unit] = "unit file changed, not reloaded"
            elif started and mtime > started:
                out[unit] = "unit file newer than the running service"
        elif len(parts) >= 2 and parts[1] == "yes":
            out[parts[0]] = "unit file changed, not reloaded"
    return out


def _unit_path(name: str) -> str:
    if "/" in name or not name.endswith((".service", ".socket", ".timer", ".target", ".path")):
        raise TaskFailed(f"bad unit name {name!r}")
    return f"{UNIT_DIR}/{name}"


@register_task
class SystemdUnit(Task):
    """Install a unit file from a template (or content). Notify a `systemd_reload` handler."""

    module = "systemd_unit"
    args = {"name": Arg(str, required=True), "src": Arg(str), "content": Arg(str), "vars": Arg(dict, default={}),
            "verify": Arg(bool, default=True)}

    def _inner(self):
        p = {"dest": _unit_path(self.p["name"]), "mode": "644", "owner": None, "group": None, "validate": None}
        if self.p["src"]:
            return Template({**p, "src": self.p["src"], "vars": self.p["vars"]})
        return Copy({**p, "content": self.p["content"] or "", "src": None})

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
    module = "systemd_unit_absent"
    args = {"name": Arg(str, required=True)}

    async def check(self, ctx):
        res = await ctx.conn.run(["sh", "-c", 'systemctl is-active -q "$1" && echo active; [ -e "$2" ] && echo file || :',
                                  "sh", self.p["name"], _unit_path(self.p["name"])])
        state = set(res.stdout.split())
        if not state:
            return ok("unit absent")
        return change(f"stop and remove {self.p['name']}")

    async def apply(self, ctx, ch):
        name = self.p["name"]
        await ctx.conn.run(["systemctl", "disable", "--now", name])
        await ctx.conn.run(["rm", "-f", "--", _unit_path(name)], check=True)
        await ctx.conn.run(["systemctl", "daemon-reload"], check=True)
        await ctx.conn.run(["systemctl", "reset-failed", name])


@register_task
class Service(Task):
    module = "service"
    args = {"name": Arg(str, required=True),
            "state": Arg(str, default="started", choices=("started", "stopped")),
            "enabled": Arg(bool)}

    async def _observe(self, ctx) -> tuple[str, str]:
        res = await ctx.conn.run(["sh", "-c", 'systemctl is-active "$1"; systemctl is-enabled "$1" 2>/dev/null || :',
                                  "sh", self.p["name"]])
        parts = res.stdout.split() + ["", ""]
        return parts[0], parts[1]

    async def check(self, ctx):
        active, enabled = await self._observe(ctx)
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


@register_task
class SystemdReload(Task):
    module = "systemd_reload"
    args = {}
    handler_only = True

    async def check(self, ctx):
        return change("daemon-reload")

    async def apply(self, ctx, ch):
        await ctx.conn.run(["systemctl", "daemon-reload"], check=True)


@register_task
class ServiceRestart(Task):
    module = "service_restart"
    args = {"name": Arg(str, required=True)}
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
