"""`tunnelspec hostkeys scan`: show every host's SSH host keys and SHA256 fingerprints for a human
to compare out of band. It never trusts what it sees and never writes known_hosts: pinning is the
user's act (paste the printed line after checking the fingerprint) or `--accept-new-host-keys`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field

import asyncssh

from tunnelspec.connection.base import ConnectOptions
from tunnelspec.connection.factory import check_known_hosts, known_hosts_for, settings_for
from tunnelspec.connection.ssh import close_jump, open_jump
from tunnelspec.connection.hostkeys import fingerprint, host_patterns, keys_for, load_known_hosts_text
from tunnelspec.core.errors import EXIT_OK, EXIT_UNREACHABLE, HostKeyError, HostUnreachable, UsageError
from tunnelspec.inventory.addresses import ssh_address
from tunnelspec.inventory import load_inventory
from tunnelspec.reporting import events

# One connection per algorithm: a server shows one host key per key exchange.
ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "rsa-sha2-512")
PINNED, NOT_PINNED, CHANGED = "pinned", "not pinned", "CHANGED"


@dataclass
class ScannedKey:
    algorithm: str
    fingerprint: str
    status: str  # PINNED, NOT_PINNED or CHANGED
    known_hosts_line: str


@dataclass
class HostScan:
    host: str
    address: str
    port: int
    keys: list[ScannedKey] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None

    def as_dict(self) -> dict:
        return {
            "host": self.host,
            "address": self.address,
            "port": self.port,
            "error": self.error,
            "skipped": self.skipped,
            "keys": [k.__dict__ for k in self.keys],
        }


def _status(key: asyncssh.SSHKey, known: list[asyncssh.SSHKey]) -> str:
    blob = key.public_data
    if any(k.public_data == blob for k in known):
        return PINNED
    if any(k.algorithm == key.algorithm for k in known):
        return CHANGED
    return NOT_PINNED


async def scan_host(name: str, host_vars: dict, opts: ConnectOptions, inventory_dir) -> HostScan:
    address, port = ssh_address(name, host_vars)
    res = HostScan(name, address, port)
    if str(host_vars.get("ansible_connection", "ssh")) == "local":
        res.skipped = "ansible_connection=local: no SSH"
        return res
    spec, _pin = known_hosts_for(host_vars, opts, inventory_dir)
    settings = settings_for(name, host_vars, inventory_dir)
    timeout = settings["timeout"] or opts.connect_timeout
    known = keys_for(load_known_hosts_text(spec), address, port)
    jump = settings["ssh_args"].jump
    hops: list = []
    if jump:
        # Through the jump host, whose own key must already be pinned: a scan never trusts what it sees.
        strict = dataclasses.replace(opts, known_hosts=spec, accept_new_host_keys=False, connect_timeout=timeout)
        try:
            hops = await open_jump(name, jump, strict, settings["key_files"], None)
        except (HostUnreachable, HostKeyError) as e:
            res.error = str(e)
            return res
    try:
        return await _scan_keys(res, address, port, known, timeout, hops[-1] if hops else None)
    finally:
        close_jump(hops)


async def _scan_keys(res: HostScan, address: str, port: int, known: list, timeout: float, tunnel) -> HostScan:
    seen: set[bytes] = set()
    extra = {"tunnel": tunnel} if tunnel is not None else {}
    for alg in ALGORITHMS:
        try:
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(address, port, server_host_key_algs=[alg], **extra), timeout
            )
        except asyncssh.KeyExchangeFailed:
            continue  # the server has no key of this type
        except (OSError, asyncssh.Error, TimeoutError) as e:
            if not res.keys:
                res.error = f"cannot connect to {address}:{port}: {e or type(e).__name__}"
                return res
            continue
        if key is None or key.public_data in seen:
            continue
        seen.add(key.public_data)
        line = f"{','.join(host_patterns(address, port))} {key.export_public_key().decode().strip()}"
        res.keys.append(ScannedKey(key.algorithm.decode(), fingerprint(key), _status(key, known), line))
    if not res.keys and res.error is None:
        res.error = "the server offered no host key tunnelspec can read"
    return res


async def scan(inventory, hosts: list[str], opts: ConnectOptions) -> list[HostScan]:
    return list(
        await asyncio.gather(*(scan_host(h, inventory.host_vars(h), opts, inventory.path.parent) for h in hosts))
    )


def exit_code(results: list[HostScan]) -> int:
    bad = any(r.error for r in results) or any(k.status == CHANGED for r in results for k in r.keys)
    return EXIT_UNREACHABLE if bad else EXIT_OK


def format_human(results: list[HostScan]) -> str:
    out = []
    for r in results:
        out.append(f"{r.host} ({r.address}:{r.port})")
        if r.skipped:
            out.append(f"  skipped: {r.skipped}")
        if r.error:
            out.append(f"  ERROR: {r.error}")
        for k in r.keys:
            out.append(f"  {k.algorithm:<20} {k.fingerprint}  {k.status}")
        for k in r.keys:
            if k.status != PINNED:
                out.append(f"    # after verifying {k.fingerprint} out of band: {k.known_hosts_line}")
    changed = [(r.host, k) for r in results for k in r.keys if k.status == CHANGED]
    if changed:
        out.append("")
        out.append(
            "WARNING: host key(s) differ from known_hosts: "
            + ", ".join(h for h, _ in changed)
            + ". This may be an attack; do not re-pin until the host's owner confirms the new key."
        )
    out.append("")
    out.append(
        "Nothing was trusted or written. Compare each fingerprint with the host's own "
        "(`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on its console) before pinning."
    )
    return "\n".join(out)


def run_scan(
    inventory_path: str, limit: str | None, fmt: str, opts: ConnectOptions, stream, extra_vars: dict | None = None
) -> int:
    """The CLI's entry point: prints the scan, returns the exit code (4 if a host failed or changed).
    `extra_vars` (-e) sit above the inventory, as for every command (ansible_host, ansible_port, …)."""
    inv = load_inventory(inventory_path).with_extra_vars(extra_vars or {})
    hosts = inv.match(limit or "all")
    if not hosts:
        raise UsageError(
            f"--limit {limit!r} matches no host in {inventory_path}" if limit else f"{inventory_path}: no hosts"
        )

    check_known_hosts(inv, hosts, opts)
    results = asyncio.run(scan(inv, hosts, opts))
    if fmt == "json":
        for r in results:
            stream.write(json.dumps(events.host_keys(**r.as_dict()), sort_keys=True) + "\n")
    else:
        stream.write(format_human(results) + "\n")
    return exit_code(results)
