"""What every task is: declared arguments, a read-only check, an apply.

The executor runs check → (apply → check again, which must be clean). A task whose action cannot be
idempotent (a restart, a daemon-reload) sets `handler_only = True` and runs only when notified.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tunnelspec.core.errors import ArgumentError, TaskFailed
from tunnelspec.core.booleans import parse_bool

_MISSING = object()


@dataclass
class Arg:
    type: type | tuple = str
    required: bool = False
    default: Any = None
    choices: tuple | None = None
    secret: bool = False
    help: str = ""  # one line for docs/modules.md (generated: python -m tunnelspec.commands.modules_doc)


@dataclass
class Diff:
    before: str
    after: str
    path: str = ""


@dataclass
class Change:
    changed: bool
    msg: str
    diff: Diff | None = None
    data: dict = field(default_factory=dict)


def wait_budget(ctx, timeout: float) -> float:
    """How long a proof polls: its timeout after a real start (a handler restarted the service a
    moment ago), one look under --check, where nothing was started and waiting shows nothing new."""
    return 0 if ctx.check_mode else timeout


def ok(msg: str) -> Change:
    return Change(False, msg)


def change(msg: str, diff: Diff | None = None, **data) -> Change:
    return Change(True, msg, diff, data)


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    TASKS[cls.module] = cls
    return cls


def _coerce(name: str, spec: Arg, value: Any):
    if value is None:
        return None
    types = spec.type if isinstance(spec.type, tuple) else (spec.type,)
    if isinstance(value, types):
        out = value
    elif bool in types and isinstance(value, str) and parse_bool(value) is not None:
        out = parse_bool(value)
    elif int in types and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        out = int(value)
    elif str in types and isinstance(value, (int, float)) and not isinstance(value, bool):
        out = str(value)
    elif list in types and isinstance(value, str):
        out = [value]
    else:
        raise ArgumentError(
            f"argument {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}"
        )
    if spec.choices and out not in spec.choices:
        raise ArgumentError(f"argument {name!r} must be one of {', '.join(map(str, spec.choices))}, got {out!r}")
    return out


class Task:
    module: ClassVar[str] = ""
    args: ClassVar[dict[str, Arg]] = {}
    handler_only: ClassVar[bool] = False
    # Tasks that only observe (verify steps) report ok/failed and never "changed".
    read_only: ClassVar[bool] = False
    # A task's inputs are its declared `args` and, when it declares `reads_cluster`, the typed,
    # read-only cluster view (`ctx.cluster`, `ctx.require_cluster()`); a task that does not declare it
    # is given no cluster (engine/task_exec.py), so what a task reads is what its class says.
    reads_cluster: ClassVar[bool] = False

    def __init__(self, params: dict):
        self.p = params

    @classmethod
    def is_handler_only(cls, params: dict) -> bool:
        """Whether these arguments make a task that cannot be idempotent (`handler_only`)."""
        return cls.handler_only

    @classmethod
    def unknown_args(cls, params: dict) -> list[str]:
        return sorted(set(params) - set(cls.args))

    @classmethod
    def validate(cls, params: dict) -> dict:
        """Type-check templated params and fill defaults; raises ArgumentError naming the argument."""
        out = {}
        for name, spec in cls.args.items():
            value = params.get(name, _MISSING)
            if value is _MISSING or value is None:
                if spec.required:
                    raise ArgumentError(f"missing required argument {name!r}")
                out[name] = spec.default
                continue
            out[name] = _coerce(name, spec, value)
        extra = cls.unknown_args(params)
        if extra:
            raise ArgumentError(
                f"unknown argument(s) {', '.join(map(repr, extra))} for module {cls.module!r}; "
                f"known: {', '.join(sorted(cls.args))}"
            )
        return out

    @classmethod
    def build(cls, params: dict) -> Task:
        """A task from raw params, validated: how the executor and tasks that use other tasks make one."""
        return cls(cls.validate(params))

    def probes(self) -> list[list[str]]:
        """The read-only commands `check` will run (`conn.probe`), so the executor can batch the
        checks of a play into one round trip per host (connection/probes.py). None by default."""
        return []

    def cluster_probes(self, cluster) -> list[list[str]]:
        """The same, for a task that declares `reads_cluster` and needs the cluster to name them (a
        unit per rpc node, a tunnel's port): the executor passes the run's cluster (None without
        one). By default `probes()`."""
        return self.probes()

    def connection_probes(self, conn) -> list[list[str]]:
        """Read-only commands `check` will run whose arguments come from what the controller keeps for
        this connection (a cache keyed by it), named for the play's batch beside `probes()`. A probe
        `check` runs as the login (`become=False`) is served from the batch only where the two are
        the same (no sudo). None by default."""
        return []

    def remote_probes(self, cluster, host: str) -> dict[str, list[list[str]]]:
        """Read-only commands `check` runs on *other* hosts' connections (`ctx.connection_to`) when it
        runs on `host`, by the host they run on: each is read ahead in that host's batch. None by
        default."""
        return {}

    def secrets(self) -> list[str]:
        return [str(self.p[n]) for n, a in self.args.items() if a.secret and self.p.get(n)]

    async def check(self, ctx) -> Change:  # pragma: no cover - abstract
        raise NotImplementedError

    async def apply(self, ctx, change: Change) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def fail(msg: str) -> TaskFailed:
    return TaskFailed(msg)
