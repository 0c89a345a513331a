"""`tunnelspec logs`: the bundle a maintainer asks for when something goes wrong on several hosts.

Read-only. From every host: the journal of each tunnelspec unit, the rendered unit files, what the
deployed llama-server says about itself (`--version`, its devices), and the lines that tell where
the models went and how fast they loaded; plus `status --format json` for the whole cluster. One
file per host and unit, every secret masked, written to a directory or a .tar.gz on the controller.

A host that cannot be reached is a line in the summary (and a file in the bundle), never a reason
to stop collecting the others; a unit that never started is collected as it is.

`--list-devices` and the rpc-servers: an rpc-server serves one client at a time, and the deployed
llama-server holds that client slot. `llama-server --rpc ... --list-devices` would wait for it
forever, so the bundle never runs it. It holds instead the local devices (`--list-devices` without
`--rpc`, which connects to nothing, under a timeout), the RPC devices the last deploy recorded, and
the device and buffer lines llama-server itself logged when it loaded the models.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunnelspec.connection import ConnectOptions, connect
from tunnelspec.components.server.args import UNIT as SERVER_UNIT
from tunnelspec.components.server.args import last_acceptance
from tunnelspec.core.secrets import mask_text, masked, secret_values
from tunnelspec.commands import status
from tunnelspec.components.front import model as front
from tunnelspec.facts import safe_read
from tunnelspec.components.tls.ca import CA_KEY, ca_dir_for
from tunnelspec.core.errors import UsageError

CMD_TIMEOUT = 30.0  # one remote command
HOST_TIMEOUT = 240.0  # everything from one host (journals can be long)
JOURNAL_MAX_LINES = 50000  # per unit: a restart loop logs for days; the newest lines matter
RPC_UNIT = "tunnelspec-rpc.service"
_UNIT_NAME = re.compile(r"^tunnelspec-[A-Za-z0-9@._-]+\.(?:service|socket|timer|path)$")
# Lines that tell where the weights went, how they loaded and how the draft did.
_PLACEMENT = re.compile(
    r"model buffer size|KV buffer size|compute buffer size|load_tensors:|offloaded \d+/\d+ layers|"
    r"using device|llama_model_load|load time|model loaded|loading model|draft acceptance|"
    r"Starting RPC server|Accepted client connection|Client connection closed|devices?:",
    re.I,
)
_ERROR = re.compile(
    r"\b(error|failed|failure|fatal|abort(?:ed|ing)?|panic|segfault|exception|"
    r"cannot|can't|refused|denied|timed? ?out)\b",
    re.I,
)
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)")


@dataclass
class HostBundle:
    name: str
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text
    unreachable: str | None = None
    units: dict[str, str] = field(default_factory=dict)  # unit -> "active (running)" etc.
    last_error: str | None = None
    load_time: str | None = None
    acceptance: dict | None = None
    secrets: list[str] = field(default_factory=list)  # found on the host (the API key): masked, never written


async def _run(conn, argv: list[str], timeout: float = CMD_TIMEOUT) -> tuple[int, str]:
    try:
        res = await conn.run(argv, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - written into the bundle; the other files still come
        return -1, f"(could not run {argv[0]}: {e})\n"
    text = res.stdout
    if res.stderr.strip():
        text += ("\n" if text and not text.endswith("\n") else "") + res.stderr
    return res.rc, text


async def _units(conn) -> list[str]:
    """Every tunnelspec unit the host knows: loaded ones (running or failed) and installed files."""
    names: list[str] = []
    for argv in (
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", "tunnelspec-*"],
        ["systemctl", "list-unit-files", "--no-legend", "--no-pager", "tunnelspec-*"],
    ):
        rc, out = await _run(conn, argv)
        for line in out.splitlines() if rc == 0 else []:
            parts = line.split()
            unit = parts[0] if parts else ""
            if _UNIT_NAME.match(unit) and unit not in names:
                names.append(unit)
    return names


def _load_time(journal: str) -> str | None:
    """Seconds from llama-server's 'loading model' to 'model loaded' in its last start."""
    start = end = None
    for line in journal.splitlines():
        ts = _TIMESTAMP.match(line)
        if not ts:
            continue
        if "loading model" in line:
            start, end = ts.group(1), None
        elif "model loaded" in line and start:
            end = ts.group(1)
    if not (start and end):
        return None
    fmt = "%Y-%m-%dT%H:%M:%S"

    def secs(stamp: str) -> float:
        whole, _, frac = stamp.partition(".")
        return time.mktime(time.strptime(whole, fmt)) + float("0." + frac if frac else 0)

    return f"{secs(end) - secs(start):.1f} s"


