"""Floors a no-op run is measured against. Each is one process, timed whole by benchmarks/noop.py
(interpreter start and imports count), every host key verified against the same known_hosts.

    python benchmarks/raw_floor.py HOSTS.json                       # asyncssh, 8 commands per host
    python benchmarks/raw_floor.py HOSTS.json --commands 1 --lean   # asyncssh, the least it can do
    python benchmarks/raw_floor.py HOSTS.json --openssh CONTROL_DIR # OpenSSH through a persisted master

- default ("floor"): asyncssh connects to every host in parallel and runs 8 trivial commands per host
  (the generic playbook's task count, one command each: what a tool without batching pays).
- `--commands 1 --lean` ("floor-1"): one connection and one command per host, asyncssh with the
  cheapest settings (the key read once, no agent, no ssh config, AES-GCM, no compression).
- `--openssh DIR` ("floor-mux"): one `ssh` client per host running one command through an OpenSSH
  ControlMaster kept open between runs (ControlPersist, sockets in DIR), as Ansible's ssh plugin does:
  no key exchange at all once the masters are up. `--openssh DIR --stop` closes the masters.
The least of floor-1 and floor-mux is the "true floor": one connection (or none) and one batched
command per host, the least a no-op run can cost on this machine.
HOSTS.json: {"key": path, "known_hosts": path, "hosts": [{"address": ..., "port": ..., "user": ...}]}
"""

import argparse
import asyncio
import json
import sys

COMMANDS_PER_HOST = 8


def asyncssh_options(spec: dict, lean: bool) -> dict:
    """asyncssh.connect's key, known hosts and settings for a floor; `lean`: the cheapest ones (the key
    read once, no agent, no ssh config, AES-GCM, no compression)."""
    import asyncssh  # imported here so that the OpenSSH floor does not pay for it

    if not lean:
        return {"client_keys": [spec["key"]], "known_hosts": spec["known_hosts"], "config": None}
    return {"client_keys": [asyncssh.read_private_key(spec["key"])],
            "known_hosts": asyncssh.read_known_hosts(spec["known_hosts"]), "config": None,
            "agent_path": None, "encryption_algs": ["aes128-gcm@openssh.com"], "compression_algs": None}


async def with_asyncssh(spec: dict, commands: int, lean: bool) -> None:
    import asyncssh

    options = asyncssh_options(spec, lean)

    async def one(h: dict) -> None:
        async with asyncssh.connect(h["address"], port=h["port"], username=h["user"], **options) as conn:
            for _ in range(commands):
                res = await conn.run("true", check=True)
                assert res.exit_status == 0

    await asyncio.gather(*(one(h) for h in spec["hosts"]))


def ssh_argv(spec: dict, h: dict, control_dir: str) -> list[str]:
    return ["ssh", "-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={spec['known_hosts']}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "ControlMaster=auto", "-o", "ControlPersist=600", "-o", f"ControlPath={control_dir}/%C",
            "-F", "/dev/null", "-i", spec["key"], "-p", str(h["port"]), f"{h['user']}@{h['address']}"]


def with_openssh(spec: dict, control_dir: str, stop: bool) -> None:
    import subprocess  # here: the asyncssh floors do not need it

    procs = [(h, subprocess.Popen(ssh_argv(spec, h, control_dir) + (["-O", "exit"] if stop else ["true"]),
                                  stdin=subprocess.DEVNULL)) for h in spec["hosts"]]
    for h, p in procs:
        if p.wait(timeout=120) != 0 and not stop:
            raise SystemExit(f"ssh to port {h['port']} failed (rc={p.returncode})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec")
    ap.add_argument("--commands", type=int, default=COMMANDS_PER_HOST)
    ap.add_argument("--lean", action="store_true")
    ap.add_argument("--openssh", metavar="CONTROL_DIR")
    ap.add_argument("--stop", action="store_true")
    a = ap.parse_args()
    with open(a.spec) as f:
        spec = json.load(f)
    if a.openssh:
        with_openssh(spec, a.openssh, a.stop)
    else:
        asyncio.run(with_asyncssh(spec, a.commands, a.lean))
    sys.exit(0)
