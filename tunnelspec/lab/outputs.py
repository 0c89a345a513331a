"""Files the lab writes for its users: inventory.ini, known_hosts, ssh_config.

Hosts are addressed by IP everywhere: a name that falls through to DNS would send lookups off
the machine. Nothing here carries a timestamp, so re-running `lab up` rewrites identical files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LAB_BUILD_JOBS = 2  # nproc inside a host shows every core of the machine


def known_hosts_text(host_keys: dict[str, str]) -> str:
    """host_keys: ip -> "ssh-ed25519 AAAA... comment"."""
    lines = []
    for ip_addr, pub in host_keys.items():
        keytype, blob = pub.split()[:2]
        lines.append(f"{ip_addr} {keytype} {blob}")
    return "\n".join(lines) + "\n"


def inventory_text(
    hosts: dict[str, str], key_file: Path, known_hosts: Path, fixtures: Any, login_user: str | None = None
) -> str:
    names = list(hosts)
    out = ["# Written by `tunnelspec lab up`: the lab's hosts, addressed by IP.", "[main]"]
    out.append(f"{names[0]} ansible_host={hosts[names[0]]}")
    out += ["", "[rpc]"]
    for i, name in enumerate(names[1:]):
        role = "draft" if i == 0 else "target"
        out.append(f"{name} ansible_host={hosts[name]} rpc_role={role}")
    login = [f"ansible_user={login_user}", "ansible_become=true"] if login_user else ["ansible_user=root"]
    out += [
        "",
        "[all:vars]",
        *login,
        f"ansible_ssh_private_key_file={key_file}",
        f"tunnelspec_known_hosts={known_hosts}",
        f"llama_build_jobs={LAB_BUILD_JOBS}",
        f"llama_repo={fixtures.repo}",
        f"llama_commit={fixtures.commit}",
    ]
    if getattr(fixtures, "build_number", None) is not None:
        out.append(f"llama_build_number={fixtures.build_number}")
    out += [f"llama_model={fixtures.model}", f"llama_draft_model={fixtures.model}"]
    return "\n".join(out) + "\n"


def ssh_config_text(hosts: dict[str, str], key_file: Path, known_hosts: Path) -> str:
    out = ["# Written by `tunnelspec lab up`. Use: ssh -F <this file> <host>"]
    for name, ip_addr in hosts.items():
        out += [
            f"Host {name} {ip_addr}",
            f"    HostName {ip_addr}",
            "    User root",
            f"    IdentityFile {key_file}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    CheckHostIP no",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "",
        ]
    return "\n".join(out)
