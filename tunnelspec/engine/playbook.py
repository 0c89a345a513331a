"""Playbooks: YAML plays of ordered tasks. Everything is validated at load time, with file:line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tunnelspec.engine.yamlload import LineDict, load_yaml
from tunnelspec.core.errors import PlaybookError
from tunnelspec.engine import registry
from difflib import get_close_matches

_TASK_KEYS = {"name", "when", "tags", "notify", "register", "listen", "no_log"}
_PLAY_KEYS = {"name", "hosts", "tasks", "handlers", "vars", "tags", "gate", "serial_gate", "preflight"}


@dataclass
class TaskSpec:
    name: str
    module: str
    args: dict
    file: str
    line: int
    when: list = field(default_factory=list)
    tags: list = field(default_factory=list)
    notify: list = field(default_factory=list)
    register: str | None = None
    listen: list = field(default_factory=list)
    no_log: bool = False


@dataclass
class Play:
    name: str
    hosts: str
    tasks: list[TaskSpec]
    handlers: list[TaskSpec]
    vars: dict
    tags: list
    gate: dict | None
    file: str
    line: int
    # Read-only plays that run before the run lock (engine/runlock.py): facts and refusals. They come
    # first in a playbook, and every task in them must be read-only.
    preflight: bool = False


@dataclass
class Playbook:
    path: str
    plays: list[Play]


def _as_list(v) -> list:
    if v is None:
        return []
    return list(v) if isinstance(v, list) else [v]


def _task(d, file: str, play_tags: list, is_handler: bool, list_line: int | None = None) -> TaskSpec:
    # A scalar entry carries no line of its own: point at its list.
    line = getattr(d, "line", None) or list_line
    if not isinstance(d, dict):
        raise PlaybookError("a task must be a mapping", file, line)
    modules = [k for k in d if k not in _TASK_KEYS]
    if not modules:
        raise PlaybookError("task has no module (e.g. `file:`, `template:`, `command:`)", file, line)
    if len(modules) > 1:
        unknown = [m for m in modules if registry.task_class(m) is None]
        hint = f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else f"several modules {modules}"
        raise PlaybookError(f"{hint}: a task has exactly one module", file, line)
    module = modules[0]
    mline = d.key_lines.get(module, line) if isinstance(d, LineDict) else line
    cls = registry.task_class(module)
    if cls is None:
        close = get_close_matches(module, registry.task_kinds(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise PlaybookError(f"unknown module {module!r}{hint}", file, mline)
    args = d[module] or {}
    if not isinstance(args, dict):
        raise PlaybookError(f"arguments of {module!r} must be a mapping", file, mline)
    extra = cls.unknown_args(args)
    if extra:
        bad = extra[0]
        bline = args.key_lines.get(bad, mline) if isinstance(args, LineDict) else mline
        raise PlaybookError(
            f"unknown argument {bad!r} for module {module!r}; known: {', '.join(sorted(cls.args))}", file, bline
        )
    missing = [n for n, a in cls.args.items() if a.required and n not in args]
    if missing:
        raise PlaybookError(f"module {module!r} needs argument {missing[0]!r}", file, mline)
    if cls.is_handler_only(args) and not is_handler:
        raise PlaybookError(f"module {module!r} is not idempotent and may only be used as a handler", file, mline)
    name = str(d.get("name") or module)
    return TaskSpec(
        name=name,
        module=module,
        args=dict(args),
        file=file,
        line=line or 0,
        when=_as_list(d.get("when")),
        tags=_as_list(d.get("tags")) + play_tags,
        notify=[str(n) for n in _as_list(d.get("notify"))],
        register=d.get("register"),
        listen=[str(x) for x in _as_list(d.get("listen"))],
        no_log=bool(d.get("no_log", False)),
    )


def load_playbook(path: str | Path) -> Playbook:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PlaybookError(f"cannot read playbook: {e.strerror}", str(path)) from None
    except UnicodeDecodeError as e:
        raise PlaybookError(f"not a text file (byte {e.start} is not UTF-8); a playbook is YAML", str(path)) from None
    data = load_yaml(text, str(path))
    file = str(path)
    if not isinstance(data, list):
        raise PlaybookError("a playbook is a list of plays", file, getattr(data, "line", 1))
    plays = []
    for p in data:
        line = getattr(p, "line", None)
        if not isinstance(p, dict):
            raise PlaybookError("a play must be a mapping", file, line)
        assert isinstance(p, LineDict)  # load_yaml builds every mapping as a LineDict
        if "import_playbook" in p:
            # Plays of another file, in place (paths relative to this playbook).
            if set(p) - {"import_playbook", "name"}:
                raise PlaybookError("import_playbook takes no other keys", file, line)
            sub = path.parent / str(p["import_playbook"])
            if not sub.exists():
                raise PlaybookError(f"imported playbook {p['import_playbook']!r} not found", file, line)
            plays.extend(load_playbook(sub).plays)
            continue
        unknown = set(p) - _PLAY_KEYS
        if unknown:
            k = sorted(unknown)[0]
            raise PlaybookError(f"unknown play key {k!r}", file, p.key_lines.get(k, line))
        if "hosts" not in p:
            raise PlaybookError("play has no 'hosts'", file, line)
        tags = [str(t) for t in _as_list(p.get("tags"))]
        tasks = [_task(t, file, tags, False, p.key_lines.get("tasks")) for t in _as_list(p.get("tasks"))]
        handlers = [_task(t, file, tags, True, p.key_lines.get("handlers")) for t in _as_list(p.get("handlers"))]
        names = {h.name for h in handlers} | {x for h in handlers for x in h.listen}
        for t in tasks + handlers:
            for n in t.notify:
                if n not in names:
                    raise PlaybookError(f"task {t.name!r} notifies unknown handler {n!r}", file, t.line)
        gate = p.get("gate")
        if gate is not None:
            if not isinstance(gate, dict) or registry.gate(str(gate.get("kind"))) is None:
                raise PlaybookError(
                    f"gate must be a mapping with kind one of {registry.gate_kinds()}",
                    file,
                    p.key_lines.get("gate", line),
                )
        preflight = p.get("preflight", False)
        if not isinstance(preflight, bool):
            raise PlaybookError("preflight must be true or false", file, p.key_lines.get("preflight", line))
        if preflight and (handlers or any(t.notify for t in tasks)):
            raise PlaybookError("a preflight play is read-only: no handlers, no notify", file, line)
        if preflight and plays and not plays[-1].preflight:
            raise PlaybookError("a preflight play must come before every other play", file, line)
        plays.append(
            Play(
                name=str(p.get("name") or p["hosts"]),
                hosts=str(p["hosts"]),
                tasks=tasks,
                handlers=handlers,
                vars=dict(p.get("vars") or {}),
                tags=tags,
                gate=gate,
                file=file,
                line=line or 0,
                preflight=preflight,
            )
        )
    return Playbook(str(path), plays)


def builtin_playbook(name: str) -> Path:
    """Playbooks shipped with the package (tunnelspec/data/playbooks links to the repo's playbooks/)."""
    here = Path(__file__).resolve().parent.parent
    cand = here / "data" / "playbooks" / name
    if cand.exists():
        return cand
    raise PlaybookError(f"built-in playbook {name!r} not found", name)
