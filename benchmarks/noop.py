"""No-op run benchmark: how long a second, converged run of the generic 8-task playbook takes,
compared with floors measured in the same run (ratios, not absolute times, are what to compare: the
machine is shared and noisy). The floors (benchmarks/raw_floor.py): `floor`, asyncssh with 8 commands
per host; `floor-1`, one lean asyncssh connection and one command per host; `floor-mux`, one command
per host through a persisted OpenSSH ControlMaster (no key exchange in the timed runs). Ratios are to
the true floor, the least of floor-1 and floor-mux.

    python benchmarks/noop.py                      # 1, 4 and 16 hosts, median of 5 runs, table
    python benchmarks/noop.py --hosts 4 --runs 9 --json
    python benchmarks/noop.py --anchors            # also pyinfra / ansible-playbook when installed
    python benchmarks/noop.py --hosts 1,4,16,64,128 --anchors --pyinfra /tmp/pyinfra-venv/bin/pyinfra
                                                   # Ansible up to --ansible-max-hosts (16)

Every host is a real OpenSSH sshd on 127.0.0.1 (tests/support/sshd_harness.py), host keys verified.
Each timing is a whole process (`python -m tunnelspec play …`), interpreter start included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests")]

from support.sshd_harness import SshdCluster  # noqa: E402  (test harness reused on purpose: same real hosts)
from support.cli import make_repo  # noqa: E402

PLAYBOOK = REPO / "tests" / "engine" / "data" / "generic8.yml"
TEMPLATE = REPO / "tests" / "engine" / "data" / "app.conf.j2"
ANCHORS = HERE / "anchors"


# Set in this machine's environment, not a user's: without bytecode caching every run would compile
# all of tunnelspec's modules from source (≈ 50 ms), and unbuffered stdout is a write per line.
_NOT_A_USERS_ENV = ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")


def _env(src: Path = REPO) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_") and k not in _NOT_A_USERS_ENV}
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# CPU seconds of the last timed() process (user + system, its children included): the controller's
# own work, apart from the hosts' sshd and commands, which on this machine share the same cores.
LAST_CPU = [0.0]


def timed(argv: list[str], cwd=None, env=None) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       cwd=cwd or REPO, env=env or _env(), timeout=600)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU[0] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"{argv[:4]}… failed (rc={p.returncode}):\n{p.stdout.decode()[-2000:]}\n"
                         f"{p.stderr.decode()[-2000:]}")
    return took


def quiet_login_shell(host) -> None:
    """sshd runs every command through root's login shell, and Debian's bash sources ~/.bashrc when
    started by sshd. On this machine root's .bashrc runs `pyenv init` (≈ 0.3 s per command), which
    would swamp what we measure (the controller) for every contender alike. SHLVL=1 makes bash skip
    it, as it would on a plain host. Applied with SIGHUP: sshd re-executes itself with the config."""
    cfg = host.dir / "sshd_config"
    cfg.write_text(cfg.read_text() + "SetEnv SHLVL=1\n")
    host.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", host.port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"sshd {host.name} did not come back after SIGHUP")


class Setup:
    """N sshd hosts, a local git repo, an inventory, and the inputs of every contender."""

    def __init__(self, n: int, base: Path):
        self.n = n
        self.base = base
        self.cluster = SshdCluster(base / "hosts", n)
        for h in self.cluster.hosts:
            quiet_login_shell(h)
        self.repo = base / "repo"
        self.commit = make_repo(self.repo)
        shutil.copy(TEMPLATE, self.cluster.base / "app.conf.j2")
        self.inventory = self.cluster.inventory(all_vars={"repo": str(self.repo), "commit": self.commit})
        self.control_dir = base / "cm"  # OpenSSH ControlMaster sockets of the floor-mux contender
        self.control_dir.mkdir(mode=0o700)
        self.floor_spec = base / "floor.json"
        self.floor_spec.write_text(json.dumps({
            "key": str(self.cluster.key), "known_hosts": str(self.cluster.known_hosts),
            "hosts": [{"address": "127.0.0.1", "port": h.port, "user": "root"} for h in self.cluster.hosts]}))

    def tunnelspec_argv(self) -> list[str]:
        return [sys.executable, "-m", "tunnelspec", "play", str(self.inventory), str(PLAYBOOK)]

    def floor_argv(self, *extra: str) -> list[str]:
        return [sys.executable, str(HERE / "raw_floor.py"), str(self.floor_spec), *extra]

    def floors(self) -> dict[str, list[str]]:
        """The floors (benchmarks/raw_floor.py): 8 commands per host, and the two "true" ones, one
        command per host over a lean asyncssh connection or through a persisted OpenSSH master."""
        return {"floor": self.floor_argv(), "floor-1": self.floor_argv("--commands", "1", "--lean"),
                "floor-mux": self.floor_argv("--openssh", str(self.control_dir))}

    def assert_noop(self) -> None:
        p = subprocess.run(self.tunnelspec_argv() + ["--format", "json"], capture_output=True, text=True,
                           env=_env(), timeout=600, cwd=REPO)
        recap = [json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"') and '"recap"' in l]
        hosts = recap[-1]["hosts"] if recap else {}
        if p.returncode != 0 or len(hosts) != self.n or any(r["changed"] or r["ok"] != 8 for r in hosts.values()):
            raise SystemExit(f"second run is not a no-op: rc={p.returncode} {hosts}\n{p.stderr[-2000:]}")

    def stop(self) -> None:
        subprocess.run(self.floor_argv("--openssh", str(self.control_dir), "--stop"), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, env=_env())
        self.cluster.stop()


def anchor_contenders(s: Setup, pyinfra: str | None, ansible: str | None) -> dict:
    """Equivalent deploys for the tools we compare against, when they are installed."""
    out = {}
    if pyinfra:
        inv = s.base / "pyinfra_inventory.py"
        inv.write_text("hosts = " + repr([
            # The host's name is its own: pyinfra merges inventory entries of the same name, so naming
            # every host "127.0.0.1" (as this benchmark once did) ran pyinfra against one host only.
            (h.name, {"ssh_hostname": "127.0.0.1", "ssh_port": h.port, "ssh_user": "root", "ssh_key": str(s.cluster.key),
                            "ssh_known_hosts_file": str(s.cluster.known_hosts), "ssh_strict_host_key_checking": "yes",
                            "root": str(h.root), "name": h.name, "repo": str(s.repo), "commit": s.commit})
            for h in s.cluster.hosts]) + "\n")
        out["pyinfra"] = [pyinfra, "-y", str(inv), str(ANCHORS / "pyinfra_deploy.py")]
    if ansible:
        inv = s.base / "ansible_inventory.ini"
        lines = ["[nodes]"] + [
            f"{h.name} ansible_host=127.0.0.1 ansible_port={h.port} ansible_user=root "
            f"ansible_ssh_private_key_file={s.cluster.key} root={h.root}" for h in s.cluster.hosts]
        lines += ["", "[all:vars]", f"repo={s.repo}", f"commit={s.commit}", "ansible_python_interpreter=/usr/bin/python3",
                  f"ansible_ssh_common_args='-o UserKnownHostsFile={s.cluster.known_hosts} -o StrictHostKeyChecking=yes'"]
        inv.write_text("\n".join(lines) + "\n")
        out["ansible"] = [ansible, "-i", str(inv), str(ANCHORS / "generic8.yml")]
    return out


def anchor_covers(name: str, argv: list[str], n: int) -> None:
    """Run an anchor once and check from its own report that it ran on all n hosts."""
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ANCHORS, env=_env(),
                       timeout=1200)
    out = p.stdout + p.stderr
    if name == "pyinfra":   # its results table: "app directory   <hosts>   ..."
        m = re.search(r"^\s*app directory\s+(\d+)\s", out, re.M)
        hosts = int(m.group(1)) if m else 0
    else:                   # ansible's PLAY RECAP: one line per host
        hosts = len(re.findall(r"^node\d+\s+:\s+ok=", out, re.M))
    if p.returncode != 0 or hosts != n:
        raise SystemExit(f"{name} ran on {hosts} of {n} hosts (rc={p.returncode}):\n{out[-2000:]}")


def bench(n: int, runs: int, anchors: bool, compare: dict[str, Path] | None = None, anchor_runs: int = 3,
          pyinfra: str | None = None, ansible: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"tunnelspec-bench-{n}-") as tmp:
        s = Setup(n, Path(tmp))
        try:
            timed(s.tunnelspec_argv())          # converge
            s.assert_noop()
            contenders = {**s.floors(), "tunnelspec": s.tunnelspec_argv()}
            timed(contenders["floor-mux"])      # the masters up: later runs reuse them
            where: dict[str, tuple] = {}
            for name, src in (compare or {}).items():
                # Another checkout of tunnelspec (e.g. before a change) against the same hosts.
                contenders[name] = s.tunnelspec_argv()
                where[name] = (src, _env(src))
            if anchors:
                for name, argv in anchor_contenders(s, pyinfra, ansible).items():
                    # Converge the anchor's own files (same paths, same content), on every host.
                    anchor_covers(name, argv, n)
                    contenders[name] = argv
                s.assert_noop()                 # the anchors wrote exactly what tunnelspec wants
            times: dict[str, list[float]] = {k: [] for k in contenders}
            cpu: dict[str, list[float]] = {k: [] for k in contenders}
            # Interleaved so that a burst of load from other work on the machine hits every contender.
            for i in range(runs):
                for name, argv in contenders.items():
                    if name in ("pyinfra", "ansible") and i >= anchor_runs:
                        continue  # slow (Ansible ≈ 16 s a run): fewer runs
                    cwd, env = where.get(name, (ANCHORS if name in ("pyinfra", "ansible") else None, None))
                    times[name].append(timed(argv, cwd=cwd, env=env))
                    cpu[name].append(LAST_CPU[0])
            s.assert_noop()
        finally:
            s.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    true_floor = min(med["floor-1"], med["floor-mux"])
    return {"hosts": n, "runs": runs, "median_s": med, "all_s": times, "true_floor_s": true_floor,
            "ratio_to_floor": {k: v / true_floor for k, v in med.items()},
            "controller_cpu_s": {k: statistics.median(v) for k, v in cpu.items()}}


def table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(k for r in rows for k in r["median_s"]))   # Ansible stops at --ansible-max-hosts
    w = max(18, *(len(k) for k in names))

    def cell(r: dict, k: str) -> str:
        if k not in r["median_s"]:
            return "-"
        return f"{r['median_s'][k]:7.3f}s ({r['ratio_to_floor'][k]:4.2f}x)"

    head = f"{'hosts':>5}  " + "  ".join(f"{k:>{w}}" for k in names)
    lines = ["median wall time (ratio to the true floor: the least of floor-1 and floor-mux)", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['hosts']:>5}  " + "  ".join(f"{cell(r, k):>{w}}" for k in names))
    lines.append("controller CPU (s, median; the process and its children, not the hosts' sshd):")
    for r in rows:
        cpu = r["controller_cpu_s"]
        lines.append(f"{r['hosts']:>5}  " + "  ".join(f"{cpu[k]:>{w}.3f}" if k in cpu else f"{'-':>{w}}" for k in names))
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        both = [k for k in names if k in first["median_s"] and k in last["median_s"]]
        lines.append(f"{last['hosts']} hosts vs {first['hosts']}, wall: " + ", ".join(
            f"{k} {last['median_s'][k] / first['median_s'][k]:.2f}x" for k in both))
        lines.append(f"{last['hosts']} hosts vs {first['hosts']}, controller CPU: " + ", ".join(
            f"{k} {last['controller_cpu_s'][k] / first['controller_cpu_s'][k]:.2f}x" for k in both))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="1,4,16", help="comma-separated host counts [1,4,16]")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per contender; the median is reported [5]")
    ap.add_argument("--anchors", action="store_true", help="also time pyinfra / ansible-playbook if installed")
    ap.add_argument("--anchor-runs", type=int, default=3, help="timed runs of each anchor [3]")
    ap.add_argument("--pyinfra", default=shutil.which("pyinfra"), help="pyinfra executable [from PATH]")
    ap.add_argument("--ansible", default=shutil.which("ansible-playbook"), help="ansible-playbook [from PATH]")
    ap.add_argument("--ansible-max-hosts", type=int, default=16,
                    help="Ansible only up to this many hosts (≈ 3 s a host a run here) [16]")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=DIR",
                    help="also time the tunnelspec checkout in DIR (e.g. a worktree before a change)")
    a = ap.parse_args()
    compare = {c.split("=", 1)[0]: Path(c.split("=", 1)[1]).resolve() for c in a.compare}
    rows = [bench(int(n), max(1, a.runs), a.anchors, compare, max(1, a.anchor_runs), a.pyinfra,
                  a.ansible if int(n) <= a.ansible_max_hosts else None)
            for n in a.hosts.split(",") if n]
    if a.json:
        print(json.dumps({"machine": machine(), "results": rows}, indent=2))
    else:
        print(machine()["summary"])
        print(table(rows))


def machine() -> dict:
    import platform

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "load": load,
            "summary": f"python {platform.python_version()}, {os.cpu_count()} cpus, load {load}"}


if __name__ == "__main__":
    main()
