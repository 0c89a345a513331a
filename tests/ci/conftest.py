"""A CI target: real hosts (sshd on 127.0.0.1, or the lab) described WITHOUT credentials in the
inventory; the key and known_hosts are handed over the way a CI secret store would."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest


@dataclass
class Target:
    inventory: Path
    key_text: str            # the client private key (what TUNNELSPEC_SSH_KEY holds)
    known_hosts_text: str    # the verified host keys (what TUNNELSPEC_KNOWN_HOSTS holds)
    known_hosts_file: Path   # tunnelspec_known_hosts in the inventory: starts absent
    hosts: list[str]
    fingerprints: dict       # host name -> SHA256 fingerprint of its real host key
    kind: str


def _fingerprint(pub: str) -> str:
    return asyncssh.import_public_key(pub).get_fingerprint("sha256")


def _sshd_target(request, tmp_path) -> Target:
    c = request.getfixturevalue("sshd_cluster")(2, prefix="ci")
    known = tmp_path / "pinned_known_hosts"
    lines = ["[nodes]"]
    for h in c.hosts:
        lines.append(f"{h.name} ansible_host=127.0.0.1 ansible_port={h.port} ansible_user=root root={h.root}")
    lines += ["", "[all:vars]", f"tunnelspec_known_hosts={known}", ""]
    inv = tmp_path / "ci.ini"
    inv.write_text("\n".join(lines))
    return Target(inv, c.key.read_text(), c.known_hosts.read_text(), known, [h.name for h in c.hosts],
                  {h.name: _fingerprint(h.host_key_pub) for h in c.hosts}, "sshd")


def _lab_target(request, tmp_path) -> Target:
    lab = request.getfixturevalue("lab")
    known = tmp_path / "pinned_known_hosts"
    keep = [l for l in lab.inventory.read_text().splitlines()
            if not l.startswith(("ansible_ssh_private_key_file=", "tunnelspec_known_hosts="))]
    inv = tmp_path / "ci.ini"
    inv.write_text("\n".join(keep + [f"tunnelspec_known_hosts={known}", f"root=/var/tmp/tunnelspec-ci-test/{uuid.uuid4().hex[:12]}", ""]))
    known_text = lab.known_hosts.read_text()
    by_ip = {l.split()[0]: _fingerprint(" ".join(l.split()[1:3])) for l in known_text.splitlines() if l.strip()}
    return Target(inv, lab.key_file.read_text(), known_text, known, list(lab.hosts),
                  {name: by_ip[ip] for name, ip in lab.hosts.items()}, "lab")


@pytest.fixture(params=["sshd", pytest.param("lab", marks=pytest.mark.lab)])
def target(request, tmp_path) -> Target:
    return _sshd_target(request, tmp_path) if request.param == "sshd" else _lab_target(request, tmp_path)


@pytest.fixture
def sshd_target(request, tmp_path) -> Target:
    return _sshd_target(request, tmp_path)
