"""The README's "Quickstart on real hardware" runs in the lab as written, step by step.

Each step is the fenced block after its `<!-- doctest: quickstart step N -->` marker in README.md,
read from the Markdown itself (tests/support/docblocks.py): rename a subcommand, break the inventory
or drop a step's promise (`# exit 3`, `changed=0`) and this test fails.

The controller starts as a newcomer's does: an empty directory (the test's tmp_path), an empty HOME
(no ~/.ssh, no ~/.cache/tunnelspec), no known_hosts, no inventory written by the lab. Only these are
substituted, each declared below: the addresses (the doc's server and laptop become the lab's main
and its draft node rpc-a, found by address), the file locations (models, the llama.cpp repository:
the lab's offline fixtures), the commit placeholder (the lab's pinned commit), and the hardware the
lab's CPU-only hosts do not have (CUDA → CPU). The controller's SSH key is the lab's, given the way
docs/ci.md gives one (TUNNELSPEC_SSH_KEY), since `lab up` already installed it where ssh-copy-id
would (step 1). Host keys are pinned as step 3 says: scanned, each fingerprint compared with the
host's own `ssh-keygen -lf`, the printed lines copied into known_hosts.

Steps that cannot run here are named in NOT_RUN with the reason. The hosts start with nothing of
tunnelspec deployed, as a newcomer's: the lab's own deployment is torn down first (its builds stay).
The quickstart ends with a teardown; the lab's own inventory is deployed again afterwards (the other
lab modules expect it deployed), also when a step failed.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.docblocks import blocks, commands
from support.labdeploy import converge

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
STEPS = [f"quickstart step {n}" for n in range(1, 7)]
COMMAND_TIMEOUT = 3600  # a deploy that builds (the doc's build number differs from the lab's: a new build)

# What the lab cannot do as the doc says, by (step, program): the reason.
NOT_RUN = {
    ("quickstart step 1", "ssh-copy-id"): "the lab installed the controller's key in root's authorized_keys at "
                                          "`lab up` (tunnelspec/lab); its private half is given as TUNNELSPEC_SSH_KEY",
    ("quickstart step 5", "ssh"): "a forward runs until interrupted; the curl of the same step runs on the server",
}

# The doc's hardware, which the lab's CPU-only hosts do not have: replaced as written here.
HARDWARE = {
    "llama_backend=cuda": "llama_backend=cpu",
    "llama_target_devices=CUDA0": "llama_target_devices=none",
    "rpc_devices=CUDA0": "rpc_devices=CPU",
}


def lab_values(lab) -> dict[str, str]:
    text = Path(lab.inventory).read_text()
    return dict(re.findall(r"^(llama_repo|llama_commit|llama_model|llama_draft_model)=(\S+)$", text, re.M))


def substitutions(lab) -> dict[str, str]:
    """Doc text → lab text: addresses, file locations, the commit placeholder, then the hardware."""
    ips, fx = lab.hosts, lab_values(lab)
    return {
        "192.168.1.20": ips["main"],       # srv: the server runs llama-server
        "192.168.1.30": ips["rpc-a"],      # laptop: the lab's draft node
        "https://github.com/ggml-org/llama.cpp": fx["llama_repo"],
        "/srv/models/Qwen3-32B-Q4_K_M.gguf": fx["llama_model"],
        "/srv/models/Qwen3-0.6B-Q8_0.gguf": fx["llama_draft_model"],
        '"<full 40-hex SHA you reviewed>"': f'"{fx["llama_commit"]}"',
        **HARDWARE,
    }


def substituted(text: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        assert old in text, f"the substitution {old!r} no longer matches the doc: update the table"
        text = text.replace(old, new)
    return text


class Controller:
    """A newcomer's controller: the working directory, HOME, the key, and what ran."""

    def __init__(self, root: Path, key: str):
        self.cwd = root / "work"
        self.home = root / "home"
        self.cwd.mkdir()
        self.home.mkdir()
        self.env = {"HOME": str(self.home), "TUNNELSPEC_SSH_KEY": key, "NO_COLOR": "1"}

    def run(self, argv: list[str], step: str):
        assert argv[0] == "tunnelspec", f"{step}: not a tunnelspec command: {argv}"
        t0 = time.monotonic()
        r = tunnelspec(*argv[1:], env=self.env, cwd=str(self.cwd), timeout=COMMAND_TIMEOUT)
        print(f"[{step}] $ {' '.join(argv)} -> exit {r.rc} ({time.monotonic() - t0:.0f} s)")
        return r


def tail(r, n: int = 4000) -> str:
    return f"exit {r.rc}\n--- stdout ---\n{r.stdout[-n:]}\n--- stderr ---\n{r.stderr[-2000:]}"


