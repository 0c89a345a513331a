"""Runs plays: hosts in parallel (bounded by --forks), tasks in order per host, handlers at the end
of a play, gates across hosts between plays. Per-host failures are values, not exceptions that
stop other hosts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tunnelspec.cluster import schema
from tunnelspec.connection import ConnectOptions, ConnectSession, connect
from tunnelspec.connection.factory import is_ssh, ssh_target
from tunnelspec.connection.preconnect import Preconnect, ssh_config_may_reroute
from tunnelspec.core import testhooks
from tunnelspec.core.errors import HostUnreachable, TaskFailed, TunnelspecError
from tunnelspec.core.secrets import mask_value, secret_values
from tunnelspec.engine import pending, registry
from tunnelspec.engine.checkplan import CheckPlan
from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.playbook import Play, Playbook, TaskSpec
from tunnelspec.engine.prefetch import Prefetch
from tunnelspec.engine.runlock import RunLock
from tunnelspec.engine.task_exec import TaskExecution
from tunnelspec.inventory.values import parse_value
from tunnelspec.reporting import events
from tunnelspec.reporting.summary import Summary

if TYPE_CHECKING:
    from tunnelspec.cluster.model import Cluster
    from tunnelspec.connection import Connection


@dataclass
class HostState:
    name: str
    vars: dict
    facts: dict = field(default_factory=dict)
    conn: Connection | None = None
    conn_error: TunnelspecError | None = None  # the run's one connect failed: said again, not retried
    failed: bool = False
    unreachable: bool = False


class HostvarsView(Mapping):
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


class Run(Prefetch, TaskExecution):
    """One invocation: an inventory, options, and the hosts' connections (opened once, reused)."""

    def __init__(
        self,
        inventory,
        options: RunOptions,
        emit,
        connect_options: ConnectOptions | None = None,
        cluster: Cluster | None = None,
    ):
        # The run's one view of every variable: the caller's inventory, -e already on top
        # (`Inventory.with_extra_vars`, the one merge; Inventory.host_vars reads it). The caller's
        # cluster, when given, was built from the same view (commands/runner.py).
        self.inventory = inventory
        self.options = options
        self.emit_raw = emit
        self.connect_options = connect_options or ConnectOptions()  # never changed by the run
        self.session = ConnectSession()  # what the run's connections share (pre-opened sockets, pinned keys)
        self.cluster = cluster
        self.memo: dict = {}  # HostContext.memo: one per run
        self.summary = Summary(check=options.check)
        self.check_plan = CheckPlan()  # --check: what earlier tasks would change (engine/checkplan.py)
        self.hosts: dict[str, HostState] = {}
        self.secrets: list[str] = []
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self._groups: dict[str, list[str]] | None = None
        self._settled: dict[str, dict] = {}
        self._hostvars = HostvarsView(self.hosts)
        self._ahead: dict[str, int] = {}  # engine/prefetch.py: look-ahead batches
        self._selected: dict[int, frozenset[str]] = {}  # engine/prefetch.py: each play's hosts
        self._recall: dict[str, dict] = {}  # engine/prefetch.py: each host's facts of its last run
        self._remote: dict = {}  # engine/prefetch.py: what a task reads on other hosts
        self._first_lock: asyncio.Future | None = None  # the run lock's first try (run_playbook)
        for name in inventory.hosts:
            hv = dict(inventory.host_vars(name))
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

    async def connection(self, name: str) -> Connection:
        st = self.hosts[name]
        lock = self._conn_locks.setdefault(name, asyncio.Lock())
        async with lock:
            if st.conn is None and st.conn_error is not None:
                raise st.conn_error
            if st.conn is None:
                try:
                    st.conn = await connect(
                        name, st.vars, self.connect_options, self.inventory.path.parent, self.session
                    )
                except TunnelspecError as e:
                    st.conn_error = e  # the run lock's try and the first play ask once, not twice
                    raise
        return st.conn

    async def close(self) -> None:
        for st in self.hosts.values():
            if st.conn is not None:
                await st.conn.close()
                st.conn = None
        if self.session.preconnect is not None:
            self.session.preconnect.close()
            self.session.preconnect = None
        for host, line in self.session.new_host_keys:
            self.emit(events.host_key_pinned(host, line))
        self.session.new_host_keys.clear()

    def groups(self) -> dict[str, list[str]]:
        # The inventory does not change during a run: resolve every group once, not once per task.
        if self._groups is None:
            groups = {g: list(self.inventory.match(g)) for g in self.inventory.groups}
            groups.setdefault("all", list(self.inventory.hosts))
            self._groups = groups
        return self._groups

    def settled(self, name: str) -> dict:
        """Every declared variable's settled, typed value on `name` (cluster/schema.py settled): the
        one route of tunnelspec's variables to the tasks, so a playbook needs no `default()`. The
        inventory does not change during a run: worked out once per host."""
        if name not in self._settled:
            values = dict(self.hosts[name].vars)
            # -e text is read as the inventory's values are (cluster/fields.py HostVars).
            values.update((k, parse_value(v)) for k, v in self.inventory.extra_vars.items() if isinstance(v, str))
            self._settled[name] = schema.settled(name, values, self.cluster, self.inventory.path.parent)
        return self._settled[name]

    def template_vars(self, name: str, play: Play | None = None) -> dict:
        st = self.hosts[name]
        v = {**st.vars, **self.settled(name), **(play.vars if play else {}), **st.facts}
        v.update(
            inventory_hostname=name,
            # The host's part in the cluster: "main" (llama-server) or "rpc" (an RPC node).
            host_role="main" if name in self.groups().get("main", ()) else "rpc",
            hostvars=self._hostvars,
            groups=self.groups(),
            check_mode=self.options.check,
            cluster=self.cluster,
            unreachable_hosts=sorted(h for h, s in self.hosts.items() if s.unreachable),
        )
        return v

    def _spared(self, host: str) -> bool:
        """An unreachable host the others may go on without (the cluster says which: `optional_hosts`).
        Gates leave it out."""
        if self.cluster is None or not self.hosts[host].unreachable or self.hosts[host].failed:
            return False
        return host in self.cluster.optional_hosts

    async def _reads_may_start(self) -> None:
        """Before a host's first read: the run lock's first try is over (`run_playbook`), so what is
        read is read under this run's lock when it got them all. Never raises: `run_playbook` does."""
        if self._first_lock is not None and not self._first_lock.done():
            await asyncio.wait([self._first_lock])

    # ---- plays ----------------------------------------------------------------------------
    def preconnect(self, playbook: Playbook) -> None:
        """TCP connects to the first play's first --forks hosts, before asyncssh is imported
        (connection/preconnect.py says when this is skipped)."""
        opts = self.connect_options
        if (
            not playbook.plays
            or self.session.preconnect is not None
            or (opts.use_ssh_config and ssh_config_may_reroute())
        ):
            return
        targets = []
        for h in self.select(playbook.plays[0].hosts)[: max(1, self.options.forks)]:
            hv = self.hosts[h].vars
            # A host with ssh arguments may be reached through a jump host: its TCP connect is not ours.
            if is_ssh(hv) and not (hv.get("ansible_ssh_common_args") or hv.get("ansible_ssh_extra_args")):
                try:
                    targets.append(ssh_target(h, hv))
                except (TypeError, ValueError):
                    continue  # a bad ansible_port is reported by the real connect
        pre = Preconnect()
        if pre.start(targets):
            self.session.preconnect = pre

    async def run_playbook(self, playbook: Playbook) -> Summary:
        self.emit(events.run_start(playbook.path, self.options.check))
        self.preconnect(playbook)
        self._plays = playbook.plays
        lock = None
        try:
            if self.options.lock and not self.options.check:
                # Every host's lock before anything is read, if all are free now (never waited for
                # here): then nothing this run reads can be another run's half-done work. The first
                # play names its reads meanwhile; a host's first read waits for this try
                # (`_reads_may_start`).
                lock = RunLock(self, self.options.lock, self.options.lock_timeout, self.options.lock_wait)
                self._first_lock = asyncio.ensure_future(
                    lock.try_now([h for play in playbook.plays for h in self.select(play.hosts)])
                )
            # Read-only preflight plays (facts, refusals) run before any wait for the lock: a host
            # tunnelspec cannot serve is refused in the run's first seconds.
            preflight = [p for p in playbook.plays if p.preflight]
            for play in preflight:
                await self.run_play(play)
            if self._first_lock is not None and not await self._first_lock:
                assert lock is not None
                hosts = [
                    h
                    for play in playbook.plays
                    for h in self.select(play.hosts)
                    if not (self.hosts[h].failed or self.hosts[h].unreachable)
                ]
                await lock.acquire(hosts)
                # Read before the lock, maybe while another run was changing the hosts: read again.
                self._ahead.clear()
                for st in self.hosts.values():
                    if st.conn is not None:
                        st.conn.drop_probes()
            for play in playbook.plays[len(preflight) :]:
                await self.run_play(play)
            self.remember_facts(self.secrets)
        finally:
            if self._first_lock is not None and not self._first_lock.done():
                self._first_lock.cancel()  # a preflight play raised: the try's locks go below
                await asyncio.wait([self._first_lock])
            if lock is not None:
                await lock.release()
            await self.close()
        self.emit(events.recap(self.summary.per_host(), self.summary.exit_code()))
        return self.summary

    async def run_play(self, play: Play) -> None:
        selected = self.select(play.hosts)
        hosts = [h for h in selected if not (self.hosts[h].failed or self.hosts[h].unreachable)]
        self.secrets.extend(secret_values(play.vars))
        self.emit(events.play_start(play.name, hosts))
        if not hosts:
            return
        watched = play.gate.get("earlier_failures") if play.gate else None
        earlier = sorted(
            h
            for h in (self.select(watched) if watched else ())
            if (self.hosts[h].failed or self.hosts[h].unreachable) and not self._spared(h)
        )
        if earlier:
            # A gate that must see every host of a pattern (`earlier_failures: rpc`): one that failed
            # earlier in the run stops the others before this play does anything.
            msg = f"not all hosts reached the gate: {', '.join(earlier)} failed earlier in this run"
            assert play.gate is not None  # `earlier` is empty without a gate
            self.emit(events.gate(play.name, "failed", msg))
            for h in hosts:
                self._fail(h, play.gate.get("name", f"gate {play.gate['kind']}"), msg, play)
            return
        sem = asyncio.Semaphore(max(1, self.options.forks))

        async def one(h):
            async with sem:
                await self.run_host(play, h)

        await asyncio.gather(*(one(h) for h in hosts))
        if play.gate:
            live = [h for h in hosts if not (self.hosts[h].failed or self.hosts[h].unreachable)]
            if len(live) != len([h for h in hosts if not self._spared(h)]):
                # A gate over a partial set of hosts proves nothing: stop the rest too.
                stopped = sorted(h for h in set(hosts) - set(live) if not self._spared(h))
                msg = f"not all hosts reached the gate: {', '.join(stopped)} stopped before it"
                self.emit(events.gate(play.name, "failed", msg))
                for h in live:
                    self._fail(h, play.gate.get("name", f"gate {play.gate['kind']}"), msg, play)
                return
            hv = {h: {**self.hosts[h].vars, **self.hosts[h].facts} for h in live}
            try:
                gate = registry.gate(play.gate["kind"])
                assert gate is not None  # load_playbook refused any other kind
                msg = gate(play.gate, hv)
                self.emit(events.gate(play.name, "ok", msg))
            except TaskFailed as e:
                if self.options.check and self.check_plan.any():
                    # --check: the values compared are what the planned changes would produce.
                    self.emit(
                        events.gate(
                            play.name,
                            "planned",
                            "would be compared after the planned changes: " + str(e).splitlines()[0],
                        )
                    )
                    return
                self.emit(events.gate(play.name, "failed", str(e)))
                for h in live:
                    self._fail(h, play.gate.get("name", f"gate {play.gate['kind']}"), str(e), play, quiet=True)

    def _fail(self, host, task, msg, play, quiet=False):
        self.hosts[host].failed = True
        if not quiet:
            self.emit(events.task_failed(host, task, play.name, msg))
        else:
            self.summary.mark_failed(host)

    async def run_host(self, play: Play, host: str) -> None:
        st = self.hosts[host]
        try:
            conn = await self.connection(host)
        except HostUnreachable as e:
            st.unreachable = True
            self.emit(events.unreachable(host, play.name, str(e)))
            return
        except TunnelspecError as e:
            st.failed = True
            self.emit(events.task_failed(host, "connect", play.name, str(e)))
            return
        # The play's read-only checks in one round trip (with the pending handlers' record, read next).
        named = await self._prefetch(play, host, conn, [pending.load_argv(st.vars, play.name)] if play.handlers else [])
        await self._reads_may_start()  # (`_prefetch` waited before its batch; it may have sent none)
        try:
            # Handlers a killed run of this play notified and never ran (engine/pending.py).
            notified: list[str] = await pending.load(conn, st.vars, play.name) if play.handlers else []
        except HostUnreachable as e:
            st.unreachable = True
            self.emit(events.unreachable(host, play.name, str(e)))
            return
        quiet_since = conn.changes_started  # no command that may change the host ran since
        for i, spec in enumerate(play.tasks):
            if conn.changes_started == quiet_since:
                await self._prefetch_rest(play, i, host, conn, named)
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
                pass  # kept: the handlers run once more next time, no harm

    def _tag_selected(self, spec: TaskSpec) -> bool:
        tags = set(spec.tags)
        if self.options.tags and not (tags & set(self.options.tags)) and "always" not in tags:
            return False
        if self.options.skip_tags and tags & set(self.options.skip_tags):
            return False
        return True


async def run_playbook(
    inventory,
    playbook: Playbook,
    options: RunOptions,
    emit,
    connect_options: ConnectOptions | None = None,
    cluster=None,
) -> Summary:
    run = Run(inventory, options, emit, connect_options, cluster)
    return await run.run_playbook(playbook)
