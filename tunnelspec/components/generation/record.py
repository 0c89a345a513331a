"""Generations (NixOS's idea, docs/generations.md): every deploy that passed verify is recorded on
main as a numbered generation — per host the build directory `current` pointed at, the source's
stack record and the serving files (units, launcher and front configuration) by sha256, with a
copy of each file kept on its host, and the sha256 of each model llama-server loads (no copy: a
return only says when the file is another) — so that returning to it is one switch: no compile, no
download.

Pure: the record's shape, what differs between two states, numbering and pruning. The commands
that read a host's state and restore it are in components/generation/ (tasks.py, live.py, store.py, restore.py).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass

from tunnelspec.core.constants import DEVICES_CACHE, STATE_DIR
from tunnelspec.facts import nft

GEN_DIR = f"{STATE_DIR}/generations"
CURRENT = f"{GEN_DIR}/current"
FILES_DIR = f"{GEN_DIR}/files"  # on every host: copies of its serving files, by sha256
# The figures the metrics exporter shows (docs/metrics.md): the current generation, since when, and the
# rollbacks so far. World-readable (the exporter runs as the front's user); no secret in it.
STATUS = f"{STATE_DIR}/generation.json"
PINS = ".tunnelspec-pinned"  # in <root>/build: build keys kept generations use (never pruned)
DEFAULT_KEEP = 3
SCHEMA = 1

UNIT_DIR = "/etc/systemd/system"
LLAMA_UNIT = "tunnelspec-llama-server.service"
FRONT_UNIT = "tunnelspec-front.service"
WATCH_UNIT = "tunnelspec-draftwatch.service"
RPC_UNIT = "tunnelspec-rpc.service"
FRONT_CONFIG = "/etc/tunnelspec/front.cfg"
# The loopback isolation (components/isolation.py, facts/nft.py): part of every generation, so that a
# return loads the rules its services were guarded by before they start (action "nft": `nft -f` of
# the restored file, in the one transaction that replaces only tunnelspec's table).
ISOLATION_RULES = nft.RULES_PATH
ISOLATION_UNIT = nft.UNIT

WATCH_PROGRAM = tuple(f"/usr/local/lib/tunnelspec/tunnelspec-draftwatch{part}" for part in ("", "-state", "-watch"))

# What serving reads on each role, and which unit a change of it restarts (or reloads).
MAIN_FILES = {
    ISOLATION_RULES: ("nft", ""),
    f"{UNIT_DIR}/{ISOLATION_UNIT}": ("none", ""),
    f"{UNIT_DIR}/{LLAMA_UNIT}": ("restart", LLAMA_UNIT),
    "/etc/tunnelspec/llama-server.json": ("restart", LLAMA_UNIT),
    DEVICES_CACHE: ("none", ""),
    f"{UNIT_DIR}/{FRONT_UNIT}": ("restart", FRONT_UNIT),
    FRONT_CONFIG: ("reload", FRONT_UNIT),
    f"{UNIT_DIR}/{WATCH_UNIT}": ("restart", WATCH_UNIT),
    # The draft watch's program and its parts (tunnelspec/hostprogs): a return restores them together.
    **{path: ("restart", WATCH_UNIT) for path in WATCH_PROGRAM},
}
RPC_FILES = {
    ISOLATION_RULES: ("nft", ""),
    f"{UNIT_DIR}/{ISOLATION_UNIT}": ("none", ""),
    f"{UNIT_DIR}/{RPC_UNIT}": ("restart", RPC_UNIT),
}
STACK_FILE = "src/llama.cpp/.git/tunnelspec-stack"  # under the host's root: the source's stack record


TUNNEL_UNIT = "tunnelspec-tunnel-{}.service"  # on main, one per rpc node (components/tunnel/tunnels.py)


def managed_files(role: str, root: str, nodes: tuple[str, ...] = ()) -> dict[str, tuple[str, str]]:
    """What a generation keeps of a host. `nodes`: the rpc nodes' names (main keeps each one's tunnel
    unit: its `-L` names the node's rpc port, which a return across an rpc_port change restores)."""
    files = dict(MAIN_FILES if role == "main" else RPC_FILES)
    if role == "main":
        for node in nodes:
            unit = TUNNEL_UNIT.format(node)
            files[f"{UNIT_DIR}/{unit}"] = ("restart", unit)
    files[posixpath.join(root, STACK_FILE)] = ("source", "")
    return files