def recap_changed(stdout: str) -> dict[str, int]:
    recap = stdout[stdout.rindex("PLAY RECAP"):]
    return {h: int(c) for h, c in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", recap, re.M)}


def expected_exit(comment: str) -> int:
    m = re.search(r"\bexit (\d+)\b", comment)
    return int(m.group(1)) if m else 0


def host_fingerprints(lab, host: str) -> set[str]:
    out = lab.exec(host, ["sh", "-c", "for f in /etc/ssh/ssh_host_*_key.pub; do ssh-keygen -lf \"$f\"; done"],
                   timeout=60).stdout
    return {line.split()[1] for line in out.splitlines() if line.strip()}


def pin_host_keys(lab, ctl: Controller, scan: list[str], step: str, known_hosts: str, addresses: set[str]) -> None:
    """`tunnelspec hostkeys scan`, each fingerprint compared with the host's own (what the doc tells a
    user to do on each machine's console), then the printed lines copied into known_hosts."""
    by_address = {ip: name for name, ip in lab.hosts.items()}
    r = ctl.run(scan, step)
    assert r.rc == 0, tail(r)
    pinned = []
    for m in re.finditer(r"^(\S+) \((\S+):22\)\n(.*?)(?=^\S|\Z)", r.stdout, re.M | re.S):
        host, address, body = m.groups()
        lines = re.findall(r"# after verifying (SHA256:\S+) out of band: (.+)$", body, re.M)
        assert lines, f"no key printed for {host}:\n{r.stdout}"
        own = host_fingerprints(lab, by_address[address])
        for fp, line in lines:
            assert fp in own, f"{host}: scanned {fp}, the host's own keys are {own}"
            pinned.append(line)
    assert {l.split()[0] for l in pinned} == addresses
    (ctl.cwd / known_hosts).write_text("\n".join(pinned) + "\n")


def test_the_quickstart_runs_as_written(lab, tmp_path):
    doc = blocks(REPO / "README.md")
    assert sorted(n for n in doc if n.startswith("quickstart")) == STEPS
    table = substitutions(lab)
    ctl = Controller(tmp_path, Path(lab.key_file).read_text())
    skipped: list[str] = []
    not_run: set[tuple[str, str]] = set()
    inventory_written = torn_down = False
    # The hosts as a newcomer's are: nothing of tunnelspec deployed (the lab's builds stay, a cache).
    # The lab's deployment under its own node names would otherwise keep running beside the
    # quickstart's (its tunnel units on main hold the same local ports).
    r = tunnelspec("teardown", str(lab.inventory), "--format", "json", timeout=600)
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-2000:]
    try:
        # Step 1: SSH in with a key. The lab did it; what the doc asks for is checked against the inventory.
        step1 = commands(doc["quickstart step 1"])
        assert [argv[0] for argv, _ in step1] == ["ssh-copy-id", "ssh-copy-id"]
        skipped += [f"step 1: {' '.join(argv)}: {NOT_RUN[('quickstart step 1', argv[0])]}" for argv, _ in step1]
        not_run.add(("quickstart step 1", "ssh-copy-id"))

        # Step 2: the inventory, as written but for the declared substitutions.
        step2 = doc["quickstart step 2"]
        assert step2.lang == "ini"
        for argv, _ in step1:
            assert f"ansible_host={argv[1].split('@', 1)[1]}" in step2.text, "step 1 and 2 name other hosts"
        (ctl.cwd / "inventory.ini").write_text(substituted(step2.text, table))
        inventory_written = True
        known_hosts = re.search(r"^tunnelspec_known_hosts=(\S+)$", step2.text, re.M).group(1)
        assert not (ctl.cwd / known_hosts).exists()

        # Step 3: scan, compare each fingerprint with the host's own, copy the printed lines.
        (scan,) = commands(doc["quickstart step 3"])
        pin_host_keys(lab, ctl, scan[0], "step 3", known_hosts, {table["192.168.1.20"], table["192.168.1.30"]})

        # Step 4: plan, deploy, deploy again — each command's comment says what it must give.
        for argv, comment in commands(doc["quickstart step 4"]):
            r = ctl.run(argv, "step 4")
            assert r.rc == expected_exit(comment), f"{' '.join(argv)}  # {comment}\n{tail(r)}"
            if "changed=0" in comment:
                changed = recap_changed(r.stdout)
                assert set(changed) == {"srv", "laptop"} and not any(changed.values()), tail(r)

        # Step 5: use it, on the server.
        for argv, _ in commands(doc["quickstart step 5"]):
            if ("quickstart step 5", argv[0]) in NOT_RUN:
                skipped.append(f"step 5: {' '.join(argv)}: {NOT_RUN[('quickstart step 5', argv[0])]}")
                not_run.add(("quickstart step 5", argv[0]))
                continue
            assert argv[0] == "curl", argv
            out = lab.exec("main", argv, timeout=120)
            assert out.returncode == 0, out.stderr
            body = json.loads(out.stdout)
            assert body.get("content") and body["timings"]["predicted_n"] > 0, body

        # Step 6: the logs bundle, then teardown.
        for argv, _ in commands(doc["quickstart step 6"]):
            r = ctl.run(argv, "step 6")
            assert r.rc == 0, tail(r)
            if "-o" in argv:
                assert (ctl.cwd / argv[argv.index("-o") + 1]).stat().st_size > 0
        torn_down = True
        for host, unit in (("main", "tunnelspec-llama-server.service"), ("main", "tunnelspec-tunnel-laptop.service"),
                           ("rpc-a", "tunnelspec-rpc.service")):
            gone = lab.exec(host, ["test", "!", "-e", f"/etc/systemd/system/{unit}"], timeout=60)
            assert gone.returncode == 0, f"{unit} still on {host} after teardown"
        print("not run in the lab:\n  " + "\n  ".join(skipped))
        assert not_run == set(NOT_RUN), "a declared exception no longer matches the doc"
    finally:
        if inventory_written and not torn_down:
            ctl.run(["tunnelspec", "teardown", "inventory.ini"], "cleanup")
        converge(lab.inventory)


