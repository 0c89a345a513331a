"""Notified handlers survive a killed run: recorded on the host before the notifying apply.

A handler runs at the end of its play. A run killed between a task's apply (a new unit file, a new
authorized_keys line) and its handlers (the restart, the renewed sessions) would leave the next
run's checks seeing the file converged and nothing to notify: the service would keep running with
the old settings for good. So before a notifying task applies, its handler names are written to
`<dir>/<play hash>` on the host (default /var/lib/tunnelspec/pending: it survives a reboot too);
the next run of that play starts with them notified, and the record goes once the play's handlers
all ran. --check reads the record (the pending handlers are drift) and never writes it.
"""

from __future__ import annotations

import hashlib
import json

from tunnelspec.cluster.declared import DECLARED

PENDING_DIR_VAR = "tunnelspec_pending_dir"  # inventory override (tests running hosts on one machine)
PENDING_DIR = DECLARED[PENDING_DIR_VAR].default


def _path(hostvars: dict, play: str) -> str:
    d = str(hostvars.get(PENDING_DIR_VAR) or PENDING_DIR).rstrip("/")
    return f"{d}/{hashlib.sha256(play.encode()).hexdigest()[:16]}.json"


def load_argv(hostvars: dict, play: str) -> list[str]:
    """What `load` reads (a probe: the executor puts it in the play's batch)."""
    return ["sh", "-c", '[ -f "$1" ] || exit 0; cat -- "$1"', "sh", _path(hostvars, play)]


async def load(conn, hostvars: dict, play: str) -> list[str]:
    """The handler names a killed run of `play` notified and did not run ([] when none)."""
    res = await conn.probe(load_argv(hostvars, play))
    try:
        got = json.loads(res.stdout) if res.rc == 0 and res.stdout.strip() else {}
    except ValueError:
        return []
    names = got.get("notified") if isinstance(got, dict) and got.get("play") == play else None
    return [str(n) for n in names] if isinstance(names, list) else []


async def mark(conn, hostvars: dict, play: str, notified: list[str]) -> None:
    """Record `notified` (with what is recorded already) before the apply that notifies them."""
    path = _path(hostvars, play)
    names = sorted(set(await load(conn, hostvars, play)) | set(notified))
    await conn.run(["sh", "-c", 'mkdir -p -m 0755 -- "${1%/*}"', "sh", path], check=True)
    await conn.put(json.dumps({"play": play, "notified": names}) + "\n", path, 0o644)


async def clear(conn, hostvars: dict, play: str) -> None:
    # The directory goes when empty: a teardown prunes an empty /var/lib/tunnelspec.
    await conn.run(
        ["sh", "-c", 'rm -f -- "$1" && { rmdir -- "${1%/*}" 2>/dev/null || :; }', "sh", _path(hostvars, play)],
        check=True,
    )