_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_-]{0,252}")


def serve_of(cluster) -> dict:
    """Where a generation's API answers and how it is reached (verify after a return checks that address:
    the inventory may name another since, e.g. a public bind that failed to deploy)."""
    main = cluster.main
    tls = main.tls
    return {
        "host": main.server_host,
        "port": main.server_port,
        "tls_ca_file": str(tls.ca_file) if tls is not None else "",
        "tls_name": tls.server_name if tls is not None else "",
    }


def recorded_serve(record: dict, cluster) -> dict:
    """The record's `serve` held to its shape (an address, a port, TLS names), else the inventory's (a
    generation recorded before tunnelspec kept it)."""
    serve = record.get("serve")
    ok = (
        isinstance(serve, dict)
        and isinstance(serve.get("host"), str)
        and _HOST.fullmatch(serve["host"])
        and isinstance(serve.get("port"), int)
        and not isinstance(serve.get("port"), bool)
        and 0 < serve["port"] < 65536
        and isinstance(serve.get("tls_ca_file"), str)
        and isinstance(serve.get("tls_name"), str)
        and (serve["tls_name"] == "" or _HOST.fullmatch(serve["tls_name"]))
    )
    return dict(serve) if ok and isinstance(serve, dict) else serve_of(cluster)


def recorded_rpc_port(want: dict) -> int | None:
    """The rpc port a node's part of a record names (None: recorded before tunnelspec kept it)."""
    port = want.get("rpc_port")
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None


# What a host checks before it acts on a record (docs/generations.md). A record is data kept on main,
# and each host acts on it as root: an absolute or `../` digest would install any file of the host at
# a serving path, a recorded 4777 would make a setuid file, a recorded build any directory `current`.
# So every value that becomes a path, a mode or a link is held to what this code itself writes there,
# and the host's role and root are the inventory's, never the record's: root on main does not become
# root on every node.
SHA256 = re.compile(r"[0-9a-f]{64}")
# The deploy names its builds by 16 hex digits (llama/build_plan.py, build_key); any plain name is a
# key, never one with a `/`, nor `.` or `..` (it starts with a letter or a digit).
BUILD_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MODE = re.compile(r"[0-7]{3,4}")
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git object name: sha1 or sha256
# The draft watch's program (and its parts) are the managed files the deploy writes executable (0755,
# playbooks/server.yml); it writes every other one 0644: the units (modules/systemd.py),
# llama-server.json and front.cfg (playbooks/server.yml), the device map (components/server/server.py),
# the stack record (components/source/checkout.py).
EXECUTABLES = frozenset(WATCH_PROGRAM)


def written_mode(path: str) -> int:
    """The mode the deploy writes `path` with."""
    return 0o755 if path in EXECUTABLES else 0o644


class RecordRefused(ValueError):
    """A record asks a host for something the deploy never writes there: nothing is done with it."""

    def __init__(self, host: str, n, field: str, value, why: str):
        self.host, self.n, self.field, self.value, self.why = host, n, field, value, why
        super().__init__(f"{host}: generation {n} is refused: its {field} {self.shown} {why} (nothing was changed)")

    @property
    def shown(self) -> str:
        text = repr(self.value)
        return text if len(text) <= 120 else text[:117] + "..."


