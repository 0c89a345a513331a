"""A run SIGKILLed between a task's apply and its handler (TUNNELSPEC_TEST_KILL_AT, core/testhooks.py)
against real sshd hosts: the next run sees the file converged and still runs the handler the
killed run owed (engine/pending.py); --check in between reports it as drift; the run after changes
nothing. Also the hook itself: a kill after the N-th command of an apply leaves that apply half done."""

from __future__ import annotations

from support.cli import tunnelspec

PLAYBOOK = """
- name: app
  hosts: all
  tasks:
    - name: config
      copy: {dest: "{{ root }}/app.conf", content: "{{ setting }}\\n", mode: "0644"}
      notify: [restart app]
    - name: other
      copy: {dest: "{{ root }}/other", content: "x\\n", mode: "0644"}
  handlers:
    # Stands in for a restart: what it writes says which setting it last "restarted" with, and
    # like every handler it runs only when notified.
    - name: restart app
      copy: {dest: "{{ root }}/restarted", content: "{{ setting }}\n", mode: "0644"}
"""


def _run(inv, pb, *args, kill_at: str | None = None):
    env = {"TUNNELSPEC_TEST_KILL_AT": kill_at} if kill_at else None
    return tunnelspec("play", str(inv), str(pb), "--format", "json", *args, env=env, timeout=120)


def test_handler_owed_by_a_killed_run_runs_next_time(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    pb = tmp_path / "app.yml"
    pb.write_text(PLAYBOOK)
    inv = cluster.inventory(all_vars={"setting": "one"})
    assert _run(inv, pb).rc == 0
    restarts = [h.root / "restarted" for h in cluster.hosts]
    assert all(p.read_text().strip() == "one" for p in restarts)

    inv = cluster.inventory(all_vars={"setting": "two"})
    # --forks 1: node0 first, so the kill lands after node0's new file and before node1 is touched.
    killed = _run(inv, pb, "--forks", "1", kill_at="config:apply")
    assert killed.rc == -9, (killed.rc, killed.stdout[-2000:], killed.stderr[-2000:])
    # On node0 the kill came after the new file and before its handler: the file says "converged".
    confs = [(h.root / "app.conf").read_text().strip() for h in cluster.hosts]
    assert confs == ["two", "one"]
    assert all(p.read_text().strip() == "one" for p in restarts)

    check = _run(inv, pb, "--check")
    assert check.rc == 3, check.stdout[-2000:]
    assert {(e["host"], e["task"]) for e in check.results("changed")} == {
        ("node0", "restart app"), ("node1", "config"), ("node1", "restart app")}

    again = _run(inv, pb)
    assert again.rc == 0, again.stdout[-3000:]
    assert all(p.read_text().strip() == "two" for p in restarts)   # the restart the killed run owed
    assert {(e["host"], e["task"]) for e in again.results("changed")} == {
        ("node0", "restart app"), ("node1", "config"), ("node1", "restart app")}

    last = _run(inv, pb)
    assert last.rc == 0 and all(h["changed"] == 0 for h in last.recap.values()), last.recap
    assert all(p.read_text().strip() == "two" for p in restarts)


def test_kill_after_the_nth_command_of_an_apply(sshd_cluster, tmp_path):
    cluster = sshd_cluster(1)
    pb = tmp_path / "two.yml"
    pb.write_text("""
- name: two steps
  hosts: all
  tasks:
    - name: steps
      command:
        argv: [sh, -c, 'touch "$1/a"; touch "$1/b"', sh, "{{ root }}"]
        creates: "{{ root }}/b"
""")
    inv = cluster.inventory()
    root = cluster.hosts[0].root
    # `steps` has one command in its apply: killed after it, before the re-check.
    r = tunnelspec("play", str(inv), str(pb), env={"TUNNELSPEC_TEST_KILL_AT": "steps:1"}, timeout=60)
    assert r.rc == -9 and (root / "b").exists()
    # Killed as the apply starts: nothing of it ran.
    (root / "a").unlink()
    (root / "b").unlink()
    r = tunnelspec("play", str(inv), str(pb), env={"TUNNELSPEC_TEST_KILL_AT": "steps"}, timeout=60)
    assert r.rc == -9 and not (root / "a").exists()
    # Another task's name: no kill.
    r = tunnelspec("play", str(inv), str(pb), env={"TUNNELSPEC_TEST_KILL_AT": "other"}, timeout=60)
    assert r.rc == 0 and (root / "b").exists()


# ---- llama_source killed half way (real git over real sshd) ------------------------------------------
SOURCE_PB = """
- name: source
  hosts: all
  tasks:
    - name: src
      llama_source: {repo: "{{ llama_repo }}", commit: "{{ llama_commit }}", root: "{{ root }}"}
"""


def _repo(tmp_path):
    from support.cli import make_repo

    repo = tmp_path / "upstream"
    return repo, make_repo(repo)


def _source_kill(cluster, inv, pb, kill_at: str):
    r = tunnelspec("play", str(inv), str(pb), "--format", "json",
                   env={"TUNNELSPEC_TEST_KILL_AT": kill_at}, timeout=120)
    assert r.rc == -9, (r.rc, r.stdout[-2000:], r.stderr[-2000:])
    first = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=120)
    assert first.rc == 0, first.stdout[-3000:]
    again = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=120)
    assert again.rc == 0 and all(h["changed"] == 0 for h in again.recap.values()), again.results("changed")
    return first


import pytest  # noqa: E402


@pytest.mark.parametrize("after", [3, 5, 6])   # the clone; the record dropped; the checkout
def test_source_clone_killed_half_way_is_redone(sshd_cluster, tmp_path, after):
    cluster = sshd_cluster(1)
    repo, commit = _repo(tmp_path)
    inv = cluster.inventory(all_vars={"llama_repo": str(repo), "llama_commit": f'"{commit}"'})
    pb = tmp_path / "src.yml"
    pb.write_text(SOURCE_PB)
    src = cluster.hosts[0].root / "src" / "llama.cpp"
    # Commands of the apply on an absent checkout: state, mkdir, clone (into place, marked), drop
    # the record, is the commit there, checkout, ...
    first = _source_kill(cluster, inv, pb, f"src:{after}")
    assert (src / "README").read_text() == "hello\n"
    assert not (src / ".git" / "tunnelspec-applying").exists()
    assert not (src.parent / "llama.cpp.tunnelspec-clone").exists()
    msgs = [e["msg"] for e in first.results("changed")]
    assert msgs and "interrupted" in msgs[0], msgs