def _exec_binary(show: str) -> str | None:
    """The binary of `systemctl show -p ExecStart --value` ("{ path=/x/llama-server ; argv[]=... }")."""
    m = re.search(r"path=(\S+)", show)
    return m.group(1) if m else None


async def _collect_host(name: str, hv: dict, opts: ConnectOptions, inv_dir, since: str | None, main) -> HostBundle:
    b = HostBundle(name)
    try:
        conn = await connect(name, hv, opts, inv_dir)
    except Exception as e:  # noqa: BLE001 - an unreachable host is listed, the others collected
        b.unreachable = str(e) or type(e).__name__
        b.files["UNREACHABLE.txt"] = f"{name} could not be reached: {b.unreachable}\n"
        return b
    try:
        await _collect_units(conn, b, since)
        if main is not None:
            if main.api_key_file:
                # The key itself is never collected; it is read only so that it is masked wherever
                # a log line might have repeated it.
                rc, key = await _run(conn, ["cat", "--", main.api_key_file])
                if rc == 0 and key.strip():
                    b.secrets.append(key.strip())
            if main.tls is not None:
                # Likewise llama-server's TLS key: read (as root, never written) only to be masked.
                rc, tls_key = await _run(conn, ["cat", "--", main.tls.key_path])
                if rc == 0 and tls_key.strip():
                    b.secrets += _pem_secrets(tls_key)
            await _collect_server(conn, b)
    finally:
        await conn.close()
    return b


async def _collect_units(conn, b: HostBundle, since: str | None) -> None:
    window = ["--since", since] if since else ["-b"]
    overview = []
    for unit in await _units(conn):
        _, show = await _run(
            conn,
            [
                "systemctl",
                "show",
                "--no-pager",
                "-p",
                "LoadState,ActiveState,SubState,Result,ExecMainStatus,NRestarts,"
                "ActiveEnterTimestamp,InvocationID,FragmentPath",
                unit,
            ],
        )
        props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        b.units[unit] = f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')})"
        overview.append(f"== {unit}\n{show.rstrip()}\n")
        _, cat = await _run(conn, ["systemctl", "cat", "--no-pager", unit])
        b.files[f"units/{unit}"] = cat
        _, journal = await _run(
            conn,
            ["journalctl", "--no-pager", "-o", "short-iso-precise", "-n", str(JOURNAL_MAX_LINES), "-u", unit, *window],
            timeout=60,
        )
        b.files[f"journal/{unit}.log"] = journal
        for line in journal.splitlines():
            if _ERROR.search(line) and not line.startswith("-- "):
                b.last_error = f"{unit}: {line.strip()}"
        placement = [line for line in journal.splitlines() if _PLACEMENT.search(line)]
        if placement:
            b.files[f"placement/{unit}.log"] = "\n".join(placement) + "\n"
        if unit == SERVER_UNIT:
            b.load_time = _load_time(journal)
            b.acceptance = last_acceptance(journal)
    b.files["units.txt"] = "\n".join(overview) if overview else "no tunnelspec unit on this host\n"


