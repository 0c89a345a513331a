"""Runs plays: hosts in parallel (bounded by --forks), tasks in order per host, handlers at the end
of a play, gates across hosts between plays. Per-host failures are values, not exceptions that
stop other hosts."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

from tunnelspec.connection import ConnectOptions, connect
from tunnelspec.engine import pending, testhooks
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.engine.gates import GATES
from tunnelspec.engine.playbook import Play, Playbook, TaskSpec
from tunnelspec.engine.templating import TemplateError, evaluate, render_value
from tunnelspec.errors import HostUnreachable, TaskFailed, TunnelspecError, UsageError
from tunnelspec.reporting.summary import Summary
from tunnelspec.secrets import mask_value, secret_values
from tunnelspec.tasks import TASKS


@dataclass
class HostState:
    name: str
    vars: dict
    facts: dict = field(default_factory=dict)
    conn: object = None
    failed: bool = False
    unreachable: bool = False


class HostVars(Mapping):
    """`hostvars` for templates: each host's vars + registered facts, merged when looked up.
    Building the merged dict of every host for every task of every host was O(hosts²) per task."""

    def __init__(self, hosts: dict[str, HostState]):
        self._hosts = hosts

    def __getitem__(self, name: str) -> dict:
        st = self._hosts[name]
        return {**st.vars, **st.facts}

    def __iter__(self):
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)


class Run:
    """One invocation: an inventory, options, and the hosts' connections (opened once, reused)."""

    def __init__(self, inventory, options: RunOptions, emit, connect_options: ConnectOptions | None = None,
                 cluster=None):
        self.inventory = inventory
        self.options = options
        self.emit_raw = emit
        self.connect_options = connect_options or ConnectOptions()
        self.cluster = cluster
        self.summary = Summary(check=options.check)
        self.hosts: dict[str, HostState] = {}
        self.secrets: list[str] = []
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self._groups: dict[str, list[str]] | None = None
        self._hostvars = HostVars(self.hosts)
        for name in inventory.hosts:
            hv = dict(inventory.host_vars(name))
            hv.update(options.extra_vars)
            self.hosts[name] = HostState(name, hv)
            self.secrets.extend(secret_values(hv))

    # ---- events ---------------------------------------------------------------------------
    def emit(self, event: dict) -> None:
        if event.get("no_log"):
            # Ansible's no_log: the task's result is hidden entirely, whatever it contains.
            event = {**event, "msg": "output hidden (no_log: true)"}
            event.pop("diff", None)
        # Longest first, so a secret containing another is masked whole.
        event = mask_value(event, sorted(set(self.secrets), key=len, reverse=True))
        self.summary.record(event)
        self.emit_raw(event)
        if event.get("event") == "progress":
            testhooks.reached(event.get("task", ""), "progress")

    # ---- hosts ----------------------------------------------------------------------------
    def select(self, pattern: str) -> list[str]:
        hosts = self.inventory.match(pattern)
        if self.options.limit:
            allowed = set(self.inventory.match(self.options.limit))
            hosts = [h for h in hosts if h in allowed]
        return hosts

    async def connection(self, name: str):
        st = self.hosts[name]
        lock = self._conn_locks.setdefault(name, asyncio.Lock())
        async with lock:
            if st.conn is None:
                st.conn = await connect(name, st.vars, self.connect_options, self.inventory.path.parent)
        return st.conn

    async def close(self) -> None:
        for st in self.hosts.values():
            if st.conn is not None:
                await st.conn.close()
                st.conn = None
        if self.connect_options.preconnect is not None:
            self.connect_options.preconnect.close()
            self.connect_options.preconnect = None
        for host, line in self.connect_options.new_host_keys:
            self.emit({"event": "host_key_pinned", "host": host, "msg": f"pinned new host key: {line}"})
        self.connect_options.new_host_keys.clear()

    def groups(self) -> dict[str, list[str]]:
        # The inventory does not change during a run: resolve every group once, not once per task.
        if self._groups is None:
            groups = {g: list(self.inventory.match(g)) for g in self.inventory.groups}
            groups.setdefault("all", list(self.inventory.hosts))
            self._groups = groups
        return self._groups

    def template_vars(self, name: str, play: Play | None = None) -> dict:
        st = self.hosts[name]
        v = {**st.vars, **(play.vars if play else {}), **st.facts}
        v.update(inventory_hostname=name, hostvars=self._hostvars, groups=self.groups(),
                 check_mode=self.options.check, cluster=self.cluster)
        return v

    # ---- plays ----------------------------------------------------------------------------
    def _preconnect(self, playbook: Playbook) -> None:
        """TCP connects to the first play's first --forks hosts, before asyncssh is imported
        (connection/preconnect.py says when this is skipped)."""
        from tunnelspec.connection.factory import is_ssh, ssh_target
        from tunnelspec.connection.preconnect import Preconnect, ssh_config_may_reroute

        opts = self.connect_options
        if not playbook.plays or opts.preconnect is not None or (opts.use_ssh_config and ssh_config_may_reroute()):
            return
        targets = []
        for h in self.select(playbook.plays[0].hosts)[:max(1, self.options.forks)]:
            hv = self.hosts[h].vars
            if is_ssh(hv):
                try:
                    targets.append(ssh_target(h, hv))
                except (TypeError, ValueError):
                    continue             # a bad ansible_port is reported by the real connect
        pre = Preconnect()
        if pre.start(targets):
            opts.preconnect = pre

    async def run_playbook(self, playbook: Playbook) -> Summary:
        self.emit({"event": "run_start", "playbook": playbook.path, "check": self.options.check})
        self._preconnect(playbook)
        lock = None
        try:
            if self.options.lock and not self.options.check:
                from tunnelspec.engine.runlock import RunLock

                lock = RunLock(self, self.options.lock, self.options.lock_timeout, self.options.lock_wait)
                await lock.acquire([h for play in playbook.plays for h in self.select(play.hosts)])
            for play in playbook.plays:
                await self.run_play(play)
        finally:
            if lock is not None:
                await lock.release()
            await self.close()
        self.emit({"event": "recap", "hosts": self.summary.per_host(), "exit_code": self.summary.exit_code()})
        return self.summary

    async def run_play(self, play: Play) -> None:
        hosts = [h for h in self.select(play.hosts) if not (self.hosts[h].failed or self.hosts[h].unreachable)]
        self.secrets.extend(secret_values(play.vars))
        self.emit({"event": "play_start", "play": play.name, "hosts": hosts})
        if not hosts:
            return
        sem = asyncio.Semaphore(max(1, self.options.forks))

        async def one(h):
            async with sem:
                await self.run_host(play, h)

        await asyncio.gather(*(one(h) for h in hosts))
        if play.gate:
            live = [h for h in hosts if not (self.hosts[h].failed or self.hosts[h].unreachable)]
            if len(live) != len(hosts):
                # A gate over a partial set of hosts proves nothing: stop the rest too.
                for h in live:
                    self._fail(h, f"gate {play.gate['kind']}", "not all hosts reached the gate", play)
                return
            hv = {h: {**self.hosts[h].vars, **self.hosts[h].facts} for h in live}
            try:
                msg = GATES[play.gate["kind"]](play.gate, hv)
                self.emit({"event": "gate", "play": play.name, "status": "ok", "msg": msg})
            except TaskFailed as e:
                self.emit({"event": "gate", "play": play.name, "status": "failed", "msg": str(e)})
                for h in live:
                    self._fail(h, play.gate.get("name", f"gate {play.gate['kind']}"), str(e), play, quiet=True)

    def _fail(self, host, task, msg, play, quiet=False):
        self.hosts[host].failed = True
        if not quiet:
            self.emit({"event": "task_result", "host": host, "task": task, "play": play.name,
                       "status": "failed", "msg": msg})
        else:
            self.summary.mark_failed(host)

    async def run_host(self, play: Play, host: str) -> None:
        st = self.hosts[host]
        try:
            conn = await self.connection(host)
        except HostUnreachable as e:
            st.unreachable = True
            self.emit({"event": "unreachable", "host": host, "play": play.name, "msg": str(e)})
            return
        except TunnelspecError as e:
            st.failed = True
            self.emit({"event": "task_result", "host": host, "task": "connect", "play": play.name,
                       "status": "failed", "msg": str(e)})
            return
        try:
            # Handlers a killed run of this play notified and never ran (engine/pending.py).
            notified: list[str] = await pending.load(conn, st.vars, play.name) if play.handlers else []
        except HostUnreachable as e:
            st.unreachable = True
            self.emit({"event": "unreachable", "host": host, "play": play.name, "msg": str(e)})
            return
        await self._prefetch(play, host, conn)
        for spec in play.tasks:
            if not await self._run_task(play, spec, host, conn, notified, is_handler=False):
                return
        for spec in play.handlers:
            if spec.name in notified or any(x in notified for x in spec.listen):
                if not await self._run_task(play, spec, host, conn, notified, is_handler=True):
                    return
        if notified and not self.options.check:
            try:
                await pending.clear(conn, st.vars, play.name)
            except TunnelspecError:
                pass                     # kept: the handlers run once more next time, no harm

    async def _prefetch(self, play: Play, host: str, conn) -> None:
        """The read-only commands of every check of this play (`Task.probes()`, optional) in one round
        trip instead of one each; the connection serves them until anything changes on the host
        (connection/probes.py). Best effort: a task whose args cannot be rendered yet (they use a
        fact registered later in the play) or a failed batch just means its check reads for itself."""
        variables = None
        argvs: list[list[str]] = []
        for spec in play.tasks:
            cls = TASKS.get(spec.module)
            if cls is None or not hasattr(cls, "probes") or not self._tag_selected(spec):
                continue
            try:
                if variables is None:
                    variables = self.template_vars(host, play)
                argvs.extend(cls(cls.validate(render_value(spec.args, variables))).probes())
            except Exception:  # noqa: BLE001 - reported by the task itself when it runs
                continue
        if len(argvs) > 1:
            try:
                await conn.prefetch(argvs)
            except Exception:  # noqa: BLE001 - same: the checks run their commands themselves
                pass

    def _tag_selected(self, spec: TaskSpec) -> bool:
        tags = set(spec.tags)
        if self.options.tags and not (tags & set(self.options.tags)) and "always" not in tags:
            return False
        if self.options.skip_tags and tags & set(self.options.skip_tags):
            return False
        return True

    async def _run_task(self, play: Play, spec: TaskSpec, host: str, conn, notified: list, is_handler: bool) -> bool:
        """Returns False when the host must stop (failed or unreachable)."""
        st = self.hosts[host]
        base = {"event": "task_result", "host": host, "task": spec.name, "module": spec.module, "play": play.name}
        if spec.no_log:
            base["no_log"] = True
        if not self._tag_selected(spec):
            return True
        variables = self.template_vars(host, play)
        ctx = HostContext(host=host, conn=conn, vars=variables, facts=st.facts, options=self.options,
                          emit=self.emit, task_name=spec.name, secrets=self.secrets, controller=self)
        started = time.monotonic()
        try:
            for cond in spec.when:
                if not evaluate(cond, variables):
                    self.emit({**base, "status": "skipped", "msg": f"condition false: {cond}"})
                    return True
            params = TASKS[spec.module].validate(render_value(spec.args, variables))
            task = TASKS[spec.module](params)
            for s in task.secrets():
                ctx.add_secret(s)
            ch = await task.check(ctx)
            status, msg, diff = "ok", ch.msg, ch.diff
            if ch.changed:
                status = "changed"
                if not self.options.check:
                    if spec.notify:
                        await pending.mark(conn, st.vars, play.name, spec.notify)
                    testhooks.reached(spec.name, "start")
                    await task.apply(ctx, ch)
                    testhooks.reached(spec.name, "apply")
                    if not task.handler_only:
                        again = await task.check(ctx)
                        if again.changed:
                            raise TaskFailed(f"not convergent: after apply the check still reports: {again.msg}")
                    notified.extend(spec.notify)
                else:
                    notified.extend(spec.notify)
            if spec.register:
                ctx.register(spec.register, {"changed": status == "changed", "msg": msg})
            ev = {**base, "status": status, "msg": msg, "duration": round(time.monotonic() - started, 3)}
            if status == "changed" and diff is not None and (self.options.diff or self.options.check) and not spec.no_log:
                ev["diff"] = {"path": diff.path, "before": diff.before, "after": diff.after}
            if status == "changed" and self.options.check:
                ev["would_change"] = True
            self.emit(ev)
            return True
        except HostUnreachable as e:
            st.unreachable = True
            self.emit({"event": "unreachable", "host": host, "play": play.name, "task": spec.name, "msg": str(e)})
            return False
        except (TaskFailed, TemplateError, ValueError, UsageError) as e:
            where = f" ({spec.file}:{spec.line})" if isinstance(e, (TemplateError, ValueError)) else ""
            st.failed = True
            self.emit({**base, "status": "failed", "msg": f"{e}{where}"})
            return False
        except Exception as e:  # noqa: BLE001 - a bug in one task must not take down other hosts
            st.failed = True
            tb = traceback.format_exc(limit=6) if self.options.verbose else ""
            self.emit({**base, "status": "failed", "msg": f"internal error: {type(e).__name__}: {e}\n{tb}".rstrip()})
            return False


async def run_playbook(inventory, playbook: Playbook, options: RunOptions, emit,
                       connect_options: ConnectOptions | None = None, cluster=None) -> Summary:
    run = Run(inventory, options, emit, connect_options, cluster)
    return await run.run_playbook(playbook)
