"""What a task sees of the run: its host, connection, variables and a way to report progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


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
    allow_vulnerable_llama: bool = False
    lock: str = ""                 # the command taking the run lock ("" = none: read-only, --check)
    lock_timeout: float = 1800     # seconds to wait for another run's lock
    lock_wait: bool = True         # False: --no-wait, exit 5 at once when locked


@dataclass
class HostContext:
    host: str
    conn: Any                      # tunnelspec.connection.Connection
    vars: dict                     # templating variables for this host (host vars + hostvars + groups + facts)
    facts: dict                    # registered facts of this host (shared with hostvars[host])
    options: RunOptions
    emit: Callable[[dict], None]
    task_name: str = ""
    secrets: list = field(default_factory=list)
    controller: Any = None         # the run (for cross-host lookups, the inventory, the cluster)

    @property
    def check_mode(self) -> bool:
        return self.options.check

    def register(self, key: str, value: Any) -> None:
        self.facts[key] = value
        self.vars[key] = value

    def progress(self, msg: str, **data) -> None:
        self.emit({"event": "progress", "host": self.host, "task": self.task_name, "msg": msg, **data})

    def add_secret(self, value: str) -> None:
        if value:
            self.secrets.append(value)