# ---- docs/first-cluster.md, topology 2: seed 003's split, logged in as a sudoer ------------------
# Topology 1 is the quickstart's inventory (the test above runs it). Topology 2 logs in as `ops`, a
# sudoer, as the doc says; its hosts are given that login the way a newcomer's are (a user with the
# controller's key and passwordless sudo), and it is then deployed as written but for the addresses
# and the file locations. The model: an 11-block tiny llama (12 layer slots: main's CPU 4, rpc-a 2,
# rpc-b 6, exactly the asked 2:1:3), in place of the 70B file.
OPS_SUDOERS = "/etc/sudoers.d/tunnelspec-doc-ops"
SPLIT_BLOCKS = 11


def add_sudoer(lab, host: str, pub: str) -> None:
    script = ("id ops >/dev/null 2>&1 || useradd -m -s /bin/bash ops; "
              "install -d -m 700 -o ops -g ops ~ops/.ssh; "
              "printf '%s\\n' \"$1\" > ~ops/.ssh/authorized_keys; chown ops:ops ~ops/.ssh/authorized_keys; "
              f"printf 'ops ALL=(ALL) NOPASSWD: ALL\\n' > {OPS_SUDOERS}; chmod 440 {OPS_SUDOERS}")
    r = lab.exec(host, ["sh", "-c", script, "sh", pub.strip()], timeout=60)
    assert r.returncode == 0, r.stderr


def remove_sudoer(lab, host: str) -> None:
    lab.exec(host, ["sh", "-c", f"rm -f {OPS_SUDOERS}; pkill -u ops 2>/dev/null; userdel -r ops 2>/dev/null; :"],
             timeout=60)


def test_first_cluster_topology_2_runs_as_written(lab, tmp_path):
    from tunnelspec.lab import gguf_tiny

    doc = blocks(REPO / "docs" / "first-cluster.md")
    block = doc["first-cluster topology 2"]
    assert block.lang == "ini"
    assert "ansible_user=ops" in block.text and "ansible_become=true" in block.text
    model = tmp_path / "tiny-llama-11-blocks.gguf"
    gguf_tiny.write_tiny_llama(model, blocks=SPLIT_BLOCKS)
    ips, fx = lab.hosts, lab_values(lab)
    table = {"10.0.0.10": ips["main"], "10.0.0.11": ips["rpc-a"], "10.0.0.12": ips["rpc-b"],
             "https://github.com/ggml-org/llama.cpp": fx["llama_repo"],
             "/srv/models/Llama-3.3-70B-Q4_K_M.gguf": str(model),
             '"<full 40-hex SHA you reviewed>"': f'"{fx["llama_commit"]}"'}
    ctl = Controller(tmp_path, Path(lab.key_file).read_text())
    pub = Path(str(lab.key_file) + ".pub").read_text()
    try:
        for host in ("main", "rpc-a", "rpc-b"):
            add_sudoer(lab, host, pub)
        (ctl.cwd / "inventory.ini").write_text(substituted(block.text, table))
        known_hosts = re.search(r"^tunnelspec_known_hosts=(\S+)$", block.text, re.M).group(1)
        r = ctl.run(["tunnelspec", "check", "inventory.ini"], "topology 2")
        assert r.rc == 0 and "-sm layer" in r.stdout and "-ts 1,3" in r.stdout, tail(r)
        pin_host_keys(lab, ctl, ["tunnelspec", "hostkeys", "scan", "inventory.ini"], "topology 2", known_hosts,
                      {ips["main"], ips["rpc-a"], ips["rpc-b"]})
        r = ctl.run(["tunnelspec", "deploy", "inventory.ini", "--format", "json"], "topology 2")
        assert r.rc == 0, tail(r)
        ev = next(e for e in r.results() if e.get("module") == "llama_verify")
        assert "split, no draft" in ev["msg"] and "layers CPU 4, RPC0 2, RPC1 6 of 12 as asked" in ev["msg"], ev
        again = ctl.run(["tunnelspec", "deploy", "inventory.ini"], "topology 2")
        assert again.rc == 0 and not any(recap_changed(again.stdout).values()), tail(again)
    finally:
        for host in ("main", "rpc-a", "rpc-b"):
            remove_sudoer(lab, host)
        converge(lab.inventory)
