#!/usr/bin/python3
# Part of tunnelspec-draftwatch (installed next to it as tunnelspec-draftwatch-state; Python 3 standard
# library only): what the launcher and the watcher share — the serving modes, the mode file llama-server's
# launcher writes and the watcher reads, the watcher's own files next to its rejoin flag, systemd's view of
# a unit, and the HELLO probe of the draft node (through the rpc-wait helper installed next to it).
import importlib.machinery
import importlib.util
import json
import os
import stat
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SPECULATIVE, DEGRADED, WAITING, PLAIN = "speculative", "degraded", "waiting", "plain"
SPLIT_DEGRADED = "split-degraded"


def _rpc_wait():
    """The HELLO probe of the rpc-wait helper installed next to this file (one implementation)."""
    path = os.path.join(HERE, "tunnelspec-rpc-wait")
    if not os.path.exists(path):
        path = os.path.join(HERE, "rpc_wait.py")  # running from tunnelspec's source (tests)
    loader = importlib.machinery.SourceFileLoader("tunnelspec_rpc_wait", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


RPC = _rpc_wait()


def log(msg):
    # One line per event into the unit's journal (stdout of a systemd service).
    print("tunnelspec: " + msg, flush=True)


def load_config(path):
    with open(path) as f:
        return json.load(f)


# The mode file lies in llama-server's runtime directory, which its user controls; the watcher runs
# as root. So it is opened without following a link and without blocking (a FIFO there would hang the
# watcher), and read only as a regular file of one name, owned by the directory's owner, and small
# (SECURITY.md, invariant A).
STATE_CAP = 256 * 1024


def read_state(cfg):
    try:
        fd = os.open(cfg["state"], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        owner = os.stat(os.path.dirname(cfg["state"])).st_uid
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in (0, owner) or st.st_size > STATE_CAP:
            return {}
        data = os.read(fd, STATE_CAP + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


# Cumulative figures the metrics exporter reads (docs/metrics.md): seconds spent in each mode, switches
# into each mode, llama-server starts, and each node's last HELLO. They live as long as the file (/run:
# until main reboots); a file written before they existed counts from zero.
COUNTERS = ("seconds", "entered", "starts", "nodes")


def write_state(cfg, state, prev=None, hello=None, start=False):
    """Write the mode file; with `prev` (the file as read before), carry the counters over and
    account the time since prev's write to prev's mode. `hello`: {node: (version, reason)} probed now;
    `start`: llama-server is started in this mode."""
    if prev is not None:
        now = float(state.get("at") or time.time())
        seconds = dict(prev.get("seconds") or {})
        entered = dict(prev.get("entered") or {})
        if prev.get("mode"):
            at = float(prev.get("at") or now)
            seconds[prev["mode"]] = round(float(seconds.get(prev["mode"], 0)) + max(0.0, now - at), 3)
        if state.get("mode") != prev.get("mode"):
            entered[state["mode"]] = int(entered.get(state["mode"], 0)) + 1
        nodes = dict(prev.get("nodes") or {})
        for node, (version, reason) in (hello or {}).items():
            nodes[node] = {"ok": reason == "", "version": version or "", "at": round(now, 3)}
        state = dict(
            state,
            seconds=seconds,
            entered=entered,
            starts=int(prev.get("starts", 0)) + (1 if start else 0),
            nodes=nodes,
        )
    path = cfg["state"]
    tmp = path + ".tmp"
    # 0644: the exporter (the front's user) reads it; it holds modes, node names and reasons, no secret.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def unit_state(unit):
    """ActiveState/SubState of a unit (readable by any user over systemd's bus)."""
    try:
        res = subprocess.run(
            ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "--", unit],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", ""
    props = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    return props.get("ActiveState", "unknown"), props.get("SubState", "")


def probe_draft(cfg, timeout, tunnel_state=None):
    """(ok, reason): the draft node's RPC server answers HELLO through its tunnel with main's version.
    `tunnel_state`: what asks systemd for the tunnel unit's state (unit_state when None)."""
    d = cfg["draft"]
    version, err = RPC.probe(d["endpoint"], timeout)
    if version is not None:
        if cfg.get("expect") and version != cfg["expect"]:
            HELLO[d["node"]] = (version, "protocol mismatch")
            return False, "protocol mismatch ({} speaks RPC v{}, main v{})".format(d["node"], version, cfg["expect"])
        HELLO[d["node"]] = (version, "")
        return True, f"RPC v{version}"
    HELLO[d["node"]] = (None, err or "no answer")
    active, sub = (tunnel_state or unit_state)(d["tunnel_unit"])
    if active != "active":
        return False, "tunnel down ({} {}/{})".format(d["tunnel_unit"], active, sub)
    return False, f"no RPC answer through the tunnel ({err})"


# This start's HELLO results, {node: (version or None, reason or "")}, for the mode file's figures.
HELLO: dict = {}


def _lost_path(cfg):
    """The watcher's own file (next to its rejoin flag): when it saw the draft go, why, and the grace."""
    return os.path.join(os.path.dirname(cfg["rejoin_flag"]), "lost.json")


def _write_lost(cfg, why, grace, node=None):
    lost = {"at": time.time(), "why": why, "grace": grace, **({"node": node} if node is not None else {})}
    try:
        with open(_lost_path(cfg) + ".tmp", "w") as f:
            json.dump(lost, f, sort_keys=True)
        os.replace(_lost_path(cfg) + ".tmp", _lost_path(cfg))
    except OSError:
        pass  # the launcher then waits its usual grace: slower, never wrong


def _lost_at(cfg):
    try:
        with open(_lost_path(cfg)) as f:
            return float(json.load(f)["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _unit_prop(unit, prop):
    try:
        res = subprocess.run(
            ["systemctl", "show", "-p", prop, "--value", "--", unit], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip()


def _record_hello(cfg):
    """The draft node's last HELLO, for the metrics exporter (its own file, next to the rejoin flag:
    the watcher writes nothing of llama-server's)."""
    path = os.path.join(os.path.dirname(cfg["rejoin_flag"]), "hello.json")
    nodes = {n: {"ok": r == "", "version": v or "", "at": round(time.time(), 3)} for n, (v, r) in HELLO.items()}
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"nodes": nodes}, f, sort_keys=True)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # figures only: never a reason to stop watching


def _rejoin_flag(cfg):
    try:
        with open(cfg["rejoin_flag"]) as f:
            return float(f.read().strip() or 0)
    except (OSError, ValueError, KeyError):
        return 0.0


def _set_rejoin_flag(cfg):
    path = cfg["rejoin_flag"]
    with open(path + ".tmp", "w") as f:
        f.write(f"{time.time():f}\n")
    os.replace(path + ".tmp", path)


class Flaps:
    """How long the node must answer before it is taken back. A loss soon after a rejoin (within the
    wait that rejoin used, and at least 30 s, from llama-server's restart) is a flap: each one doubles
    the next wait (up to 10 minutes). A loss after the node held longer starts again from `base`:
    faults a minute apart are separate faults, each back after `base` seconds of steady answers."""

    def __init__(self, base, now=time.monotonic):
        self.base, self.now, self.count, self.rejoined = base, now, 0, None  # rejoined: (when, wait)

    def wait(self):
        return min(self.base * (2**self.count), 600.0)

    def rejoin(self):
        self.rejoined = (self.now(), self.wait())

    def lost(self):
        if self.rejoined is not None and self.now() - self.rejoined[0] < max(30.0, self.rejoined[1]):
            self.count += 1
        else:
            self.count = 0
        self.rejoined = None


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
