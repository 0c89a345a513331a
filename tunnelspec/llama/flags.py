"""Build-aware llama-server flags: pure parsers of `--help`, `--version` and `--list-devices` output,
and the choice of flag spellings a given build understands.

llama.cpp renames flags often (`-md` → `--spec-draft-model`, `--draft-max` → `--spec-draft-n-max`,
`--spec-type` appeared and became mandatory for a draft) and keeps removed ones in `--help` with
"the argument has been removed": a flag is supported only if the build's own help lists it *and*
does not call it removed. A flag the build lacks is refused before any unit is written.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama.devices import Device, parse_device_line

# ---- --help ----------------------------------------------------------------------------------

# An option line starts in column 0 with "-": "-md,   --spec-draft-model, --model-draft FNAME  help".
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z0-9][A-Za-z0-9_-]*)")
_REMOVED = "the argument has been removed"


@dataclass(frozen=True)
class HelpOption:
    names: tuple[str, ...]  # every spelling, in help order (short alias usually first)
    value_hint: str  # "FNAME", "[none|draft-simple|...]", "" for a switch
    help: str  # the description, continuation lines joined
    removed: bool


@dataclass
class ServerHelp:
    """The options one llama-server build accepts, from its `--help`."""

    build: str = "unknown build"  # shown in errors: e.g. "0.5.0-dev (build 0, commit 8c22f3ff0)"
    options: list[HelpOption] = field(default_factory=list)
    # Every spelling's option, built on first use and again when options were added since.
    _index: tuple[int, dict[str, HelpOption]] = field(default=(-1, {}), init=False, repr=False, compare=False)

    def _by_name(self) -> dict[str, HelpOption]:
        if self._index[0] != len(self.options):
            self._index = (len(self.options), {n: o for o in self.options for n in o.names})
        return self._index[1]

    def option(self, name: str) -> HelpOption | None:
        opt = self._by_name().get(name)
        return opt if opt is not None and not opt.removed else None

    def supports(self, name: str) -> bool:
        return self.option(name) is not None

    def aliases(self, name: str) -> tuple[str, ...]:
        opt = self.option(name)
        return opt.names if opt else ()

    def pick(self, *candidates: str) -> str | None:
        """The first candidate spelling this build supports."""
        return next((c for c in candidates if self.supports(c)), None)

    def require(self, *candidates: str) -> str:
        found = self.pick(*candidates)
        if found is None:
            spelled = " / ".join(candidates)
            opt = self._by_name().get(candidates[0])
            why = "removed in" if opt is not None and opt.removed else "not supported by"
            raise TaskFailed(f"llama-server option {spelled} is {why} this build ({self.build})")
        return found

    def check_argv(self, argv: list[str]) -> None:
        """Refuse any option in `argv` (a llama-server command line) the build does not accept."""
        for arg in argv[1:]:
            if arg.startswith("-") and not _is_number(arg):
                self.require(arg.split("=", 1)[0])

    def values(self, name: str) -> list[str]:
        """Allowed values from a `[a|b|c]` or `{a,b,c}` hint or a "values:" help mention."""
        opt = self.option(name)
        if opt is None:
            return []
        hint = opt.value_hint
        m = re.search(r"[\[{]([^\]}]+)[\]}]", hint)
        if m:
            hint = m.group(1)
        # "none,draft-simple,…" (this tree) or "[none|draft-simple|…]"; not "<dev1,dev2,..>".
        if re.fullmatch(r"[a-z0-9][a-z0-9_-]*([|,][a-z0-9][a-z0-9_-]*)+", hint):
            return re.split(r"[|,]", hint)
        return re.findall(r"\b[a-z][a-z0-9]*(?:-[a-z0-9]+)+\b", opt.help)


def _is_number(arg: str) -> bool:
    try:
        float(arg)
        return True
    except ValueError:
        return False


def parse_help(text: str, build: str = "unknown build") -> ServerHelp:
    # A run reads the same build's help several times (the recorded settings, the command line):
    # parsed once per text, each caller given its own list.
    return ServerHelp(build=build, options=list(_parse_options(text)))


@functools.lru_cache(maxsize=8)
def _parse_options(text: str) -> tuple[HelpOption, ...]:
    options: list[HelpOption] = []
    current: dict | None = None

    def flush():
        if current is not None:
            desc = " ".join(current["help"]).strip()
            options.append(HelpOption(tuple(current["names"]), current["hint"], desc, _REMOVED in desc))

    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("---"):
            flush()
            head, desc = _split_columns(line.rstrip())
            names, hint = _split_names(head)
            current = {"names": names, "hint": hint, "help": [desc.strip()] if desc else []}
        elif line.startswith("---"):  # "----- sampling params -----"
            flush()
            current = None
        elif current is not None and line.startswith(" ") and line.strip():
            current["help"].append(line.strip())
        # Whitespace-only lines occur inside descriptions (before "(env: …)"): not a boundary.
    flush()
    return tuple(options)


def _split_columns(line: str) -> tuple[str, str]:
    """Options and description are separated by padding (2+ spaces); the padding after the first
    alias ("-md,   --spec-draft-model") follows a comma and is not a separator. Long option parts
    put the description on the next line instead."""
    m = _COLUMN_GAP.search(line)
    return (line[: m.start()], line[m.end() :]) if m else (line, "")


_COLUMN_GAP = re.compile(r"(?<=[^,\s])\s{2,}")


def _split_names(head: str) -> tuple[list[str], str]:
    """'-md,   --spec-draft-model, --model-draft FNAME' → (['-md', ...], 'FNAME')."""
    names, rest = [], head.strip()
    while True:
        m = re.match(r"(--?[A-Za-z0-9][A-Za-z0-9_-]*)\s*(,\s*)?", rest)
        if not m:
            break
        names.append(m.group(1))
        rest = rest[m.end() :]
        if not m.group(2):
            break
    return names, rest.strip()


# ---- draft flags -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftFlags:
    """What this build has and needs for a remote draft model, from its own `--help`.

    `spec_type` is the `--spec-type` spelling when the build needs it to use a draft model, with
    `spec_value` the value ("draft-simple"); both None where a draft model alone turns speculation
    on (builds whose `--spec-type` lists only model-free types such as b9093's
    `[none|ngram-cache|…]`, "type … to use when no draft model is provided"; or no `--spec-type`
    at all). `n_max_default` is the build's own default number of drafted tokens (16 on b9093, 3
    later): tunnelspec passes `n_max` only when the inventory sets a value."""

    model: str
    device: str
    ngl: str
    n_max: str
    ngl_all: str  # the value meaning "every layer": "all" on new builds, a large int on old ones
    spec_type: str | None
    spec_value: str | None = None
    spec_types: tuple[str, ...] = ()  # every --spec-type value the build lists
    n_max_default: int | None = None
    p_min_default: float | None = None


DRAFT_SIMPLE = "draft-simple"
_DEFAULT = re.compile(r"\(default:\s*([0-9.]+)\)")


def _help_default(h: ServerHelp, *names: str) -> float | None:
    name = h.pick(*names)
    opt = h.option(name) if name else None
    m = _DEFAULT.search(opt.help) if opt else None
    return float(m.group(1)) if m else None


def draft_flags(h: ServerHelp) -> DraftFlags:
    spec_type = h.pick("--spec-type")
    types = tuple(h.values("--spec-type")) if spec_type else ()
    if spec_type is not None and DRAFT_SIMPLE not in types:
        if any(t.startswith("draft-") for t in types):
            # Draft types exist but not the plain one: a layout this code does not know.
            raise TaskFailed(
                f"llama-server --spec-type has no '{DRAFT_SIMPLE}' value in this build ({h.build}); "
                f"it lists {', '.join(types)}"
            )
        needed = None  # the draft model alone enables speculation on this build
    else:
        needed = spec_type
    ngl = h.require("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft")
    ngl_opt = h.option(ngl)
    n_max_default = _help_default(h, "--spec-draft-n-max", "--draft-max", "--draft-n", "--draft")
    return DraftFlags(
        model=h.require("--spec-draft-model", "-md", "--model-draft"),
        device=h.require("--spec-draft-device", "-devd", "--device-draft"),
        ngl=ngl,
        n_max=h.require("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
        ngl_all="all" if ngl_opt and "'all'" in ngl_opt.help else "999",
        spec_type=needed,
        spec_value=DRAFT_SIMPLE if needed else None,
        spec_types=types,
        n_max_default=int(n_max_default) if n_max_default is not None else None,
        p_min_default=_help_default(h, "--spec-draft-p-min", "--draft-p-min"),
    )


def draft_argv(h: ServerHelp, model: str, device: str, n_max: int | None = None) -> list[str]:
    """The argv fragment putting draft model `model` on device `device` (e.g. "RPC0"); the build's
    own number of drafted tokens unless `n_max` is given."""
    f = draft_flags(h)
    out = [f.spec_type, f.spec_value] if f.spec_type and f.spec_value else []  # both set or neither
    out += [f.model, model, f.device, device, f.ngl, f.ngl_all]
    return out + ([f.n_max, str(n_max)] if n_max is not None else [])


# ---- --version -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaVersion:
    version: str | None  # "0.5.0-dev"; None on old builds that print only the build number
    build_number: int | None  # 0 means "unknown" to llama.cpp's build-info: mapped to None
    commit: str | None  # short or full hash as printed

    @property
    def label(self) -> str:
        parts = [self.version or "llama.cpp"]
        parts.append(f"build {self.build_number}" if self.build_number is not None else "build ?")
        if self.commit:
            parts.append(f"commit {self.commit}")
        return " ".join(parts[:1]) + " (" + ", ".join(parts[1:]) + ")"


_VERSION_NEW = re.compile(r"^version:\s*(\S+)\s*\(build\s+(\d+),\s*commit\s+([0-9a-fA-F]+|unknown)\)", re.M)
_VERSION_OLD = re.compile(r"^version:\s*(\d+)\s*\(([0-9a-fA-F]+|unknown)\)", re.M)


def parse_version(text: str) -> LlamaVersion:
    """`version: 0.5.0-dev (build N, commit H)` or older `version: 4589 (eb7cf15a)` (stderr)."""
    m = _VERSION_NEW.search(text)
    if m:
        return LlamaVersion(m.group(1), _build(m.group(2)), _commit(m.group(3)))
    m = _VERSION_OLD.search(text)
    if m:
        return LlamaVersion(None, _build(m.group(1)), _commit(m.group(2)))
    raise TaskFailed(f"cannot parse llama-server --version output: {text.strip()[:200]!r}")


def _build(num: str) -> int | None:
    n = int(num)
    return n if n > 0 else None  # build-info falls back to 0 when git gave no count


def _commit(h: str) -> str | None:
    return None if h == "unknown" else h.lower()


# ---- --list-devices --------------------------------------------------------------------------


def parse_list_devices(text: str) -> list[Device]:
    """Lines like `  RPC0: 127.0.0.1:50099 (24105 MiB, 24105 MiB free)` after "Available devices:":
    every device line of the text (llama/devices.py owns the line and `Device`)."""
    out = []
    for line in text.splitlines():
        dev = parse_device_line(line)
        if dev is not None:
            out.append(dev)
    return out


def rpc_devices_by_port(devices: list[Device]) -> dict[int, list[str]]:
    """Tunnel port → RPC device names on that endpoint (an endpoint may expose several devices).
    Every tunnel shows as 127.0.0.1:<port>, so the port is what maps a device to a node."""
    out: dict[int, list[str]] = {}
    for d in devices:
        port = d.endpoint_port
        if port is not None:
            out.setdefault(port, []).append(d.name)
    return out
