"""One task on one host, each step on its own: render its arguments, check (read-only), apply,
check again (which must be clean), classify an error (the task's, the host's, or a bug) and report
the result. A mixin of the executor's Run, which iterates the plays."""

from __future__ import annotations

import functools
import time
import traceback
from typing import TYPE_CHECKING

from tunnelspec.core import testhooks
from tunnelspec.core.errors import ArgumentError, HostUnreachable, TaskFailed, TunnelspecError, UsageError
from tunnelspec.core.templating import TemplateError, evaluate, render_value
from tunnelspec.engine import pending
from tunnelspec.engine.checkplan import CheckPlan
from tunnelspec.engine.context import HostContext
from tunnelspec.engine.playbook import Play, TaskSpec
from tunnelspec.modules import TASKS, Change, Task
from tunnelspec.reporting import events

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tunnelspec.cluster.model import Cluster
    from tunnelspec.connection import Connection
    from tunnelspec.engine.context import RunOptions
    from tunnelspec.engine.executor import HostState
    from tunnelspec.inventory.model import Inventory
    from tunnelspec.reporting.summary import Summary


class TaskExecution:
    # What it reads of the run (tunnelspec.engine.executor.Run).
    options: RunOptions
    check_plan: CheckPlan
    cluster: Cluster | None
    inventory: Inventory
    memo: dict
    secrets: list[str]
    hosts: dict[str, HostState]
    summary: Summary
    emit: Callable[[dict], None]
    connection: Callable[[str], Awaitable[Connection]]
    template_vars: Callable[..., dict]
    _tag_selected: Callable[[TaskSpec], bool]

    async def _run_task(self, play: Play, spec: TaskSpec, host: str, conn, notified: list, is_handler: bool) -> bool:
        """Returns False when the host must stop (failed or unreachable)."""
        if not self._tag_selected(spec):
            return True
        st = self.hosts[host]
        result = functools.partial(
            events.task_result, host, spec.name, play.name, module=spec.module, no_log=spec.no_log
        )
        variables = self.template_vars(host, play)
        started = time.monotonic()
        try:
            false = next((c for c in spec.when if not evaluate(c, variables)), None)
            if false is not None:
                self.emit(result("skipped", f"condition false: {false}"))
                return True
            task = TASKS[spec.module].build(render_value(spec.args, variables))
            ctx = self._context(host, conn, variables, spec, task)
            status, ch = await self._converge(task, ctx, spec, play)
            if status == "changed":
                notified.extend(spec.notify)
            if spec.register:
                ctx.register(spec.register, {"changed": status == "changed", "msg": ch.msg})
            self.emit(self._result(result, spec, status, ch, time.monotonic() - started))
            if status == "changed" and self.options.check:
                self.check_plan.record(host, spec.name)
            return True
        except HostUnreachable as e:
            st.unreachable = True
            self.emit(events.unreachable(host, play.name, str(e), task=spec.name))
            return False
        except (ArgumentError, TemplateError) as e:
            # A mistake in the playbook (an argument, a template): say where to fix it.
            if isinstance(e, TemplateError) and self._planned(result, spec, host, e, started):
                return True
            st.failed = True
            self.emit(result("failed", f"{e} ({spec.file}:{spec.line})"))
            return False
        except TunnelspecError as e:  # the task failed (TaskFailed) or refused its input (UsageError)
            if isinstance(e, TaskFailed) and self._planned(result, spec, host, e, started):
                return True
            st.failed = True
            # Refused input in a preflight play (read-only, before anything changes): the inventory
            # is what must change, so the run exits 2, as for any input error.
            if play.preflight and isinstance(e, UsageError):
                self.summary.refusals.append(str(e))
            self.emit(result("failed", str(e)))
            return False
        except Exception as e:  # noqa: BLE001 - a bug in one task must not take down other hosts
            st.failed = True
            tb = traceback.format_exc(limit=6) if self.options.verbose else ""
            self.emit(result("failed", f"internal error: {type(e).__name__}: {e}\n{tb}".rstrip()))
            return False

    def _planned(self, result, spec: TaskSpec, host: str, e: Exception, started: float) -> bool:
        """--check: a check that failed after earlier would-changes needs what they create; it is
        reported as a planned change depending on them and the host goes on (engine/checkplan.py)."""
        after = self.check_plan.earlier(host) if self.options.check else []
        if not after:
            return False
        self.check_plan.record(host, spec.name)
        self.emit(
            result(
                "changed",
                CheckPlan.message(after, str(e)),
                duration=time.monotonic() - started,
                would_change=True,
                after=after,
            )
        )
        if spec.register:
            self.hosts[host].facts[spec.register] = {"changed": True, "msg": "planned"}
        return True

    def _context(self, host: str, conn, variables: dict, spec: TaskSpec, task: Task) -> HostContext:
        declared = type(task).reads_cluster
        return HostContext(
            host=host,
            conn=conn,
            vars=variables,
            facts=self.hosts[host].facts,
            options=self.options,
            emit=self.emit,
            task_name=spec.name,
            secrets=self.secrets,
            cluster=self.cluster if declared else None,
            inventory_dir=self.inventory.path.parent,
            connect=self.connection,
            memo=self.memo,
            declares_cluster=declared,
        )

    async def _converge(self, task: Task, ctx: HostContext, spec: TaskSpec, play: Play) -> tuple[str, Change]:
        """check → (unless --check) apply → check again, which must then be clean. The handlers a
        change will notify are recorded on the host before the apply (engine/pending.py)."""
        for s in task.secrets():
            ctx.add_secret(s)
        ch = await task.check(ctx)
        if not ch.changed:
            return "ok", ch
        if not self.options.check:
            if spec.notify:
                await pending.mark(ctx.conn, self.hosts[ctx.host].vars, play.name, spec.notify)
            testhooks.reached(spec.name, "start")
            await task.apply(ctx, ch)
            testhooks.reached(spec.name, "apply")
            if not task.is_handler_only(task.p):
                again = await task.check(ctx)
                if again.changed:
                    raise TaskFailed(f"not convergent: after apply the check still reports: {again.msg}")
        return "changed", ch

    def _result(self, result, spec: TaskSpec, status: str, ch: Change, duration: float) -> dict:
        changed = status == "changed"
        show_diff = changed and ch.diff is not None and (self.options.diff or self.options.check) and not spec.no_log
        return result(
            status,
            ch.msg,
            duration=duration,
            diff=ch.diff if show_diff else None,
            would_change=changed and self.options.check,
        )