def validate_host_record(want, role: str, root: str, host: str, n=None, nodes: tuple[str, ...] = ()) -> None:
    """Raise RecordRefused unless `want`, generation `n`'s record of `host`, asks only for what the
    deploy itself writes on that host: its role and root as the inventory gives them (`role`, `root`:
    never taken from the record), a build directory directly under `<root>/build`, only the files
    managed_files names for the role, each by a sha256 (the name of its copy in FILES_DIR) and a mode
    within the one the deploy writes it with (written_mode: a narrower one is accepted, it grants
    nothing more; a setuid, setgid or sticky bit, or a bit writable by others, never)."""

    def refuse(field: str, value, why: str):
        raise RecordRefused(host, n, field, value, why)

    if not isinstance(want, dict):
        refuse("record", want, "is not a mapping")
    if want.get("role") != role:
        refuse("role", want.get("role"), f"is not the inventory's role of {host} ({role})")
    if want.get("root") != root:
        refuse("root", want.get("root"), f"is not the inventory's tunnelspec_root of {host} ({root})")
    build, prefix = want.get("build"), posixpath.join(root, "build") + "/"
    key = build[len(prefix) :] if isinstance(build, str) and build.startswith(prefix) else ""
    if not BUILD_KEY.fullmatch(key):
        refuse("build", build, f"is not a build directory directly under {prefix}")
    files = want.get("files")
    if not isinstance(files, dict):
        refuse("files", files, "are not a mapping of path to file")
    if "rpc_port" in want and (role != "rpc" or recorded_rpc_port(want) is None):
        refuse("rpc_port", want.get("rpc_port"), "is not a port (1-65535) of an rpc node")
    managed = managed_files(role, root, nodes)
    for path, f in files.items():
        if path not in managed:
            refuse("file path", path, f"is not a file tunnelspec manages on a {role} host")
        if f is None:
            continue  # absent in the generation: the restore removes it
        if not isinstance(f, dict):
            refuse(f"file {path}", f, "is not a {sha256, mode} mapping")
        if not isinstance(f.get("sha256"), str) or not SHA256.fullmatch(f["sha256"]):
            refuse(f"sha256 of {path}", f.get("sha256"), "is not a sha256 (64 lowercase hex digits)")
        mode = f.get("mode") or ""
        if mode and (not isinstance(mode, str) or not MODE.fullmatch(mode) or int(mode, 8) & ~written_mode(path)):
            refuse(
                f"mode of {path}",
                mode,
                f"is not within the mode tunnelspec writes it with "
                f"({written_mode(path):o}: no setuid, setgid or sticky bit, nothing writable by others)",
            )


@dataclass(frozen=True)
class FileState:
    sha: str | None  # None: absent
    mode: str = ""

    def as_json(self):
        return None if self.sha is None else {"sha256": self.sha, "mode": self.mode}


def build_key(build_dir: str) -> str:
    return posixpath.basename(build_dir.rstrip("/"))


def runs_build(exe: str, build_dir: str) -> bool:
    """Whether a process's executable (its /proc exe link: " (deleted)" when the file was replaced
    or pruned since) is a binary of `build_dir`."""
    exe = exe.removesuffix(" (deleted)")
    return bool(exe and build_dir) and exe.startswith(build_dir.rstrip("/") + "/")


def host_diff(recorded: dict, live: dict) -> list[str]:
    """What differs on one host between a recorded state and the live one, as short phrases."""
    out = []
    if recorded.get("build") != live.get("build"):
        out.append(f"build {build_key(live.get('build') or '-')[:16]} → {build_key(recorded.get('build') or '-')[:16]}")
    rf, lf = recorded.get("files", {}), live.get("files", {})
    # A path the record does not name (a generation from before tunnelspec kept it) is left as it is.
    for path in sorted(rf):
        if (rf.get(path) or None) != (lf.get(path) or None):
            out.append(posixpath.basename(path))
    return out


def state_of(record: dict) -> dict:
    """The part of a record that says what runs: compared to tell whether a deploy made a new one."""
    return {"hosts": record.get("hosts", {}), "models": model_sums(record), "serve": record.get("serve")}


def model_sums(record: dict) -> dict[str, str | None]:
    """{path on main: sha256} of the models a record's llama-server loads (None: not proven yet)."""
    sums = record.get("model_sha256")
    return dict(sums) if isinstance(sums, dict) else {}


def models_diff(recorded: dict[str, str | None], live: dict[str, str | None]) -> list[str]:
    """The models whose content differs between a record and now, as short phrases."""
    return [
        f"model {posixpath.basename(p)}" for p in sorted(set(recorded) | set(live)) if recorded.get(p) != live.get(p)
    ]