async def _collect_server(conn, b: HostBundle) -> None:
    """What the deployed llama-server binary says about itself, without touching the rpc-servers."""
    # The unit starts llama-server through its launcher: the command lines, the mode it chose and the
    # front's configuration are files (no secret in them: the API key file is named, never read).
    # Read without following a link (SECURITY.md, invariant A): mode.json lies in llama-server's own
    # runtime directory, where its user could leave a symlink to a file only root may read.
    for path, name in (
        (front.MODES_PATH, "llama-server.json"),
        (front.STATE_PATH, "mode.json"),
        (front.FRONT_CONFIG, "front.cfg"),
    ):
        rc, text = await _run(conn, safe_read.file_text(path).argv)
        if rc == 0:
            b.files[name] = text
        elif rc != safe_read.ABSENT:
            b.files[name + ".refused"] = f"{path}: not read ({text.strip()})\n"
    binary = None
    try:
        binary = (json.loads(b.files.get("llama-server.json") or "{}").get("modes") or {}).get("speculative", [None])[0]
    except ValueError:
        pass
    if binary is None:
        _, show = await _run(conn, ["systemctl", "show", "-p", "ExecStart", "--value", SERVER_UNIT])
        binary = _exec_binary(show)
    if binary is None:
        b.files["llama-server.txt"] = "llama-server is not installed as a unit on this host (no ExecStart)\n"
        return
    _, version = await _run(conn, [binary, "--version"], timeout=20)
    # No --rpc: listing the RPC devices would wait for rpc-servers that serve llama-server.
    rc, devices = await _run(conn, ["timeout", "20", binary, "--list-devices"], timeout=30)
    _, recorded = await _run(conn, ["cat", status.DEVICES_CACHE])
    b.files["llama-server.txt"] = (
        f"binary: {binary}\n\n$ {binary} --version\n{version.rstrip()}\n\n"
        f"$ {binary} --list-devices   (local devices only: with --rpc it would wait for the rpc-servers,\n"
        f"  which serve one client at a time and are held by the running llama-server; rc={rc})\n"
        f"{devices.rstrip()}\n\n"
        f"RPC devices as the last deploy listed them ({status.DEVICES_CACHE}):\n{recorded.rstrip()}\n"
        f"\nThe device and buffer lines llama-server logged at load time are in "
        f"placement/{SERVER_UNIT}.log.\n"
    )


def _pem_secrets(text: str) -> list[str]:
    """A PEM key as masks: whole, and each base64 line of its body (a log may wrap or cut it)."""
    body = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("-----")]
    return [text.strip(), *(line for line in body if len(line) >= 16)]


def _ca_key_secrets(inventory) -> list[str]:
    """The inventory CA's key is never on a host; masked all the same, should a path ever lead to it."""
    try:
        return _pem_secrets((ca_dir_for(inventory.path) / CA_KEY).read_text())
    except OSError:
        return []


def _secrets(inventory, opts: ConnectOptions, extra: list[str]) -> list[str]:
    found: list[str] = list(extra)
    found += _ca_key_secrets(inventory)
    for name in inventory.hosts:
        found += secret_values(inventory.host_vars(name))
    if opts.private_key:
        found.append(str(opts.private_key.reveal() if hasattr(opts.private_key, "reveal") else opts.private_key))
    # Longest first: a secret that contains another is masked whole.
    return sorted({s for s in found if s}, key=len, reverse=True)


def _masked_inventory(inventory) -> dict:
    return masked(inventory.to_ansible_list())


def summary(hosts: list[HostBundle], where: str) -> str:
    lines = [f"tunnelspec logs: bundle written to {where}", ""]
    for b in hosts:
        if b.unreachable:
            lines.append(f"{b.name:<12} UNREACHABLE: {b.unreachable}")
            continue
        units = (
            ", ".join(f"{u.removeprefix('tunnelspec-').removesuffix('.service')} {s}" for u, s in b.units.items())
            or "no tunnelspec unit"
        )
        lines.append(f"{b.name:<12} {units}")
        if b.load_time or b.acceptance:
            acc = (
                f"{b.acceptance['accepted']}/{b.acceptance['generated']} draft tokens accepted "
                f"({b.acceptance['rate']:.2f})"
                if b.acceptance
                else "no draft statistics"
            )
            lines.append(f"{'':<12} model load {b.load_time or '?'}, {acc}")
        if b.last_error:
            lines.append(f"{'':<12} last error: {b.last_error[:160]}")
    return "\n".join(lines) + "\n"


