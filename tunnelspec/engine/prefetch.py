"""Batched read-only probes for a play on one host: the commands every check of the play will read,
fetched in one round trip before the checks run (connection/probes.py serves them until anything
changes on the host). A mixin of the executor's Run: it reads the run's options, template variables
and tag selection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tunnelspec.core.templating import evaluate, render_value
from tunnelspec.engine.playbook import Play
from tunnelspec.modules import TASKS, Task

if TYPE_CHECKING:
    from collections.abc import Callable

    from tunnelspec.engine.context import RunOptions
    from tunnelspec.engine.playbook import TaskSpec


class Prefetch:
    # What it reads of the run (tunnelspec.engine.executor.Run).
    options: RunOptions
    template_vars: Callable[..., dict]
    _tag_selected: Callable[[TaskSpec], bool]

    def _task_probes(self, play: Play, j: int, host: str, variables: dict) -> list[list[str]] | None:
        """The read-only commands task j's check names (`Task.probes()`); None when its args cannot be
        rendered yet (they use a fact an earlier task registers). None of them for a task whose `when`
        is already false (an rpc node's turn of a main-only task): it is skipped. `variables`: filled
        on first need."""
        spec = play.tasks[j]
        cls = TASKS.get(spec.module)
        if cls is None or cls.probes is Task.probes or not self._tag_selected(spec):
            return []
        try:
            if "v" not in variables:
                variables["v"] = self.template_vars(host, play)
            if self._skipped(spec, variables["v"]):
                return []
            return cls(cls.validate(render_value(spec.args, variables["v"]))).probes()
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
        of its tasks depend on registered facts. `named`: per task, the probes the first batch named
        (None: its args could not be rendered then); only those are rendered again."""
        variables: dict = {}  # rendered now: facts registered since the first batch

        def probes_of(j: int) -> list[list[str]]:
            got = named[j] if named[j] is not None else self._task_probes(play, j, host, variables)
            return got or []

        mine = probes_of(i)
        if not mine or conn.probes_tried(mine):
            return
        argvs = [*mine, *(a for j in range(i + 1, len(play.tasks)) for a in probes_of(j))]
        try:
            await conn.prefetch(argvs, more=True)
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
        if len(argvs) > 1:
            try:
                await conn.prefetch(argvs)
            except Exception:  # noqa: BLE001 - same: the checks run their commands themselves
                pass
        return named
