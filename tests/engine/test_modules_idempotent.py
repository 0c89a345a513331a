"""Every generic module, run twice against a real sshd host: `changed`, then `ok`."""

from __future__ import annotations

import subprocess

import pytest

from support.cli import make_repo, tunnelspec

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGyMz0EUsOGt4UfkMH3ayBQRj7q3bXYv1OGGf5xLsN1T tunnel"

CASES = {
    "directory": ('directory: {path: "{{ root }}/d", mode: "0750"}', lambda r: (r / "d").is_dir()),
    "symlink": ('symlink: {path: "{{ root }}/l", src: /etc/hostname}', lambda r: (r / "l").is_symlink()),
    "copy": ('copy: {dest: "{{ root }}/c", content: "x\\n", mode: "0600"}',
             lambda r: (r / "c").read_text() == "x\n" and (r / "c").stat().st_mode & 0o777 == 0o600),
    "template": ('template: {src: t.j2, dest: "{{ root }}/t"}', lambda r: (r / "t").read_text() == "host=node0\n"),
    "command": ('command: {argv: [mkdir, "{{ root }}/made"], creates: "{{ root }}/made"}',
                lambda r: (r / "made").is_dir()),
    "lineinfile": ('lineinfile: {path: "{{ root }}/li", line: "a=1", regexp: "^a=", create: true}',
                   lambda r: (r / "li").read_text() == "a=1\n"),
    "git_checkout": ('git_checkout: {repo: "{{ repo }}", dest: "{{ root }}/g", version: "{{ commit }}"}',
                     lambda r: (r / "g" / "README").exists()),
    "authorized_key": ('authorized_key: {path: "{{ root }}/ssh/authorized_keys", key: "' + PUB + '", '
                       'options: \'restrict,port-forwarding,permitopen="127.0.0.1:50052"\'}',
                       lambda r: (r / "ssh" / "authorized_keys").read_text().startswith("restrict,port-forwarding")),
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    from support.sshd_harness import SshdCluster

    base = tmp_path_factory.mktemp("mods")
    c = SshdCluster(base / "c", 1)
    repo = base / "repo"
    commit = make_repo(repo)
    (c.base / "t.j2").write_text("host={{ inventory_hostname }}\n")
    inv = c.inventory(all_vars={"repo": str(repo), "commit": commit})
    yield c, inv
    c.stop()


@pytest.mark.parametrize("module", sorted(CASES))
def test_module_changed_then_ok(host, module):
    c, inv = host
    task, verify = CASES[module]
    pb = c.base / f"{module}.yml"
    pb.write_text(f"- hosts: all\n  tasks:\n    - name: {module}\n      {task}\n")
    first = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert first.rc == 0, first.stdout + first.stderr
    assert [e["status"] for e in first.results()] == ["changed"]
    assert verify(c.hosts[0].root)
    second = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert [e["status"] for e in second.results()] == ["ok"], second.stdout
    assert second.rc == 0


def test_absent_removes_then_ok(host):
    c, inv = host
    target = c.hosts[0].root / "gone"
    target.write_text("bye")
    pb = c.base / "absent.yml"
    pb.write_text('- hosts: all\n  tasks:\n    - absent: {path: "{{ root }}/gone"}\n')
    assert [e["status"] for e in tunnelspec("play", str(inv), str(pb), "--format", "json").results()] == ["changed"]
    assert not target.exists()
    assert [e["status"] for e in tunnelspec("play", str(inv), str(pb), "--format", "json").results()] == ["ok"]


def test_git_checkout_refuses_local_modifications(host):
    c, inv = host
    pb = c.base / "git.yml"
    pb.write_text('- hosts: all\n  tasks:\n    - git_checkout: {repo: "{{ repo }}", dest: "{{ root }}/g2", '
                  'version: "{{ commit }}"}\n')
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 0
    (c.hosts[0].root / "g2" / "README").write_text("local edit\n")
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 1
    assert "local modifications" in res.results("failed")[0]["msg"]
    assert (c.hosts[0].root / "g2" / "README").read_text() == "local edit\n"


def test_template_validate_failure_keeps_old_file(host):
    c, inv = host
    dest = c.hosts[0].root / "validated"
    dest.write_text("old\n")
    pb = c.base / "val.yml"
    pb.write_text('- hosts: all\n  tasks:\n    - copy: {dest: "{{ root }}/validated", content: "new\\n", '
                  'validate: "grep -q never-there %s"}\n')
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 1 and "validation" in res.results("failed")[0]["msg"]
    assert dest.read_text() == "old\n"
    assert not list(dest.parent.glob("validated.*"))


def test_unknown_module_and_argument_fail_at_load_with_line(host):
    c, inv = host
    pb = c.base / "bad.yml"
    # Refused at load: not even the valid first task runs (it would make {{ root }}/before on the host).
    before = c.hosts[0].root / "before"
    pb.write_text('- hosts: all\n  tasks:\n    - name: ok\n      directory: {path: "{{ root }}/before"}\n'
                  '    - name: typo\n      copyy: {dest: "{{ root }}/y"}\n')
    res = tunnelspec("play", str(inv), str(pb))
    assert res.rc == 2 and f"{pb}:6" in res.stderr and "did you mean 'copy'" in res.stderr
    pb.write_text('- hosts: all\n  tasks:\n    - directory: {path: "{{ root }}/before"}\n'
                  '    - copy:\n        dest: "{{ root }}/y"\n        content: "x"\n        mdoe: \'0644\'\n')
    res = tunnelspec("play", str(inv), str(pb))
    assert res.rc == 2 and f"{pb}:7" in res.stderr and "mdoe" in res.stderr
    assert not before.exists() and not (c.hosts[0].root / "y").exists()


def test_undefined_variable_is_an_error(host):
    c, inv = host
    pb = c.base / "undef.yml"
    pb.write_text('- hosts: all\n  tasks:\n    - directory: {path: "{{ nope }}/x"}\n')
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 1 and "nope" in res.results("failed")[0]["msg"] and f"{pb}:3" in res.results("failed")[0]["msg"]
