"""--check on hosts that never saw the playbook: a later check that needs what an earlier task
would create is a planned change depending on it (`after`), not a failure; a check that fails with
nothing changing before it is what a real run meets too, and stays a failure. Real sshd hosts."""

from __future__ import annotations

from support.cli import tunnelspec

PLAN = """
- name: plan
  hosts: all
  tasks:
    - name: conf file
      copy: {dest: "{{ root }}/conf", content: "a = 1\\nb = 2\\n"}
    - name: conf line
      lineinfile: {path: "{{ root }}/conf", line: "b = 2"}
"""
ALONE = """
- name: alone
  hosts: all
  tasks:
    - name: conf line
      lineinfile: {path: "{{ root }}/missing.conf", line: "b = 2"}
"""


def _playbook(tmp_path, text: str):
    path = tmp_path / "pb.yml"
    path.write_text(text)
    return path


def test_later_steps_are_planned_after_earlier_would_changes(tmp_path, sshd_cluster):
    c = sshd_cluster(2)
    inv = c.inventory()
    pb = _playbook(tmp_path, PLAN)
    chk = tunnelspec("play", str(inv), str(pb), "--check", "--diff", "--format", "json")
    assert chk.rc == 3, chk.stdout + chk.stderr
    assert not chk.results("failed"), chk.results("failed")
    for h in c.hosts:
        line = next(e for e in chk.results() if e["host"] == h.name and e["task"] == "conf line")
        assert line["status"] == "changed" and line["would_change"] and line["after"] == ["conf file"], line
        assert "does not exist" in line["msg"] and "conf file" in line["msg"]
        assert not (h.root / "conf").exists()  # --check changed nothing
    # The plan was right: the real run does it, and then --check finds nothing to do.
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 0
    again = tunnelspec("play", str(inv), str(pb), "--check", "--format", "json")
    assert again.rc == 0 and not [e for e in again.results() if e.get("after")], again.stdout


def test_failing_check_with_nothing_before_it_stays_a_failure(tmp_path, sshd_cluster):
    c = sshd_cluster(1)
    inv = c.inventory()
    pb = _playbook(tmp_path, ALONE)
    chk = tunnelspec("play", str(inv), str(pb), "--check", "--format", "json")
    assert chk.rc == 1, chk.stdout
    (failed,) = chk.results("failed")
    assert "does not exist" in failed["msg"] and "after" not in failed
    # The real run meets the same failure.
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 1


def test_deploy_check_on_hosts_without_systemd_refuses_them(tmp_path, sshd_cluster):
    """The real deploy playbook, --check, on three sshd hosts (this machine: PID 1 is not systemd):
    the check refuses them as the run would, naming each host and the reason, and creates nothing.
    The plan on hosts that never saw tunnelspec is shown on real systemd hosts in
    tests/deploy/test_check_fresh_lab.py."""
    c = sshd_cluster(3)
    m, a, b = c.hosts
    common = f"ansible_host=127.0.0.1 ansible_user=root ansible_ssh_private_key_file={c.key}"
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    root = tmp_path / "never-deployed"  # tunnelspec_root: nothing there, as on a new host
    inv = tmp_path / "inventory.ini"
    inv.write_text("\n".join([
        "[main]", f"main {common} ansible_port={m.port}", "[rpc]",
        f"rpc-a {common} ansible_port={a.port} rpc_role=draft",
        f"rpc-b {common} ansible_port={b.port} rpc_role=target rpc_port=50053 tunnel_port=15060",
        "[all:vars]", f"tunnelspec_known_hosts={c.known_hosts}", "llama_repo=https://github.com/ggml-org/llama.cpp",
        'llama_commit="0123456789abcdef0123456789abcdef01234567"', f"llama_model={model}",
        f"llama_draft_model={model}", f"tunnelspec_root={root}", ""]))
    r = tunnelspec("deploy", str(inv), "--check", "--diff", "--format", "json", timeout=600)
    assert r.rc == 1, (r.stdout[-3000:], r.stderr[-2000:])
    failed = {e["host"]: e["msg"] for e in r.results("failed")}
    assert set(failed) == {"main", "rpc-a", "rpc-b"}, failed
    assert all("not systemd" in msg for msg in failed.values()), failed
    assert not r.results("changed")
    assert not root.exists()  # --check created nothing
