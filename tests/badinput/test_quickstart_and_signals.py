"""The README quickstart on first use (its known_hosts does not exist yet), Ctrl-C, a closed stdout,
`-i INVENTORY`, `--list-hosts` and `--list-tags`: never a traceback, always the exit code of the table
in docs/ci.md. Only loopback addresses; every wait has a deadline."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.cli import tunnelspec
from test_badinput import Honeypot

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def crash_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture
def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused at once
    yield s.getsockname()[1]
    s.close()


def quickstart_inventory(ports: dict[str, int]) -> str:
    """The README's quickstart inventory as written, each host moved to 127.0.0.1 and a port of ours."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart on real hardware"):]
    block = re.search(r"\*\*Write `inventory.ini`\*\*.*?```ini\n(.*?)```", section, re.S).group(1)
    text = "\n".join(l.strip() for l in block.splitlines()) + "\n"
    assert "tunnelspec_known_hosts=known_hosts" in text
    for name, port in ports.items():
        text, n = re.subn(rf"^({name}) ansible_host=\S+", rf"\1 ansible_host=127.0.0.1 ansible_port={port}", text,
                          flags=re.M)
        assert n == 1, name
    assert "192.168." not in text
    return text.replace("<full 40-hex SHA you reviewed>", COMMIT)


def _no_traceback(res):
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr


QUICKSTART_STEPS = [["hostkeys", "scan", "inventory.ini"], ["deploy", "inventory.ini", "--check", "--diff"],
                    ["deploy", "inventory.ini", "--check", "--format", "json"], ["status", "inventory.ini"],
                    ["status", "inventory.ini", "--format", "json"], ["deploy", "inventory.ini"]]


@pytest.mark.parametrize("argv", QUICKSTART_STEPS, ids=["_".join(a[:1] + a[2:]) or a[0] for a in QUICKSTART_STEPS])
def test_quickstart_first_use_hosts_refused(argv, tmp_path, dead_port):
    """known_hosts does not exist yet (it is read as empty, never as known_hosts text); the hosts refuse
    the connection: exit 4, each host named."""
    (tmp_path / "inventory.ini").write_text(quickstart_inventory({"srv": dead_port, "laptop": dead_port}))
    res = tunnelspec(*argv, cwd=tmp_path, timeout=120)
    _no_traceback(res)
    assert res.rc == 4, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "srv" in out and "cannot connect" in out, out
    if "json" in argv:
        [json.loads(l) for l in res.stdout.splitlines()]
    assert not (tmp_path / "known_hosts").exists()


def test_quickstart_first_use_unknown_host_key(tmp_path, sshd_cluster, dead_port):
    """With a real sshd for srv (the laptop away): deploy --check says srv's key is unknown and what to do;
    hostkeys scan prints the line to pin; --accept-new-host-keys creates known_hosts with it."""
    c = sshd_cluster(1, prefix="srv")
    srv = c.hosts[0]
    (tmp_path / "inventory.ini").write_text(quickstart_inventory({"srv": srv.port, "laptop": dead_port}))

    res = tunnelspec("deploy", "inventory.ini", "--check", cwd=tmp_path, timeout=120)
    _no_traceback(res)
    assert res.rc == 4, res.stdout + res.stderr
    assert "unknown host key" in res.stdout and "tunnelspec hostkeys scan" in res.stdout, res.stdout
    assert str(tmp_path / "known_hosts") in res.stdout and "--accept-new-host-keys" in res.stdout

    res = tunnelspec("hostkeys", "scan", "inventory.ini", cwd=tmp_path, timeout=120)
    _no_traceback(res)
    assert res.rc == 4, res.stdout + res.stderr  # the laptop cannot be reached
    line = srv.known_hosts_line()
    assert line.split()[:3] == [f"[127.0.0.1]:{srv.port}", *srv.host_key_pub.split()[:2]]
    assert " ".join(line.split()[:3]) in res.stdout and "not pinned" in res.stdout, res.stdout
    assert not (tmp_path / "known_hosts").exists()  # scan writes nothing

    res = tunnelspec("deploy", "inventory.ini", "--check", "--accept-new-host-keys", cwd=tmp_path, timeout=120)
    _no_traceback(res)
    assert res.rc == 4, res.stdout + res.stderr  # no key for srv, the laptop away: still unreachable
    pinned = (tmp_path / "known_hosts").read_text()
    assert srv.host_key_pub.split()[1] in pinned and f"[127.0.0.1]:{srv.port}" in pinned


