"""One run at a time per cluster: a lock on every host of a run, taken before its first task.

Why on the hosts: two CI pipelines deploying one cluster may run on different controllers, so
nothing on a controller can see the other run. Each host gets, over the run's own SSH connection, a
small process that takes `flock` on `<dir>/run.lock` (default /run/tunnelspec, a root-owned
directory on a tmpfs: no lock can outlive a reboot), writes who holds it to `<dir>/run.holder`,
then sits reading its stdin. It ends — and the kernel drops the lock — when its stdin closes: at
the end of the run, or when the controller dies (SIGKILL included: the SSH session closes with its
TCP connection). So a killed run never leaves a lock to clean by hand.

Hosts are locked one at a time in one order (address, port, name): two runs over overlapping
hosts cannot each hold a part and wait for the other's. Two inventory names for one machine (one
lock file) are recognised by the run's own token in the holder file and locked once.

Only mutating commands lock (deploy, teardown, tunnel open|close, keys rotate, play without
--check); the CLI decides (RunOptions.lock names the command). Read-only ones never wait.

What a run reads before its lock may be another run's half-done work. So a run first tries every
host's lock at once without waiting (`try_now`), before it reads anything: when all are free it holds
them from its first read on. When one is held it lets go of all (it never waits holding a part), runs
its read-only preflight plays, waits for the locks in order (`acquire`), and then reads everything
again (engine/executor.py drops what was read ahead).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import time
from datetime import datetime, UTC

from tunnelspec.cluster.declared import DECLARED
from tunnelspec.core.errors import EXIT_LOCKED, HostUnreachable, TaskFailed, TunnelspecError
from tunnelspec.inventory.addresses import ssh_host
from tunnelspec.reporting import events

LOCK_DIR_VAR = "tunnelspec_lock_dir"  # inventory override (tests on one machine, non-root hosts)
LOCK_DIR = DECLARED[LOCK_DIR_VAR].default
BUSY_EVERY_S = 30  # how often a waiting run repeats who holds the lock
_STEP_S = 5  # the remote script re-reads the holder this often
_EXIT_BUSY = 75  # EX_TEMPFAIL: locked and not waiting, or waited out

# $1 lock dir, $2 holder line (JSON), $3 this run's token, $4 seconds to wait (0: do not), $5 step,
# $6 "default" when $1 is the default (a login that is not root and has no `become` then locks in its
# own runtime dir: it can only change what it owns, and a run of tunnelspec must not fail for it).
# Prints BUSY <holder> while waiting, then LOCKED (or SHARED: this run holds it already), then holds
# the lock until its stdin ends. The holder file goes before the lock does (fd 9 is still open).
# $7 "try": the run's first try, before it has read anything and before its preflight may refuse the
# host: it creates nothing. Where the lock file is not there yet, or where the directory the wait
# would use cannot be told without creating one, it prints NEW and the run locks after its preflight.
# It never spins: no flock(1) is NOFLOCK at once (a missing command would otherwise read as "busy"),
# a flock failure other than "held by another" (rc 1) is FLOCKERR, and a wait that returned sooner
# than its -w step is paced by a sleep.
_SCRIPT = r"""
set -u
dir=$1 me=$2 token=$3 wait=$4 step=$5
command -v flock >/dev/null 2>&1 || { echo "NOFLOCK $(uname -s 2>/dev/null) PATH=$PATH"; exit 69; }
umask 022
if [ "${7:-}" = try ]; then
  if [ "$6" = default ] && ! { [ -d "$dir" ] && [ -w "$dir" ]; }; then
    [ -d "$dir" ] || { echo NEW; exit 0; }
    dir=${XDG_RUNTIME_DIR:-${HOME:-/nonexistent}/.cache}/tunnelspec
  fi
  [ -d "$dir" ] && [ -f "$dir/run.lock" ] || { echo NEW; exit 0; }