async def collect(inventory, cluster, opts: ConnectOptions, since: str | None = None) -> tuple[list[HostBundle], dict]:
    names = cluster.hosts

    async def one(name: str) -> HostBundle:
        try:
            return await asyncio.wait_for(
                _collect_host(
                    name,
                    inventory.host_vars(name),
                    opts,
                    inventory.path.parent,
                    since,
                    cluster.main if name == cluster.main.name else None,
                ),
                HOST_TIMEOUT,
            )
        except (TimeoutError, Exception) as e:  # noqa: BLE001 - the others are still collected
            why = f"collecting stopped: {type(e).__name__}: {e}"
            b = HostBundle(name, unreachable=why)
            b.files["UNREACHABLE.txt"] = why + "\n"
            return b

    rows = list(await asyncio.gather(*(one(n) for n in names)))
    try:
        report = await asyncio.wait_for(status.gather(inventory, cluster, opts), HOST_TIMEOUT)
    except Exception as e:  # noqa: BLE001
        report = {"error": f"status could not be gathered: {type(e).__name__}: {e}"}
    return rows, report


def check_output(path: Path) -> None:
    """--output names a directory (new, or existing and a directory) or a .tar.gz/.tgz file (new, or a
    file to replace) whose nearest existing parent is a writable directory; else UsageError."""
    archive = path.name.endswith((".tar.gz", ".tgz"))
    if path.exists():
        if archive and path.is_dir():
            raise UsageError(
                f"--output {path}: is a directory; name a new .tar.gz file, or a directory without the .tar.gz ending"
            )
        if not archive and not path.is_dir():
            raise UsageError(
                f"--output {path}: exists and is not a directory; name a directory (new or "
                "existing) or a file ending in .tar.gz"
            )
    parent = path if path.is_dir() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--output {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--output {path}: {parent} is not writable")
    # Permission bits do not tell everything (root may "write" /proc, a read-only mount): a file made
    # and removed there now, before anything is collected.
    try:
        fd, probe = tempfile.mkstemp(prefix=".tunnelspec-logs-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"--output {path}: cannot write in {parent} ({e.strerror or e})") from None


def write_bundle(path: Path, hosts: list[HostBundle], report: dict, inventory, secrets: list[str]) -> str:
    """Write every file (masked) into a directory, or a .tar.gz when the path ends so. Returns where."""
    files: dict[str, str] = {
        "status.json": json.dumps(report, indent=2, sort_keys=True) + "\n",
        "inventory.json": json.dumps(_masked_inventory(inventory), indent=2, sort_keys=True) + "\n",
    }
    for b in hosts:
        for rel, text in b.files.items():
            files[f"{b.name}/{rel}"] = text
    files["summary.txt"] = summary(hosts, str(path))
    files = {rel: mask_text(text, secrets) for rel, text in files.items()}
    if path.name.endswith((".tar.gz", ".tgz")):
        path.parent.mkdir(parents=True, exist_ok=True)
        top = path.name.removesuffix(".tar.gz").removesuffix(".tgz")
        # Created 0600 (never first with the umask's mode, then narrowed); not through a symlink.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for rel, text in sorted(files.items()):
                data = text.encode()
                info = tarfile.TarInfo(f"{top}/{rel}")
                info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        return str(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for rel, text in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # logs may hold what a reader of the machine should not see: 0600 from creation on
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return str(path)


def run(
    inventory,
    cluster,
    opts: ConnectOptions,
    output: str | None,
    since: str | None,
    extra_secrets: list[str] | None = None,
) -> tuple[str, list[HostBundle]]:
    path = Path(output) if output else Path(time.strftime("tunnelspec-logs-%Y%m%dT%H%M%SZ", time.gmtime()))
    check_output(path)  # before collecting: a target that cannot be written is exit 2, not a lost bundle
    hosts, report = asyncio.run(collect(inventory, cluster, opts, since))
    found = [s for b in hosts for s in b.secrets]
    where = write_bundle(path, hosts, report, inventory, _secrets(inventory, opts, [*(extra_secrets or []), *found]))
    return where, hosts
