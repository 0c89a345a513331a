"""What a task sees of the run: its host, connection, variables and a way to report progress."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tunnelspec.core.errors import TaskFailed
from tunnelspec.reporting import events
from tunnelspec.engine.heartbeat import HEARTBEAT_EVERY, Heartbeat

if TYPE_CHECKING:
    from tunnelspec.cluster.model import Cluster
    from tunnelspec.connection.base import Connection


@dataclass
class RunOptions:
    check: bool = False
    diff: bool = False
    limit: str | None = None
    tags: list[str] = field(default_factory=list)
    skip_tags: list[str] = field(default_factory=list)
    forks: int = 20
    verbose: int = 0
    extra_vars: dict = field(default_factory=dict)
    # Named risks the command line accepted (deploy's --allow-vulnerable-llama: "vulnerable-llama"); the
    # task that owns a name reads it, the engine only carries the set.
    accepted: frozenset[str] = frozenset()
    lock: str = ""  # the command taking the run lock ("" = none: read-only, --check)
    lock_timeout: float = 1800  # seconds to wait for another run's lock
    lock_wait: bool = True  # False: --no-wait, exit 5 at once when locked


async def _no_other_hosts(name: str) -> NoReturn:
    raise TaskFailed(f"this task needs a connection to {name}, and runs without a playbook run")


@dataclass
class HostContext:
    """Everything a task may use, and nothing of the engine: its host and connection, variables and
    facts, the typed cluster, the inventory's directory (relative paths of the inventory's author
    start there), other hosts' connections, and a memo shared by the run's tasks."""

    host: str
    conn: Connection
    vars: dict  # templating variables for this host (host vars + hostvars + groups + facts)
    facts: dict  # registered facts of this host (shared with hostvars[host])
    options: RunOptions
    emit: Callable[[dict], None]
    task_name: str = ""
    secrets: list = field(default_factory=list)
    cluster: Cluster | None = None  # when the inventory is a cluster
    inventory_dir: Path = field(default_factory=Path.cwd)
    connect: Callable[[str], Awaitable[Connection]] = _no_other_hosts  # the run's (opened once, reused)
    # One dict per run, the same for every host and task: what tasks must agree on across hosts
    # (e.g. which controller file goes to which upload path). Keys are the task module's name.
    memo: dict = field(default_factory=dict)
    # The running task's class declares the cluster as an input (modules/base.py, `reads_cluster`).
    declares_cluster: bool = True

    @property
    def check_mode(self) -> bool:
        return self.options.check

    async def connection_to(self, host: str) -> Connection:
        """The run's connection to another inventory host (for cross-host checks)."""
        return await self.connect(host)

    def require_cluster(self) -> Cluster:
        if not self.declares_cluster:
            raise TaskFailed(
                f"internal: {self.task_name or 'this task'} reads the cluster, and its module does not "
                "declare reads_cluster"
            )
        if self.cluster is None:
            raise TaskFailed(f"{self.task_name or 'this task'} needs a cluster inventory ([main] and [rpc] groups)")
        return self.cluster

    def register(self, key: str, value: Any) -> None:
        self.facts[key] = value
        self.vars[key] = value

    def progress(self, msg: str, **data) -> None:
        self.emit(events.progress(self.host, self.task_name, msg, **data))

    def heartbeat(self, what: str, every: float | None = None):
        """`async with ctx.heartbeat("git clone …"):` — a progress line now, then one every 10 s
        with the time taken, until the body ends (engine/heartbeat.py)."""
        return Heartbeat(self.progress, what, every or HEARTBEAT_EVERY)

    def add_secret(self, value: str) -> None:
        if value:
            self.secrets.append(value)
