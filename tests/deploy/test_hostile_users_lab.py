"""Hostile service users, in the lab (SECURITY.md, invariants A, B, C, D).

llama.cpp's RPC and GGUF parsers have had memory-safety bugs: code may run as any service account
tunnelspec creates. This harness acts as each of them on every lab host and replaces everything that
account may replace — every file it owns and every entry of every directory it can write under
tunnelspec's paths — in three rounds: by symlinks to a root-only sentinel, then by FIFOs, then by
oversized files. After each round every tunnelspec unit is restarted and status and logs run; after
the last, deploy (with the metrics exporter on), status, verify, logs, bench, rollback and teardown. Throughout, the sentinel keeps its mode, owner and content,
no command hangs (each has a bound), and the sentinel's content is in no output and no bundle.
While bench's baseline runs (metrics on), every socket listening on every host is sshd's or a
registered port (cluster/ports.py) whose guards hold for `nobody`.

A second harness plays main's root: a generation record edited on main (an absolute digest, a mode
4777, a build outside the root) is refused on the node with a clear error, nothing changed there.
The lab's own inventory is deployed again at the end (try/finally): the other modules expect it."""

from __future__ import annotations

import json
import secrets
import tarfile
import threading
import time

import pytest

from support.cli import tunnelspec
from support.labdeploy import converge, failures, inventory_copy, sh
from tunnelspec.cluster import ports
from tunnelspec.cluster.model import Cluster
from tunnelspec.facts import nft
from tunnelspec.inventory import load_inventory

pytestmark = pytest.mark.lab

SENTINEL = "/root/tunnelspec-sentinel"
USERS = {"main": ("tunnelspec-llama", "tunnelspec-front", "tunnelspec-tunnel"),
         "rpc-a": ("tunnelspec-rpc", "tunnelspec-tunnel"), "rpc-b": ("tunnelspec-rpc", "tunnelspec-tunnel")}
# Where tunnelspec's accounts can write, and files they own (the whole tree of the host is searched for
# the latter: `find -xdev -user`); world-writable /tmp-like directories are not tunnelspec's.
SEARCH = ("/run", "/var/lib/tunnelspec", "/var/cache", "/etc/tunnelspec", "/opt/tunnelspec")

# Run as the service user (setpriv): replace each target by a link to the sentinel, a FIFO or a big
# sparse file (the round's kind). Prints what it replaced. Bounded: at most 400 entries.
REPLACE = r"""
import os, sys
kind, sentinel, tops = sys.argv[1], sys.argv[2], sys.argv[3:]
me, done, n = os.getuid(), [], 0
for top in tops:
    for dirpath, dirnames, filenames in os.walk(top):
        writable = os.access(dirpath, os.W_OK | os.X_OK)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not writable or n >= 400:
                continue
            try:
                os.unlink(p)
                if kind == "link":
                    os.symlink(sentinel, p)
                elif kind == "fifo":
                    os.mkfifo(p, 0o666)
                else:
                    with open(p, "wb") as f:
                        f.truncate(3 << 30)
            except OSError as e:
                continue
            n += 1
            done.append(f"{kind} {p} (was uid {st.st_uid})")
print("\n".join(done))
"""


def sentinel_state(lab, host: str) -> str:
    return sh(lab, host, "stat", "-c", "%a %u %g %s", SENTINEL).strip() + " " + \
        sh(lab, host, "sha256sum", SENTINEL).split()[0]


def plant_sentinels(lab) -> tuple[str, dict]:
    token = "SENTINEL-" + secrets.token_hex(16)
    for host in USERS:
        sh(lab, host, "sh", "-c", f'umask 077; printf "%s\\n" "$1" > {SENTINEL}', "sh", token)
    return token, {h: sentinel_state(lab, h) for h in USERS}


def act_as_hostile_users(lab, kind: str) -> list[str]:
    done = []
    for host, users in USERS.items():
        for user in users:
            if sh(lab, host, "sh", "-c", f"id -u {user} 2>/dev/null || :").strip() == "":
                continue
            out = sh(lab, host, "setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "python3", "-c",
                     REPLACE, kind, SENTINEL, *SEARCH, timeout=120)
            done += [f"{host} {user}: {line}" for line in out.splitlines() if line]
    return done


