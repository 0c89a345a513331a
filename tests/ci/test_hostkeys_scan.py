"""`tunnelspec hostkeys scan`: shows real fingerprints, compares with known_hosts, writes nothing."""

from __future__ import annotations

import jsonschema

from support.ci_cli import ci_env, cli
from tunnelspec.reporting.schema import EVENT_SCHEMA


def test_scan_shows_fingerprints_and_trusts_nothing(sshd_target, tmp_path):
    t = sshd_target
    env = ci_env(tmp_path / "home")
    res = cli("hostkeys", "scan", str(t.inventory), env=env, timeout=120)
    assert res.rc == 0, res.stdout + res.stderr
    for host in t.hosts:
        assert f"{host} (127.0.0.1:" in res.stdout
        assert t.fingerprints[host] in res.stdout
    assert res.stdout.count("not pinned") == len(t.hosts)
    assert not t.known_hosts_file.exists()            # never written
    assert list((tmp_path / "home").iterdir()) == []

    t.known_hosts_file.write_text(t.known_hosts_text)
    before = t.known_hosts_file.read_bytes()
    res = cli("hostkeys", "scan", str(t.inventory), "--format", "json", env=env, timeout=120)
    assert res.rc == 0
    assert t.known_hosts_file.read_bytes() == before
    assert sorted(e["host"] for e in res.events) == sorted(t.hosts)
    for ev in res.events:
        jsonschema.validate(ev, EVENT_SCHEMA)
        statuses = {k["fingerprint"]: k["status"] for k in ev["keys"]}
        assert statuses == {t.fingerprints[ev["host"]]: "pinned"}


def test_scan_flags_changed_key_and_unreachable_host(sshd_target, tmp_path, sshd_cluster):
    t = sshd_target
    other = sshd_cluster(1, prefix="other").hosts[0]
    lines = t.known_hosts_text.splitlines()
    lines[0] = lines[0].split()[0] + " " + " ".join(other.host_key_pub.split()[:2])
    env = ci_env(tmp_path / "home", TUNNELSPEC_KNOWN_HOSTS="\n".join(lines) + "\n")
    res = cli("hostkeys", "scan", str(t.inventory), env=env, timeout=120)
    assert res.rc == 4
    first = res.stdout.split(f"{t.hosts[1]} (")[0]
    assert t.fingerprints[t.hosts[0]] in first and "CHANGED" in first and "WARNING" in res.stdout
    other.stop()
    inv = tmp_path / "gone.ini"
    inv.write_text(f"[x]\ngone ansible_host=127.0.0.1 ansible_port={other.port}\n")
    res = cli("hostkeys", "scan", str(inv), env=env, timeout=120)
    assert res.rc == 4 and "ERROR: cannot connect" in res.stdout
