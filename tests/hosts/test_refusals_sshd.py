"""A host whose PID 1 is not systemd is refused in the run's first seconds, naming the host and what
was found, and nothing changes anywhere. The real-sshd test hosts are such hosts: real OpenSSH on
this machine, whose PID 1 is not systemd."""

from __future__ import annotations

import time

from support.cli import make_repo, tunnelspec


def test_hosts_without_systemd_are_refused_before_any_change(sshd_cluster, tmp_path):
    c = sshd_cluster(2)
    repo = tmp_path / "repo"
    commit = make_repo(repo)
    root = tmp_path / "tsroot"
    lock = tmp_path / "lock"
    lines = []
    for group, h in (("main", c.hosts[0]), ("rpc", c.hosts[1])):
        lines += [f"[{group}]", f"{h.name} ansible_host=127.0.0.1 ansible_port={h.port} ansible_user=root "
                  f"ansible_ssh_private_key_file={c.key}", ""]
    lines += ["[all:vars]", f"tunnelspec_known_hosts={c.known_hosts}", f"tunnelspec_lock_dir={lock}",
              f"tunnelspec_root={root}", f"llama_repo={repo}", f"llama_commit={commit}",
              "llama_model=/models/t.gguf", "llama_draft_model=/models/d.gguf"]
    inv = tmp_path / "inv.ini"
    inv.write_text("\n".join(lines) + "\n")

    t0 = time.monotonic()
    r = tunnelspec("deploy", str(inv), "--format", "json", timeout=120)
    took = time.monotonic() - t0
    print(f"\nrefused in {took:.1f} s")
    assert r.rc == 1, r.stdout[-3000:] + r.stderr[-2000:]
    failed = {e["host"]: e["msg"] for e in r.results("failed")}
    assert set(failed) == {h.name for h in c.hosts}, failed
    for host, msg in failed.items():
        assert msg.startswith(f"{host}: tunnelspec cannot serve this host (Debian"), msg
        assert "not systemd" in msg and "No host was changed" in msg, msg
    # Nothing ran after the facts: no other task, no lock, no root directory.
    assert {e["task"] for e in r.results()} <= {"host facts", "prerequisites can be met"}, r.results()
    assert not root.exists() and not lock.exists()
    # The human form says the same.
    h = tunnelspec("deploy", str(inv), timeout=120)
    assert h.rc == 1 and "not systemd" in h.stdout, h.stdout[-2000:]