def listening(lab, host: str) -> list[tuple[str, int, int, str]]:
    """(address, port, owner uid, process) of every TCP listener on `host`."""
    out = []
    for line in sh(lab, host, "ss", "-Hltnpe").splitlines():
        parts = line.split()
        addr, _, port = parts[3].rpartition(":")
        uid = next((int(p[4:]) for p in parts if p.startswith("uid:")), 0)
        proc = line.split('(("', 1)[1].split('"', 1)[0] if '(("' in line else "?"
        out.append((addr, int(port), uid, proc))
    return out


def assert_every_listener_registered_and_guarded(lab, cluster) -> list[str]:
    seen = []
    for host in USERS:
        live = nft.parse_live(sh(lab, host, "nft", "-j", "list", "table", "inet", "tunnelspec"))
        nobody = int(sh(lab, host, "id", "-u", "nobody").strip())
        registered = {x.port: x for x in ports.on_host(cluster, host)}
        for addr, port, uid, proc in listening(lab, host):
            seen.append(f"{host} {addr}:{port} {proc} uid {uid}")
            if proc in ("sshd", "sshd-session") and port == 22 and uid == 0:
                continue
            assert port in registered, f"{host}: {addr}:{port} ({proc}, uid {uid}) is not a registered listener"
            assert addr in ("127.0.0.1", "[::1]"), f"{host}: {addr}:{port} ({proc}) listens off loopback"
            assert nft.guard_gaps(live, port, uid, registered[port].open) == [], (host, port, nft.describe(live.rules))
            assert nft.guard_gaps(live, port, nobody, open_port=True), f"{host}: nobody may answer on {port}"
            if not registered[port].open:
                connect = [r for r in live.rules if isinstance(r, nft.PortRule) and r.port == port]
                assert connect and nobody not in connect[0].uids, (host, port, nft.describe(live.rules))
    return seen


def restart_every_unit(lab) -> None:
    for host in USERS:
        sh(lab, host, "sh", "-c", "systemctl list-units --plain --no-legend 'tunnelspec-*' | awk '{print $1}' "
                                  "| xargs -r systemctl restart", timeout=300)


def run(*args, timeout: float):
    """A tunnelspec command, bounded (a hang fails the test through the timeout)."""
    return tunnelspec(*args, timeout=timeout)