def test_accept_new_host_keys_needs_the_directory(tmp_path, dead_port):
    inv = tmp_path / "inventory.ini"
    inv.write_text(quickstart_inventory({"srv": dead_port, "laptop": dead_port})
                   .replace("tunnelspec_known_hosts=known_hosts", "tunnelspec_known_hosts=no-such-dir/known_hosts"))
    res = tunnelspec("deploy", str(inv), "--accept-new-host-keys", timeout=60)
    _no_traceback(res)
    assert res.rc == 2 and "no-such-dir" in res.stderr and "does not exist" in res.stderr, res.stderr


# ---- a closed stdout -------------------------------------------------------------------------------
def _cluster_inventory(tmp_path: Path, port: int) -> Path:
    inv = tmp_path / "inv.ini"
    inv.write_text("[main]\nmain-host\n\n[rpc]\nnode-a rpc_port=50052 rpc_role=draft\n"
                   "node-b rpc_port=50053 rpc_role=target\n\n[all:vars]\n"
                   f"ansible_host=127.0.0.1\nansible_port={port}\nansible_user=root\n"
                   f"tunnelspec_known_hosts={tmp_path}/known_hosts\n"
                   f"llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit=\"{COMMIT}\"\n"
                   "llama_model=/srv/models/target.gguf\nllama_draft_model=/srv/models/draft.gguf\n")
    return inv