else
  if [ "$6" = default ] && ! { mkdir -p -m 0755 -- "$dir" 2>/dev/null && [ -w "$dir" ]; }; then
    dir=${XDG_RUNTIME_DIR:-${HOME:-/nonexistent}/.cache}/tunnelspec
    mkdir -p -m 0700 -- "$dir" 2>/dev/null || dir=/tmp/tunnelspec-lock-$(id -u)
  fi
  mkdir -p -m 0755 -- "$dir" || exit 70
fi
info="$dir/run.holder"
exec 9>>"$dir/run.lock" || exit 70
holder() { head -c 2000 -- "$info" 2>/dev/null | tr -d '\n'; }
rc=0; flock -n 9 || rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 1 ] || { echo "FLOCKERR flock -n exited $rc"; exit 70; }
  h=$(holder)
  case $h in *"\"token\": \"$token\""*) echo SHARED; exit 0;; esac
  echo "BUSY $h"
  [ "$wait" -gt 0 ] || exit 75
  end=$(( $(date +%s) + wait ))
  while :; do
    t0=$(date +%s) rc=0
    flock -w "$step" 9 || rc=$?
    [ "$rc" -ne 0 ] || break
    [ "$rc" -eq 1 ] || { echo "FLOCKERR flock -w exited $rc"; exit 70; }
    [ "$(date +%s)" -lt "$end" ] || { echo "TIMEOUT $(holder)"; exit 75; }
    [ "$(date +%s)" -gt "$t0" ] || sleep 1
    echo "BUSY $(holder)"
  done