def test_hostile_service_users_reach_no_root_file(lab, lab_tools, tmp_path):
    metrics = inventory_copy(lab, tmp_path, "metrics.ini", main_vars={"metrics": "true"})
    cluster = Cluster.from_inventory(load_inventory(metrics))
    token, before = plant_sentinels(lab)
    outputs: list[tuple[str, str]] = []

    def keep(name, r):
        outputs.append((name, r.stdout + r.stderr))
        return r

    try:
        r = keep("deploy (metrics on)", run("deploy", str(metrics), "--format", "json", timeout=1200))
        assert r.rc == 0, failures(r)
        replaced: list[str] = []
        bundle = tmp_path / "bundle.tar.gz"
        for kind in ("link", "fifo", "big"):
            now = act_as_hostile_users(lab, kind)
            # Each service account owns something tunnelspec made: its runtime files, its cache.
            assert any("/run/tunnelspec-llama/" in line for line in now), now
            assert any("/run/tunnelspec-front/" in line for line in now), now
            replaced += now
            restart_every_unit(lab)
            keep(f"status ({kind})", run("status", str(metrics), "--format", "json", timeout=300))
            keep(f"logs ({kind})", run("logs", str(metrics), "-o", str(tmp_path / f"{kind}.tar.gz"), timeout=300))
            for host in USERS:
                assert sentinel_state(lab, host) == before[host], (kind, host, before[host], sentinel_state(lab, host))

        # Serving recovers: the services rewrite what they own at their start, and root followed nothing.
        again = keep("deploy again", run("deploy", str(metrics), "--format", "json", timeout=1200))
        assert again.rc == 0, failures(again)
        keep("status", run("status", str(metrics), "--format", "json", timeout=300))
        v = keep("verify", run("verify", str(metrics), timeout=600))
        assert v.rc == 0, v.stdout[-3000:]
        keep("logs", run("logs", str(metrics), "-o", str(bundle), timeout=300))

        # bench with metrics on: while its baseline listens, every listener of every host is sshd's
        # or registered and guarded for nobody.
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(r=run("bench", str(metrics), "--runs", "1",
                                                                  "--n-predict", "8", timeout=600)))
        t.start()
        deadline, audited = time.monotonic() + 300, []
        while t.is_alive() and time.monotonic() < deadline and not audited:
            if any(port == cluster.main.front.bench_port for _, port, _, _ in listening(lab, "main")):
                audited = assert_every_listener_registered_and_guarded(lab, cluster)
            time.sleep(0.5)
        t.join(timeout=600)
        keep("bench", result["r"])
        assert audited, "bench's baseline never listened: " + result["r"].stdout[-2000:] + result["r"].stderr[-2000:]
        assert any("9466" in line for line in audited), audited      # the exporter was among them

        back = keep("rollback", run("rollback", str(metrics), "--format", "json", timeout=900))
        assert back.rc == 0, failures(back)
        down = keep("teardown", run("teardown", str(metrics), "--format", "json", timeout=900))
        assert down.rc == 0, failures(down)

        for host in USERS:
            assert sentinel_state(lab, host) == before[host], (host, before[host], sentinel_state(lab, host))
        for name, text in outputs:
            assert token not in text, f"the sentinel's content is in the output of {name}"
        for tgz in [bundle, *(tmp_path / f"{k}.tar.gz" for k in ("link", "fifo", "big"))]:
            with tarfile.open(tgz) as tar:
                for m in tar.getmembers():
                    f = tar.extractfile(m) if m.isfile() else None
                    assert f is None or token.encode() not in f.read(), f"the sentinel's content is in {tgz.name}:{m.name}"
        print(f"\nreplaced {len(replaced)} entries as the service users; listeners during bench:\n  "
              + "\n  ".join(audited))
    finally:
        for host in USERS:
            sh(lab, host, "rm", "-f", SENTINEL)
        converge(lab.inventory)


def test_an_edited_generation_record_is_refused_on_the_node(lab, lab_tools):
    """Main's root edits the current generation's record: each edit is refused by the host it would
    make act, naming the field, and nothing changes there."""
    converge(lab.inventory)
    gens = "/var/lib/tunnelspec/generations"
    n = sh(lab, "main", "cat", f"{gens}/current").strip()
    original = sh(lab, "main", "cat", f"{gens}/{n}.json")
    record = json.loads(original)
    node = record["hosts"]["rpc-a"]
    unit = next(p for p in node["files"] if p.endswith("tunnelspec-rpc.service"))
    root = node["root"]
    edits = {
        "absolute digest": lambda r: r["hosts"]["rpc-a"]["files"][unit].update(sha256="/etc/shadow"),
        "mode 4777": lambda r: r["hosts"]["rpc-a"]["files"][unit].update(mode="4777"),
        "build outside the root": lambda r: r["hosts"]["rpc-a"].update(build="/usr/lib"),
    }
    words = {"absolute digest": "sha256", "mode 4777": "mode", "build outside the root": "build"}

    def node_state() -> str:
        return sh(lab, "rpc-a", "sh", "-c", f"readlink {root}/current; sha256sum {unit}; stat -c %a {unit}; "
                                            "systemctl show -p MainPID --value tunnelspec-rpc.service")

    try:
        for what, edit in edits.items():
            bad = json.loads(original)
            edit(bad)
            sh(lab, "main", "sh", "-c", f'cat > {gens}/{n}.json', input=json.dumps(bad))
            before = node_state()
            r = tunnelspec("rollback", str(lab.inventory), "--to", n, "--format", "json", timeout=600)
            assert r.rc != 0, (what, r.stdout[-2000:])
            msgs = " ".join(e.get("msg", "") for e in r.events)
            assert f"generation {n} is refused" in msgs and words[what] in msgs and "nothing was changed" in msgs, \
                (what, msgs[-1500:])
            assert node_state() == before, what
    finally:
        sh(lab, "main", "sh", "-c", f'cat > {gens}/{n}.json', input=original)
        converge(lab.inventory)
