"""A non-root SSH user with `ansible_become=true` works through `sudo -n` on a real host; without
become the same play fails cleanly on permissions (no prompt, no hang)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import tunnelspec

pytestmark = pytest.mark.lab

HOST = "rpc-b"
USER = "tsbecome"


@pytest.fixture
def become_user(lab):
    pub = Path(str(lab.key_file) + ".pub")
    key = pub.read_text().strip() if pub.exists() else \
        __import__("subprocess").run(["ssh-keygen", "-y", "-f", str(lab.key_file)], capture_output=True,
                                     text=True, check=True).stdout.strip()
    script = ('set -e; id "$1" >/dev/null 2>&1 || useradd -m -s /bin/sh "$1"; '
              'install -d -m 700 -o "$1" -g "$1" "/home/$1/.ssh"; '
              'printf "%s\\n" "$2" > "/home/$1/.ssh/authorized_keys"; '
              'chown "$1:$1" "/home/$1/.ssh/authorized_keys"; chmod 600 "/home/$1/.ssh/authorized_keys"; '
              'printf "%s ALL=(root) NOPASSWD: ALL\\n" "$1" > /etc/sudoers.d/tsbecome; chmod 440 /etc/sudoers.d/tsbecome')
    res = lab.exec(HOST, ["sh", "-c", script, "sh", USER, key])
    assert res.returncode == 0, res.stderr
    yield USER
    lab.exec(HOST, ["sh", "-c", 'rm -f /etc/sudoers.d/tsbecome /root/tsbecome-proof; pkill -u "$1"; userdel -r "$1"',
                    "sh", USER])


def _inventory(lab, tmp_path, become: bool) -> Path:
    ip = lab.hosts[HOST]
    text = (f"[nodes]\n{HOST} ansible_host={ip} ansible_user={USER} ansible_become={str(become).lower()} "
            f"ansible_ssh_private_key_file={lab.key_file}\n\n[all:vars]\ntunnelspec_known_hosts={lab.known_hosts}\n")
    p = tmp_path / f"become-{become}.ini"
    p.write_text(text)
    return p


def test_become_via_sudo(lab, become_user, tmp_path):
    pb = tmp_path / "root-file.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - copy: {dest: /root/tsbecome-proof, content: \"made as root\\n\", mode: '0600'}\n")
    denied = tunnelspec("play", str(_inventory(lab, tmp_path, False)), str(pb), "--format", "json", timeout=120)
    assert denied.rc == 1, denied.stdout + denied.stderr
    assert "Permission denied" in denied.results("failed")[0]["msg"]
    assert lab.exec(HOST, ["test", "-e", "/root/tsbecome-proof"]).returncode == 1

    inv = _inventory(lab, tmp_path, True)
    first = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=120)
    assert first.rc == 0 and [e["status"] for e in first.results()] == ["changed"], first.stdout + first.stderr
    st = lab.exec(HOST, ["stat", "-c", "%U %a", "/root/tsbecome-proof"]).stdout.split()
    assert st == ["root", "600"]
    second = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=120)
    assert second.rc == 0 and [e["status"] for e in second.results()] == ["ok"]