fi
printf '%s\n' "$me" > "$info.tmp" && mv -f -- "$info.tmp" "$info"
echo LOCKED
cat > /dev/null
rm -f -- "$info"
"""


class RunLocked(TunnelspecError):
    """Another run holds the lock of a host of this run (--no-wait, or --lock-timeout passed)."""

    exit_code = EXIT_LOCKED


def describe(holder: dict) -> str:
    """`tunnelspec deploy (pid 4242 on ci-3) since 2026-12-01T09:30:00Z` from a holder record."""
    if not holder:
        return "another run (holder not recorded yet)"
    return (
        f"tunnelspec {holder.get('command', '?')} (pid {holder.get('pid', '?')} on "
        f"{holder.get('controller', '?')}) since {holder.get('since', '?')}"
    )


def _parse_holder(text: str) -> dict:
    try:
        got = json.loads(text)
    except ValueError:
        return {}
    return {k: got[k] for k in ("command", "pid", "controller", "since") if k in got} if isinstance(got, dict) else {}


def holder_record(command: str, token: str) -> str:
    since = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return json.dumps(
        {"command": command, "pid": os.getpid(), "controller": socket.gethostname(), "since": since, "token": token}
    )


class RunLock:
    """The locks of one run. `acquire()` before the first task, `release()` at the end."""

    def __init__(self, run, command: str, timeout: float, wait: bool):
        self.run = run
        self.command = command
        self.timeout = max(0, int(timeout))
        self.wait = wait
        self.token = secrets.token_hex(8)
        self._held: list = []

    def _order(self, hosts: list[str]) -> list[str]:
        def key(h):
            hv = self.run.hosts[h].vars
            return (ssh_host(h, hv), str(hv.get("ansible_port") or 22), h)

        return sorted(set(hosts), key=key)

    async def try_now(self, hosts: list[str]) -> bool:
        """Every host's lock at once, none waited for and nothing created; True when this run holds
        them all (and keeps them). False when a host is held by another run, cannot be reached now,
        has no lock file yet (its first run, or after a reboot) or cannot be locked (no flock, ...):
        then none is kept, and `acquire` waits for them and says why, as before."""
        order = self._order(hosts)
        conns = await asyncio.gather(*(self.run.connection(h) for h in order), return_exceptions=True)
        failed = [c for c in conns if isinstance(c, BaseException)]
        for c in failed:
            if not isinstance(c, TunnelspecError):
                raise c
        if failed:
            return False
        got = await asyncio.gather(*(self._try_one(c) for c in conns), return_exceptions=True)
        # Two names for one machine share its lock: the second's try, beside the first's, may find it
        # taken before the first wrote this run's token. Asked again now, that is SHARED.
        got = [await self._try_one(c) if g == "BUSY" else g for c, g in zip(conns, got, strict=True)]
        if all(g in ("LOCKED", "SHARED") for g in got):
            return True
        await self.release()
        return False

    async def _try_one(self, conn) -> str:
        try:
            proc = await conn.spawn(self._argv(conn.name, 0, first=True))
        except HostUnreachable:
            return "UNREACHABLE"
        word = (await proc.readline()).partition(" ")[0]
        if word == "LOCKED":
            self._held.append(proc)
            return word
        await proc.close()
        return word

    def _argv(self, host: str, wait_s: int, first: bool = False) -> list[str]:
        chosen = self.run.hosts[host].vars.get(LOCK_DIR_VAR)
        return [
            "sh",
            "-c",
            _SCRIPT,
            "sh",
            str(chosen or LOCK_DIR),
            holder_record(self.command, self.token),
            self.token,
            str(wait_s),
            str(min(_STEP_S, max(1, wait_s))),
            "" if chosen else "default",
            "try" if first else "",
        ]

    async def acquire(self, hosts: list[str]) -> None:
        order = self._order(hosts)
        # Connect in parallel (the run reuses these connections); lock one by one, in order.
        conns = await asyncio.gather(*(self.run.connection(h) for h in order), return_exceptions=True)
        started = time.monotonic()
        for host, conn in zip(order, conns, strict=False):
            if isinstance(conn, BaseException):
                if isinstance(conn, TunnelspecError):
                    continue  # unreachable or refused: the run reports it for that host
                raise conn
            left = self.timeout - (time.monotonic() - started) if self.wait else 0
            await self._lock_one(host, conn, max(1, int(left)) if self.wait else 0)

    async def _lock_one(self, host: str, conn, wait_s: int) -> None:
        try:
            proc = await conn.spawn(self._argv(host, wait_s))
        except HostUnreachable:
            return
        last_said, last_holder = 0.0, None
        while True:
            line = await proc.readline()
            word, _, rest = line.partition(" ")
            if word == "LOCKED":
                self._held.append(proc)
                return
            if word == "SHARED":
                await proc.close()
                return
            holder = _parse_holder(rest)
            if word == "BUSY":
                if not self.wait:
                    await proc.close()
                    raise RunLocked(
                        f"{host} is locked by {describe(holder)}: another run is changing this "
                        "cluster; not waiting (--no-wait)"
                    )
                now = time.monotonic()
                if holder != last_holder or now - last_said >= BUSY_EVERY_S:
                    last_said, last_holder = now, holder
                    self.run.emit(
                        events.run_lock_waiting(
                            host, holder, f"waiting for {describe(holder)} to finish (up to {wait_s}s, --lock-timeout)"
                        )
                    )
                continue
            await proc.close()
            if word == "NOFLOCK":
                system, _, path = rest.partition(" ")
                where = f" ({system})" if system and system != "Linux" else ""
                raise TaskFailed(
                    f"cannot take the run lock on {host}: flock not found (util-linux) on {host}{where}, "
                    f"{path or 'PATH unknown'}: tunnelspec holds its run lock with flock(1); "
                    "install util-linux"
                )
            if word == "TIMEOUT":
                raise RunLocked(
                    f"{host} is still locked by {describe(holder)} after {wait_s}s (--lock-timeout); "
                    "nothing was changed by this run"
                )
            # No LOCKED line and the process ended: no flock, no /run, no root.
            raise TaskFailed(
                f"cannot take the run lock on {host}: {line or 'the lock process ended'} "
                f"(needs flock(1) and a writable {LOCK_DIR_VAR}, default {LOCK_DIR})"
            )

    async def release(self) -> None:
        held, self._held = self._held, []
        await asyncio.gather(*(p.close() for p in held), return_exceptions=True)
