"""The lab's generated files and addressing rules (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import LabError
from tunnelspec.lab import outputs
from tunnelspec.lab.image import content_key
from tunnelspec.lab.network import LabNet, parse_subnet

HOSTS = {"main": "10.77.0.10", "rpc-a": "10.77.0.11"}


def test_ssh_config_addresses_hosts_by_ip_with_strict_keys():
    text = outputs.ssh_config_text(HOSTS, Path("/l/id_ed25519"), Path("/l/known_hosts"))
    blocks = text.split("Host ")[1:]
    assert [b.split()[0] for b in blocks] == ["main", "rpc-a"]
    for block, ip_addr in zip(blocks, HOSTS.values()):
        assert f"HostName {ip_addr}" in block
        assert "StrictHostKeyChecking yes" in block
        assert "IdentitiesOnly yes" in block
        assert "UserKnownHostsFile /l/known_hosts" in block
        assert "IdentityFile /l/id_ed25519" in block


def test_known_hosts_lines_are_ip_type_key_without_comment():
    text = outputs.known_hosts_text({"10.77.0.10": "ssh-ed25519 AAAAkey root@main"})
    assert text == "10.77.0.10 ssh-ed25519 AAAAkey\n"


def test_lab_subnet_must_stay_inside_the_lab_range():
    assert str(parse_subnet("10.77.0.128/25")) == "10.77.0.128/25"
    for bad in ("192.168.1.0/24", "10.78.0.0/24", "10.77.0.0/30", "10.77.0.5/24", "nonsense"):
        with pytest.raises(LabError):
            parse_subnet(bad)


def test_host_addresses_start_at_ten_and_stop_at_the_subnet_end():
    net = LabNet("tslab0", parse_subnet("10.77.0.0/27"))
    assert net.gateway == "10.77.0.1"
    assert [net.host_ip(i) for i in range(3)] == ["10.77.0.10", "10.77.0.11", "10.77.0.12"]
    with pytest.raises(LabError):
        net.host_ip(21)  # 10.77.0.31 is the broadcast address


def test_image_key_changes_with_the_package_list(monkeypatch):
    from tunnelspec.lab import image

    before = content_key()
    monkeypatch.setattr(image, "PACKAGES", image.PACKAGES + ("strace",))
    assert content_key() != before
