"""Unit state from systemd, read: `systemctl show` (key=value lines, or one value per unit), a
service's active/enabled words, and which units run from an older file than the one installed.
Each is a command plus a pure parser (the parsers are unit-tested without systemd); every command
is read-only, run as a probe (connection/probes.py: a task that names it in `probes()` gets it from
its play's batch)."""

from __future__ import annotations

import re
from functools import partial

from tunnelspec.connection.probes import Merge, register_merge
from tunnelspec.facts.fact import Fact

# One round trip for all the units: does systemd still run each from an older version of its file?
# (its file is newer than its last start: a run was killed between writing the unit and restarting
# it). One `systemctl show` for every unit (a block each, in their order; systemd before 248 has no
# --timestamp=unix: NeedDaemonReload alone) and one `stat` of their files, however many units.
_STALE_SCRIPT = r"""
systemctl show --timestamp=unix -p NeedDaemonReload,ActiveEnterTimestamp -- "$@" 2>/dev/null ||
  systemctl show -p NeedDaemonReload -- "$@" 2>/dev/null
echo "== mtimes"
cd /etc/systemd/system 2>/dev/null && stat -c '%Y %n' -- "$@" 2>/dev/null
exit 0
"""


def stale(names: list[str]) -> Fact[dict[str, str]]:
    """Of the units `names`, those running from an older file than the one installed: {unit: why}."""
    return Fact(["sh", "-c", _STALE_SCRIPT, "sh", *names], partial(parse_stale, names=names))


async def stale_units(conn, names: list[str]) -> dict[str, str]:
    """Units running from an older file than the one installed: {unit: why}."""
    if not names:
        return {}
    return await stale(names).gather(conn)