def _spawn(*argv, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    return subprocess.Popen([sys.executable, "-m", "tunnelspec", *argv], stdin=subprocess.DEVNULL, env=env,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("argv", [["inventory", "list", "{inv}"], ["deploy", "{inv}", "--list-hosts"],
                                  ["status", "{inv}", "--format", "json"], ["deploy", "{inv}", "--check"],
                                  ["--help"], ["deploy", "--help"], ["--version"]],
                         ids=["inventory_list", "list_hosts", "status_json", "deploy_check", "help", "deploy_help",
                              "version"])
def test_closed_stdout_ends_quietly(argv, tmp_path, dead_port):
    """`tunnelspec … | head -c0`: the reader is gone before the first write. No traceback, no
    'Exception ignored' at exit: exit 141 (docs/ci.md)."""
    inv = _cluster_inventory(tmp_path, dead_port)
    p = _spawn(*[a.format(inv=inv) for a in argv], stdout=subprocess.PIPE)
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert p.returncode == 141, (p.returncode, err)


# ---- Ctrl-C ----------------------------------------------------------------------------------------
class Silent:
    """A listener on 127.0.0.1 that accepts and never says a word (no SSH banner): a connect waits."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def wait_for_connection(self, deadline_s: float = 30) -> None:
        end = time.monotonic() + deadline_s
        while not self.conns:
            assert time.monotonic() < end, "the command never connected"
            time.sleep(0.05)

    def close(self):
        self._stop.set()
        self._t.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def silent():
    s = Silent()
    yield s
    s.close()


@pytest.mark.parametrize("argv", [["deploy", "{inv}"], ["deploy", "{inv}", "--format", "json"],
                                  ["status", "{inv}"], ["hostkeys", "scan", "{inv}"]],
                         ids=["deploy", "deploy_json", "status", "hostkeys_scan"])
def test_ctrl_c_is_exit_130_in_one_line(argv, tmp_path, silent):
    inv = _cluster_inventory(tmp_path, silent.port)
    # Ctrl-C as a terminal's foreground job gets it: SIGINT at its default in the child. A test run
    # started in the background inherits SIGINT ignored (bash ignores it for `&` jobs), and Python then
    # keeps it ignored, as it should for a job started so.
    p = _spawn(*[a.format(inv=inv) for a in argv], stdout=subprocess.PIPE,
               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        silent.wait_for_connection()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in out + err, out + err
    assert p.returncode == 130, (p.returncode, out, err)
    assert err.strip().splitlines()[-1] == "ERROR: interrupted", err
    assert [l for l in err.splitlines() if l.startswith("ERROR")] == ["ERROR: interrupted"], err
    if "json" in argv:
        assert json.loads(out.strip().splitlines()[-1]) == {"event": "error", "exit_code": 130, "msg": "interrupted",
                                                             "schema": 1}


# ---- -i INVENTORY, --list-hosts, --list-tags --------------------------------------------------------
PLAYBOOK = """\
- name: first
  hosts: rpc
  tags: [nodes]
  tasks:
    - name: one
      directory: {path: /nonexistent-a}
      tags: [alpha]
- name: second
  hosts: all
  tasks:
    - name: two
      directory: {path: /nonexistent-b}
      tags: [beta, alpha]
"""


@pytest.fixture
def honeypot():
    h = Honeypot()
    yield h
    h.close()


def test_list_hosts_and_tags_of_a_playbook(tmp_path, honeypot):
    inv = _cluster_inventory(tmp_path, honeypot.port)
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    res = tunnelspec("play", str(inv), str(pb), "--list-hosts", "--list-tags", "--limit", "node-a,main-host")
    assert res.rc == 0, res.stderr
    assert res.stdout == (f"playbook: {pb}\n\n"
                          "  play #1 (rpc): first\tTAGS: [nodes]\n    pattern: rpc\n    hosts (1):\n      node-a\n"
                          "      TASK TAGS: [alpha, nodes]\n\n"
                          "  play #2 (all): second\tTAGS: []\n    pattern: all\n    hosts (2):\n      main-host\n"
                          "      node-a\n      TASK TAGS: [alpha, beta]\n"), res.stdout
    res = tunnelspec("play", "-i", str(inv), str(pb), "--list-tags", "--format", "json")
    assert res.rc == 0, res.stderr
    plays = json.loads(res.stdout)["plays"]
    assert [p["task_tags"] for p in plays] == [["alpha", "nodes"], ["alpha", "beta"]]
    assert all("hosts" not in p for p in plays)
    assert honeypot.drain() == 0, "--list-hosts/--list-tags contacted a host"


@pytest.mark.parametrize("cmd", ["deploy", "teardown", "verify"])
def test_list_hosts_of_builtin_playbooks(cmd, tmp_path, honeypot):
    inv = _cluster_inventory(tmp_path, honeypot.port)
    res = tunnelspec(cmd, str(inv), "--list-hosts", "--limit", "node-b")
    assert res.rc == 0, res.stderr
    assert "playbook: " in res.stdout and "      node-b" in res.stdout
    assert "      node-a" not in res.stdout and "      main-host" not in res.stdout
    tags = tunnelspec(cmd, "-i", str(inv), "--list-tags")
    assert tags.rc == 0 and "TASK TAGS: [" in tags.stdout, tags.stderr
    if cmd == "deploy":
        for t in ("source", "build", "rpc", "tunnel", "server"):
            assert re.search(rf"TASK TAGS: \[[^]]*\b{t}\b", tags.stdout), t
    assert honeypot.drain() == 0


def test_list_hosts_limit_matching_nothing_is_exit_2(tmp_path, honeypot):
    inv = _cluster_inventory(tmp_path, honeypot.port)
    res = tunnelspec("deploy", str(inv), "--list-hosts", "--limit", "no-such-host")
    assert res.rc == 2 and "no-such-host" in res.stderr, res.stderr


@pytest.mark.parametrize("argv", [["inventory", "list"], ["deploy", "--list-hosts"], ["deploy", "--list-tags"],
                                  ["check"], ["client-config"]], ids=lambda a: "_".join(a))
def test_dash_i_is_the_positional_argument(argv, tmp_path, honeypot):
    inv = _cluster_inventory(tmp_path, honeypot.port)
    positional = tunnelspec(argv[0], *argv[1:2] if argv[0] == "inventory" else (), str(inv),
                            *argv[1:] if argv[0] != "inventory" else argv[2:])
    with_i = tunnelspec(*argv, "-i", str(inv))
    assert positional.rc == with_i.rc and positional.stdout == with_i.stdout, (positional, with_i)
    assert positional.rc == 0, positional.stderr


def test_dash_i_with_play(tmp_path, honeypot):
    inv = _cluster_inventory(tmp_path, honeypot.port)
    pb = tmp_path / "pb.yml"
    pb.write_text(PLAYBOOK)
    a = tunnelspec("play", str(inv), str(pb), "--list-hosts")
    b = tunnelspec("play", "-i", str(inv), str(pb), "--list-hosts")
    c = tunnelspec("play", str(pb), "--list-hosts", "--inventory", str(inv))
    assert a.rc == b.rc == c.rc == 0 and a.stdout == b.stdout == c.stdout, (a, b, c)
    both = tunnelspec("play", "-i", str(inv), str(inv), str(pb))
    assert both.rc == 2 and "not both" in both.stderr, both.stderr
    assert honeypot.drain() == 0
