"""--check on hosts that never saw the playbook: a later check that needs what an earlier task
would create is a planned change depending on it (`after`), not a failure; a check that fails with
nothing changing before it is what a real run meets too, and stays a failure. Real sshd hosts."""

from __future__ import annotations

from helpers import tunnelspec

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


def test_deploy_check_on_hosts_that_never_saw_tunnelspec(tmp_path, sshd_cluster):
    """The real deploy playbook, --check, on three sshd hosts with nothing of tunnelspec: exit 3,
    no failed task, and the plan holds source, build, rpc service, tunnels and llama-server (the lab
    test tests/deploy/test_check_fresh_lab.py does the same on freshly booted systemd hosts)."""
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
    assert r.rc == 3, (r.stdout[-3000:], r.stderr[-2000:])
    assert not r.results("failed") and not [e for e in r.events if e.get("event") == "gate" and e["status"] == "failed"]
    would = {(e["host"], e["task"]): e for e in r.results("changed") if e.get("would_change")}
    for key in [("main", "llama.cpp source at the pinned commit with the patch stack"),
                ("rpc-b", "llama.cpp binaries for the host's role"), ("rpc-a", "rpc unit"),
                ("rpc-a", "rpc service running"), ("rpc-a", "restricted authorized_keys line"),
                ("main", "tunnel units"), ("main", "llama-server unit"),
                ("main", "llama-server running")]:
        assert key in would, (key, sorted(would))
    # The steps that need what earlier ones create say so, and name them.
    unit = would[("main", "llama-server unit")]
    assert unit["after"] and "would run after" in unit["msg"]
    assert "llama.cpp binaries for the host's role" in would[("rpc-a", "rpc unit")]["after"]
    assert not root.exists()  # --check created nothing
