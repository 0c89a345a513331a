"""`tunnelspec logs` against real sshd hosts (no systemd units there): the bundle is written, an
unreachable host is named while the others are collected, and an inventory secret appears nowhere.
The lab tests (tests/deploy/test_logs_lab.py) check the contents on a deployed cluster."""

from __future__ import annotations

import socket
import tarfile

from support.cli import tunnelspec

SECRET = "s3cr3t-VALUE-9f8e7d"
SHA = "0123456789abcdef0123456789abcdef01234567"


def _closed_port() -> int:
    # A port nothing listens on: the connection is refused at once, as to a host whose sshd is down.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inventory(cluster, tmp_path):
    main, rpc = cluster.hosts
    common = f"ansible_host=127.0.0.1 ansible_user=root ansible_ssh_private_key_file={cluster.key}"
    text = "\n".join([
        "[main]", f"m1 {common} ansible_port={main.port}", "",
        "[rpc]", f"r1 {common} ansible_port={rpc.port} rpc_role=draft",
        f"gone {common} ansible_port={_closed_port()} rpc_role=target rpc_port=50053", "",
        "[all:vars]", f"tunnelspec_known_hosts={cluster.known_hosts}", "llama_repo=/srv/llama.cpp",
        f'llama_commit="{SHA}"', f"bundle_api_token={SECRET}", ""])
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    # known_hosts names hosts by [127.0.0.1]:port: the closed port simply has no entry.
    return path


def test_bundle_written_with_unreachable_host_named(tmp_path, sshd_cluster):
    cluster = sshd_cluster(2)
    inv = _inventory(cluster, tmp_path)
    out = tmp_path / "bundle"
    r = tunnelspec("logs", str(inv), "--output", str(out), timeout=300)
    # The bundle is written; the exit code says a host is missing from it (docs/ci.md: 4).
    assert r.rc == 4 and "unreachable: gone" in r.stderr, r.stdout + r.stderr
    assert f"bundle written to {out}" in r.stdout
    assert "gone" in r.stdout and "UNREACHABLE" in r.stdout
    files = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert {"summary.txt", "status.json", "inventory.json", "gone/UNREACHABLE.txt",
            "m1/units.txt", "r1/units.txt"} <= set(files), sorted(files)
    assert "m1" in files["status.json"] and "r1" in files["status.json"]
    assert "bundle_api_token" in files["inventory.json"] and "***" in files["inventory.json"]
    leaked = [name for name, text in files.items() if SECRET in text]
    assert not leaked and SECRET not in r.stdout + r.stderr, leaked
    assert all((out / name).stat().st_mode & 0o077 == 0 for name in files)


def test_bundle_as_archive(tmp_path, sshd_cluster):
    cluster = sshd_cluster(2)
    inv = _inventory(cluster, tmp_path)
    out = tmp_path / "bundle.tar.gz"
    r = tunnelspec("logs", str(inv), "-o", str(out), timeout=300)
    assert r.rc == 4, r.stdout + r.stderr  # "gone" is unreachable
    with tarfile.open(out) as tar:
        names = tar.getnames()
        texts = [tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()]
    assert "bundle/summary.txt" in names and "bundle/gone/UNREACHABLE.txt" in names
    assert not any(SECRET in t for t in texts)