def model_drift(record: dict, live: dict[str, str | None]) -> list[str]:
    """Returning to `record`: each model whose file no longer is the one it recorded. `live`: path →
    its sha256 as proven and unchanged since, None when the file changed since its proof (telling
    more would take reading it whole). Models are not kept with a generation: a warning, not a refusal."""
    out = []
    for path, want in sorted(model_sums(record).items()):
        if want is None or path not in live:
            continue
        have = live[path]
        if have is None:
            out.append(f"{path} changed since generation {record.get('n')} proved it (sha256 then {want[:12]})")
        elif have != want:
            out.append(f"{path} is not generation {record.get('n')}'s (sha256 {have[:12]}, then {want[:12]})")
    return out


def same_state(a: dict, b: dict) -> bool:
    return json.dumps(state_of(a), sort_keys=True) == json.dumps(state_of(b), sort_keys=True)


def next_number(numbers: list[int]) -> int:
    return max(numbers, default=0) + 1


def kept(numbers: list[int], keep: int, current: int | None) -> list[int]:
    """The generations kept: the newest `keep` (at least one), and always the current one."""
    newest = sorted(set(numbers), reverse=True)[: max(1, keep)]
    if current is not None and current in numbers and current not in newest:
        newest.append(current)
    return sorted(newest)


def pinned_builds(records: list[dict], host: str) -> list[str]:
    """The build keys of `host` that kept generations use: its build pruning leaves them alone."""
    keys = {
        build_key(r["hosts"][host]["build"])
        for r in records
        if host in r.get("hosts", {}) and r["hosts"][host].get("build")
    }
    return sorted(keys)


def used_files(records: list[dict], host: str) -> set[str]:
    """The sha256 of every file copy `host` must keep for the kept generations."""
    out = set()
    for r in records:
        for f in (r.get("hosts", {}).get(host, {}).get("files") or {}).values():
            if f:
                out.add(f["sha256"])
    return out


def find_same(records: list[dict], state: dict) -> int | None:
    """The number of a kept generation whose state equals `state` (the newest), else None."""
    for r in sorted(records, key=lambda r: r["n"], reverse=True):
        if same_state(r, state):
            return r["n"]
    return None


def summary(record: dict) -> str:
    """`generation 4: tree 1a2b3c4d5e6f + 1 patch(es), main build/ab12…, rpc-a build/cd34…`."""
    hosts = ", ".join(f"{h} build/{build_key(s.get('build') or '-')[:12]}" for h, s in sorted(record["hosts"].items()))
    tree = (record.get("tree") or "?")[:12]
    patches = len(record.get("patches") or [])
    digest = hashlib.sha256(json.dumps(state_of(record), sort_keys=True).encode()).hexdigest()[:8]
    models = ", ".join(f"{posixpath.basename(p)} {(sha or '?')[:12]}" for p, sha in sorted(model_sums(record).items()))
    return (
        f"generation {record['n']}: tree {tree} + {patches} patch(es); {hosts}"
        + (f"; models {models}" if models else "")
        + f"; state {digest}"
    )


def dumps(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def parse_status(text: str) -> dict:
    """STATUS's content, or {} when it is missing or damaged (its counters then start again)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def next_status(prev: dict, n: int, now: float, rollback: bool = False, event: str = "") -> dict:
    """STATUS after generation `n` became current at `now` (`rollback`: by a return to it, `event`
    naming that return so that it is counted once). A generation that stays current keeps its `since`."""
    rollbacks = int(prev.get("rollbacks") or 0)
    doc = {
        "schema": 1,
        "generation": n,
        "since": prev.get("since", now) if prev.get("generation") == n and not rollback else now,
        "rollbacks": rollbacks + (1 if rollback else 0),
    }
    last = now if rollback else prev.get("last_rollback")
    if last is not None:
        doc["last_rollback"] = last
    ev = event if rollback else prev.get("last_rollback_event", "")
    if ev:
        doc["last_rollback_event"] = ev
    return doc


def status_text(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True) + "\n"