def parse_stale(text: str, names: list[str]) -> dict[str, str]:
    """The stale script's output for the units `names`: systemd's blocks (one per unit, in order;
    none when systemd cannot be asked) and the unit files' mtimes."""
    head, _, tail = text.partition("== mtimes\n")
    blocks = [parse_show(b) for b in head.strip("\n").split("\n\n")] if head.strip() else []
    mtimes = {}
    for line in tail.splitlines():
        t, _, name = line.partition(" ")
        if t.isdigit():
            mtimes[name] = int(t)
    out: dict[str, str] = {}
    if len(blocks) != len(names):
        return out  # not one block per unit: nothing can be told apart
    for unit, props in zip(names, blocks, strict=True):
        started = props.get("ActiveEnterTimestamp", "").removeprefix("@")
        if props.get("NeedDaemonReload") == "yes":
            out[unit] = "unit file changed, not reloaded"
        elif started.isdigit() and int(started) and mtimes.get(unit, 0) > int(started):
            out[unit] = "unit file newer than the running service"
    return out


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A,B UNIT` → {"A": value, "B": value}."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def properties(unit: str, props: list[str]) -> Fact[dict[str, str]]:
    """The properties `props` of `unit`, by name."""
    return Fact(["systemctl", "show", "-p", ",".join(props), unit], parse_show)


async def show(conn, unit: str, props: list[str]) -> dict[str, str]:
    return await properties(unit, props).gather(conn)


def values(prop: str, units: list[str]) -> Fact[list[str]]:
    """One property of several units, in their order."""
    return Fact(["systemctl", "show", "-p", prop, "--value", *units], partial(parse_unit_values, n=len(units)))


async def unit_values(conn, prop: str, units: list[str]) -> list[str]:
    """One property of several units, in their order (`systemctl show --value` prints one per unit)."""
    if not units:
        return []
    return await values(prop, units).gather(conn)


def parse_unit_values(text: str, n: int) -> list[str]:
    """`systemctl show --value` of n units: one line per unit, the units separated by an empty line (a
    value may be empty, or hold spaces: a timestamp)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) == 2 * n - 1 and all(lines[i] == "" for i in range(1, len(lines), 2)):
        return lines[0::2]
    return text.split()  # another layout (older systemd): words, as before


SERVICE_STATE_SCRIPT = 'systemctl is-active "$1"; systemctl is-enabled "$1" 2>/dev/null || :'


# `systemctl is-active` and `is-enabled` answer from two vocabularies with no word in common: a word
# is put where it belongs even when the other command printed nothing (no systemd bus).
_ACTIVE = frozenset(
    {"active", "inactive", "failed", "activating", "deactivating", "reloading", "maintenance", "refreshing", "unknown"}
)
_ENABLED = frozenset(
    {
        "enabled",
        "enabled-runtime",
        "linked",
        "linked-runtime",
        "alias",
        "masked",
        "masked-runtime",
        "static",
        "indirect",
        "disabled",
        "generated",
        "transient",
        "bad",
        "not-found",
    }
)


def parse_service_state(text: str) -> tuple[str, str]:
    """(active state, enablement) — "" for what systemctl did not print."""
    active = enabled = ""
    for i, word in enumerate(text.split()[:2]):
        if word in _ENABLED and word not in _ACTIVE:
            enabled = enabled or word
        elif word in _ACTIVE:
            active = active or word
        elif i == 0:
            active = word
        else:
            enabled = word
    return active, enabled


def service(unit: str) -> Fact[tuple[str, str]]:
    """A service's (active state, enablement)."""
    return Fact(["sh", "-c", SERVICE_STATE_SCRIPT, "sh", unit], parse_service_state)


async def service_state(conn, unit: str) -> tuple[str, str]:
    return await service(unit).gather(conn)


# `service(unit)` of many units in one probe of a batch (connection/probes.py). `systemctl is-active`
# of them all prints a line per unit, in order, or stops at an error: a short answer ends the script
# (and the split serves none). `is-enabled` of several also prints a line per unit in order until an
# error, where it stops: systemd 252 stops at a unit without a file (later versions print not-found and
# go on). So each line of a whole-word answer is its unit's, the unit after the last one is asked alone
# (as `service(unit)` asks it), and the rest together again. A `.service` with a SysV script
# (/etc/init.d/NAME) is answered first, ahead of every native unit: with one among them, each unit is
# asked alone. After is-active's lines and a "=" line, each unit's is-enabled answer and a "=" line.
# Two processes for all the units when every one is installed, three or four with one missing,
# instead of two per unit.
_SERVICES = r"""
nl='
'
w() { k=$#; }
ok() { case $1 in *[!a-z"$nl"-]* | "$nl"* | *"$nl$nl"*) return 1 ;; esac; }
set -f
a=$(systemctl is-active "$@")
ok "$a" && w $a && [ "$k" -eq $# ] || k=-1
printf '%s\n=\n' "$a"
[ "$k" -ge 0 ] || exit 0
s=
for u do
  n=${u%.service}
  if [ -e "/etc/init.d/$n" ] || [ -L "/etc/init.d/$n" ] || [ -e "/etc/rc.d/init.d/$n" ]; then s=1; fi
done
while [ $# -gt 0 ]; do
  if [ -z "$s" ]; then
    e=$(systemctl is-enabled "$@" 2>/dev/null)
    if ok "$e" && w $e && [ "$k" -le $# ]; then
      for x in $e; do printf '%s\n=\n' "$x"; done
      shift "$k"
    fi
  fi
  [ $# -gt 0 ] || break
  systemctl is-enabled "$1" 2>/dev/null
  echo =
  shift
done
"""
# A unit name as written in a playbook: no option, glob, path or space (systemctl would expand,
# mangle or misread it), and a unit type's suffix.
_UNIT_NAME = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9:_.@-]{0,200}\."
    r"(service|socket|target|timer|path|mount|automount|swap|slice|scope|device)"
)
_WORD = re.compile(rb"[a-z][a-z-]*")  # every word is-active and is-enabled print


def _services_command(units: list[str]) -> list[str]:
    return ["sh", "-c", _SERVICES, "sh", *dict.fromkeys(units)]


def _services_split(rc: int, out: bytes, units: list[str]) -> list[bytes] | None:
    """Per unit, the bytes `service(unit)`'s argv prints; None unless every answer is where it must be."""
    names = list(dict.fromkeys(units))
    lines = out.split(b"\n")
    if rc != 0 or lines.pop() != b"":
        return None
    groups: list[list[bytes]] = [[]]  # is-active's lines, then each unit's is-enabled answer
    for line in lines:
        if line == b"=":
            groups.append([])
        elif _WORD.fullmatch(line):
            groups[-1].append(line)
        else:
            return None
    if groups.pop() or len(groups) != len(names) + 1 or len(groups[0]) != len(names):
        return None
    by_unit = {u: b"".join(w + b"\n" for w in [a, *e]) for u, a, e in zip(names, groups[0], groups[1:], strict=True)}
    return [by_unit[u] for u in units]


register_merge(
    Merge(
        prefix=("sh", "-c", SERVICE_STATE_SCRIPT, "sh"),
        accepts=lambda u: _UNIT_NAME.fullmatch(u) is not None,
        command=_services_command,
        split=_services_split,
    )
)
