"""Batched read-only probes for a play on one host: the commands every check of the play will read,
fetched in one round trip before the checks run (connection/probes.py serves them until anything
changes on the host). A mixin of the executor's Run: it reads the run's options, template variables,
tag selection, plays and hosts.

Looking ahead: while nothing has changed on any host of the run, a play's batch also reads the probes
of every later play on that host. The next play then needs no batch of its own as long as nothing has
changed anywhere since (checked when it starts); a no-op run reads each host in one or two batches
instead of one per play, and a probe that several plays read (the listeners, the firewall) runs once.
Anything that may change any host (another host's change may be what a check here reads: an rpc
server restarted drops llama-server's connections on main) ends it: the next play drops what was
read ahead on every host and reads for itself, as without it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tunnelspec.core.templating import evaluate, render_value
from tunnelspec.engine import pending, recall
from tunnelspec.engine.playbook import Play
from tunnelspec.modules import TASKS, Task

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tunnelspec.cluster.model import Cluster
    from tunnelspec.engine.context import RunOptions
    from tunnelspec.engine.executor import HostState
    from tunnelspec.inventory.model import Inventory
    from tunnelspec.engine.playbook import TaskSpec


class Prefetch:
    # What it reads of the run (tunnelspec.engine.executor.Run).
    options: RunOptions
    inventory: Inventory
    hosts: dict[str, HostState]
    cluster: Cluster | None
    template_vars: Callable[..., dict]
    select: Callable[[str], list[str]]
    _tag_selected: Callable[[TaskSpec], bool]
    _reads_may_start: Callable[[], Awaitable[None]]  # before a host's first read (the run lock)
    # The run's plays in order (set by run_playbook; empty: no look-ahead), and per host the count of
    # commands that may change a host, anywhere in the run, when its look-ahead batch ran.
    _plays: Sequence[Play] = ()
    _ahead: dict[str, int]
    _selected: dict[int, frozenset[str]]  # by play: the hosts it selects (`_play_hosts`)
    _recall: dict[str, dict]  # by host: the facts of its last run (`_recalled`)
    _remote: dict[tuple[int, int], dict[str, list[list[str]]]]  # by (play, task): `_remote_probes`

    def _changes_anywhere(self) -> int:
        return sum(st.conn.changes_started for st in self.hosts.values() if st.conn is not None)

    def _play_hosts(self, play: Play) -> frozenset[str]:
        """The hosts `play` selects, worked out once per run (the inventory and --limit do not change
        while it runs; each host's read-ahead asks about every later play)."""
        if id(play) not in self._selected:
            self._selected[id(play)] = frozenset(self.select(play.hosts))
        return self._selected[id(play)]

    def _later_probes(self, play: Play, host: str) -> list[list[str]]:
        """The probes of every play after `play` that runs on `host` (what their first batches would
        read, their pending handlers' record included), named from what is known now."""
        plays = list(self._plays)
        at = next((i for i, p in enumerate(plays) if p is play), None)
        if at is None:
            return []
        out: list[list[str]] = []
        for later in plays[at + 1 :]:
            if host not in self._play_hosts(later):
                continue
            if later.handlers:
                out.append(pending.load_argv(self.hosts[host].vars, later.name))
            variables: dict = {}
            for j in range(len(later.tasks)):
                out.extend(self._task_probes(later, j, host, variables, guess=True) or ())
        for later in plays[at + 1 :]:
            for j in range(len(later.tasks)):
                out.extend(self._remote_probes(later, j).get(host, ()))
        return out

    def _remote_probes(self, play: Play, j: int) -> dict[str, list[list[str]]]:
        """What task j of `play` reads on other hosts' connections (`Task.remote_probes`: main's
        route to each node, each node's state for main's generation record), by the host read, over
        every host the play runs it on. Worked out once per run."""
        key = (id(play), j)
        if key in self._remote:
            return self._remote[key]
        spec = play.tasks[j]
        cls = TASKS.get(spec.module)
        out: dict[str, list[list[str]]] = {}
        if cls is None or cls.remote_probes is Task.remote_probes or not self._tag_selected(spec):
            self._remote[key] = out
            return out
        for h in sorted(self._play_hosts(play)):
            variables: dict = {}
            self._values(play, h, variables, guess=True)
            for values in (variables.get("g"), variables.get("v")):
                task = self._task_with(cls, spec, values) if values is not None else None
                if task is not None:
                    for target, argvs in task.remote_probes(self.cluster, h).items():
                        out.setdefault(target, []).extend(a for a in argvs if a not in out.get(target, ()))
                    break
        self._remote[key] = out
        return out

    def _recalled(self, host: str) -> dict:
        """The facts `host` registered in its last runs from this inventory (engine/recall.py),
        loaded once per run."""
        if host not in self._recall:
            self._recall[host] = recall.load(host, self._recall_ident())
        return self._recall[host]

    def _recall_ident(self) -> tuple[str, ...]:
        return (str(self.inventory.path.resolve()),)

    def remember_facts(self, known_secrets: list[str]) -> None:
        """Keep each host's registered facts for the next run's read-ahead (not after `--check`, whose
        facts are plans, nor for a host that failed or was not reached)."""
        if self.options.check:
            return
        for host, st in self.hosts.items():
            if st.failed or st.unreachable or st.conn is None or not st.facts:
                continue
            recall.save(host, self._recall_ident(), st.facts, known_secrets, self._recalled(host))

    def _task_probes(
        self, play: Play, j: int, host: str, variables: dict, guess: bool = False
    ) -> list[list[str]] | None:
        """The read-only commands task j's check names (`Task.probes()`); None when its args cannot be
        rendered yet (they use a fact an earlier task registers) — unless `guess`: then they are
        named from the facts the host registered in its last run where this run has not registered
        them yet (engine/recall.py; a wrong guess is a read for nothing). None of them for a task
        whose `when` is already false (an rpc node's turn of a main-only task): it is skipped.
        `variables`: filled on first need."""
        spec = play.tasks[j]
        cls = TASKS.get(spec.module)
        if cls is None or not self._tag_selected(spec):
            return []
        if not _names_probes(cls):
            return []
        self._values(play, host, variables, guess)
        plain = self._probes_with(cls, spec, variables["v"], host)
        got = self._guessed(play, j, host, variables) if guess else None
        if got is None or plain is None:
            return got if plain is None else plain
        # Both: the guess's, and what this play's own batch will name without it (a `when` on a fact
        # not registered yet is not skipped there), so that batch finds them read.
        return [*got, *(a for a in plain if a not in got)]

    def _guessed(self, play: Play, j: int, host: str, variables: dict) -> list[list[str]] | None:
        """Task j's probes as the facts of the host's last run name them (`_values`' "g"); None when
        there is nothing to guess with or they cannot be rendered."""
        spec = play.tasks[j]
        cls = TASKS.get(spec.module)
        self._values(play, host, variables, guess=True)
        if cls is None or not _names_probes(cls) or variables["g"] is None or not self._tag_selected(spec):
            return None
        return self._probes_with(cls, spec, variables["g"], host)

    def _values(self, play: Play, host: str, variables: dict, guess: bool) -> None:
        """Fills `variables`: "v" this run's template values for `host`; with `guess`, "g" the same
        with the facts of the host's last run that this run has not registered yet (as registered
        facts are: engine/executor.py `template_vars`), and every host's in `hostvars` (None: no
        last run's facts anywhere, nothing to guess)."""
        if "v" not in variables:
            variables["v"] = self.template_vars(host, play)
        if guess and "g" not in variables:
            missing = {k: v for k, v in self._recalled(host).items() if k not in self.hosts[host].facts}
            guessing = missing or any(self._recall.values())
            variables["g"] = {**variables["v"], **missing, "hostvars": _Guessed(self)} if guessing else None

    def _task_with(self, cls, spec: TaskSpec, values: dict) -> Task | None:
        """The task as these values render it; None when skipped by its `when` or not renderable."""
        try:
            if self._skipped(spec, values):
                return None
            return cls(cls.validate(render_value(spec.args, values)))
        except Exception:  # noqa: BLE001 - reported by the task itself when it runs
            return None

    def _probes_with(self, cls, spec: TaskSpec, values: dict, host: str) -> list[list[str]] | None:
        try:
            if self._skipped(spec, values):
                return []
            task = cls(cls.validate(render_value(spec.args, values)))
            out = task.cluster_probes(self.cluster) if cls.reads_cluster else task.probes()
            if cls.connection_probes is not Task.connection_probes:
                conn = self.hosts[host].conn
                out = [*out, *(task.connection_probes(conn) if conn is not None else ())]
            return out
        except Exception:  # noqa: BLE001 - reported by the task itself when it runs
            return None

    @staticmethod
    def _skipped(spec: TaskSpec, variables: dict) -> bool:
        """A `when` that is false now. One that cannot be evaluated yet (a fact registered later in
        the play) is not: its probes are named. Either way only the batch is concerned: a check whose
        probe was left out, or whose `when` turned true since, runs its command itself."""
        for cond in spec.when:
            try:
                if not evaluate(cond, variables):
                    return True
            except Exception:  # noqa: BLE001 - the task reports it when it runs
                return False
        return False

    async def _prefetch_rest(self, play: Play, i: int, host: str, conn, named: list) -> None:
        """While nothing has changed on the host in this play, a check whose probes the play's first
        batch could not name (its args use a fact an earlier task registered) gets them, and those
        of the tasks after it, in one more batch: a no-op play stays a few round trips however many
        of its tasks depend on registered facts. While nothing has changed anywhere, that batch also
        reads ahead for the later plays, as the first one did. `named`: per task, the probes the first batch named
        (None: its args could not be rendered then); only those are rendered again."""
        variables: dict = {}  # rendered now: facts registered since the first batch

        def probes_of(j: int) -> list[list[str]]:
            got = named[j] if named[j] is not None else self._task_probes(play, j, host, variables)
            return got or []

        mine = probes_of(i)
        if not mine or conn.probes_tried(mine):
            return
        argvs = [*mine, *(a for j in range(i + 1, len(play.tasks)) for a in probes_of(j))]
        # Still reading ahead (nothing changed anywhere): the later plays' probes too, named now that
        # the facts this play registered so far (a model's path, the server's command line) render.
        now = self._changes_anywhere()
        later = self._later_probes(play, host) if now == 0 and self._plays else []
        try:
            if await conn.prefetch([*argvs, *later], more=True) and later:
                self._ahead[host] = now
        except Exception:  # noqa: BLE001 - the checks run their commands themselves
            pass

    async def _prefetch(self, play: Play, host: str, conn, extra: Sequence[list[str]] = ()) -> list:
        """The read-only commands of every check of this play (`Task.probes()`, optional) in one round
        trip instead of one each; the connection serves them until anything changes on the host
        (connection/probes.py). Best effort: a task whose args cannot be rendered yet (they use a
        fact registered later in the play) or a failed batch just means its check reads for itself.
        Returns, per task, the probes it named (None: its args could not be rendered yet)."""
        variables: dict = {}
        named = [self._task_probes(play, j, host, variables) for j in range(len(play.tasks))]
        argvs = [*extra, *(a for mine in named if mine for a in mine)]
        now = self._changes_anywhere()
        if now == 0 and self._plays:
            # Still reading ahead: what this play's tasks will read once the facts an earlier task
            # registers are in, guessed from the host's last run (`named` is unchanged: the play's
            # second batch, if one is needed, renders them from this run's facts).
            have = {tuple(a) for a in argvs}
            for j in range(len(play.tasks)):
                for a in self._guessed(play, j, host, variables) or ():
                    if tuple(a) not in have:
                        have.add(tuple(a))
                        argvs.append(a)
        mark = self._ahead.get(host)
        if mark is not None and mark != now:
            del self._ahead[host]
            conn.drop_probes()  # read ahead before a change somewhere: never served now
            mark = None
        if mark is not None and conn.probes_tried(argvs):
            return named  # an earlier play's batch read them, and no host changed since
        # Looking ahead only while the whole run has changed nothing: once a run changes hosts, a
        # later play's reads would mostly be read again anyway.
        later = self._later_probes(play, host) if now == 0 and self._plays else []
        if len(argvs) + len(later) > 1:
            await self._reads_may_start()
            try:
                # Still valid read-ahead results stay; only what they lack is read.
                if await conn.prefetch([*argvs, *later], more=mark is not None) and later:
                    self._ahead[host] = now
            except Exception:  # noqa: BLE001 - same: the checks run their commands themselves
                pass
        return named


def _names_probes(cls) -> bool:
    """Whether a task class names any read for a batch (else its args need no rendering here)."""
    return not (
        cls.probes is Task.probes
        and cls.cluster_probes is Task.cluster_probes
        and cls.connection_probes is Task.connection_probes
    )


class _Guessed(Mapping):
    """`hostvars` for a guess: each host's vars and facts, and the facts of its last run that this
    run has not registered yet (a node's task naming what main registers: its tunnel key)."""

    def __init__(self, run: Prefetch) -> None:
        self._run = run

    def __getitem__(self, name: str) -> dict:
        st = self._run.hosts[name]
        return {**st.vars, **self._run._recalled(name), **st.facts}

    def __iter__(self):
        return iter(self._run.hosts)

    def __len__(self) -> int:
        return len(self._run.hosts)
