#!/usr/bin/python3
# Installed by tunnelspec on the main host (docs/degraded.md). Python 3 standard library only.
#
#   tunnelspec-draftwatch launch CONFIG   ExecStart= of tunnelspec-llama-server.service (llama-server's user):
#                                         waits for the nodes serving can not do without, picks the mode,
#                                         records it, then execs llama-server with that mode's command line.
#   tunnelspec-draftwatch watch CONFIG    tunnelspec-draftwatch.service (root): notices the draft node
#                                         leaving and coming back, and restarts llama-server to switch.
#   tunnelspec-draftwatch state CONFIG    prints the recorded mode (JSON) for `tunnelspec status`.
#
# Why: llama.cpp's RPC client aborts llama-server on any socket error and never reconnects, so a draft
# node that sleeps or loses its link would take the whole API down with it. The draft only makes
# decoding faster: while a draft-only node is away llama-server serves the target alone (its
# "degraded" command line has no --spec-* and no --rpc endpoint of that node), and the draft comes
# back by itself once the node has answered the RPC HELLO steadily and llama-server is idle. A node
# that holds target layers cannot be skipped: serving waits for it, and says which node and since when —
# unless the deploy found that the remaining devices hold the model without it: then llama-server is
# started with the "without <node>" command line the deploy rendered ("split-degraded": its --rpc
# endpoint dropped, the tensor split over the rest), and the watcher restarts it with the full split
# once the node answers steadily and llama-server is idle.
# The front (HAProxy, tunnelspec-front.service) holds requests while llama-server restarts.
import importlib.machinery
import importlib.util
import json
import os
import socket
import stat
import subprocess
import sys
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


def probe_draft(cfg, timeout):
    """(ok, reason): the draft node's RPC server answers HELLO through its tunnel with main's version."""
    d = cfg["draft"]
    version, err = RPC.probe(d["endpoint"], timeout)
    if version is not None:
        if cfg.get("expect") and version != cfg["expect"]:
            HELLO[d["node"]] = (version, "protocol mismatch")
            return False, "protocol mismatch ({} speaks RPC v{}, main v{})".format(d["node"], version, cfg["expect"])
        HELLO[d["node"]] = (version, "")
        return True, f"RPC v{version}"
    HELLO[d["node"]] = (None, err or "no answer")
    active, sub = unit_state(d["tunnel_unit"])
    if active != "active":
        return False, "tunnel down ({} {}/{})".format(d["tunnel_unit"], active, sub)
    return False, f"no RPC answer through the tunnel ({err})"


# ---- launch ----------------------------------------------------------------------------------------
def wait_required(cfg, prev):
    """Wait for the endpoints serving cannot do without (target-layer nodes). Returns None when all
    answer, (WAITING, node, reason) after the deadline, or (SPLIT_DEGRADED, node, reason) when the one
    node still missing after the short split wait has a "without" command line (the rest holds the
    model). The first time one does not answer, the mode file says so at once (systemd may restart
    this unit with that node's tunnel long before the deadline) and, when that is news, one journal
    line names the node — not during the split wait of a node serving can go on without."""
    w = cfg.get("wait") or {}
    pending = list(zip(w.get("nodes", []), w.get("endpoints", [])))
    if not pending:
        return None
    without = cfg.get("without") or {}
    timeout = float(w.get("timeout", 90))
    start = time.monotonic()
    deadline = start + timeout
    last, told = {}, False
    for _ in range(int(timeout / 0.5) + 2):
        for node, ep in list(pending):
            cap = 2.0 if node in without else 5.0
            version, err = RPC.probe(ep, min(cap, max(0.5, deadline - time.monotonic())))
            if version is None:
                last[node] = err
            elif cfg.get("expect") and version != cfg["expect"]:
                last[node] = "protocol mismatch ({} speaks RPC v{}, main v{})".format(node, version, cfg["expect"])
            else:
                pending.remove((node, ep))
                last.pop(node, None)
            HELLO[node] = (version, last.get(node, ""))
        if not pending or time.monotonic() >= deadline:
            break
        skip = _split_skip(cfg, prev, pending, time.monotonic() - start)
        if skip is not None:
            lost = _split_lost(cfg, prev, skip)
            why = lost[1] if lost is not None and lost[1] else last.get(skip, "no answer")
            return SPLIT_DEGRADED, skip, why
        if not told and (len(pending) > 1 or pending[0][0] not in without):
            told = True
            _waiting(cfg, prev, pending[0][0], last.get(pending[0][0], "no answer"))
        time.sleep(0.5)
    if not pending:
        return None
    node = pending[0][0]
    return WAITING, node, last.get(node, "no answer")


def _split_skip(cfg, prev, pending, waited):
    """The node to serve without now, else None: it is the only one missing, the deploy rendered a
    command line without it, and its short wait is over — `split_wait` seconds at a fresh start,
    none when this start follows split-degraded without it (the watcher decides when it is back) or
    the watcher saw its tunnel's ssh give up on it (a node that stopped answering)."""
    without = cfg.get("without") or {}
    if len(pending) != 1 or pending[0][0] not in without:
        return None
    node = pending[0][0]
    wait = float(cfg.get("split_wait", 5))
    if prev.get("mode") == SPLIT_DEGRADED and prev.get("node") == node and not cfg.get("_rejoin"):
        wait = 0.0
    lost = _split_lost(cfg, prev, node)
    if lost is not None:
        wait = min(wait, lost[0])
    return node if waited >= wait else None


def _split_lost(cfg, prev, node):
    """(grace, why) the watcher gave `node` when it saw it go (its file is newer than the mode file)."""
    try:
        with open(_lost_path(cfg)) as f:
            lost = json.load(f)
        if lost.get("node") == node and float(lost["at"]) > float(prev.get("at", 0)):
            return max(0.0, float(lost.get("grace", 0))), str(lost.get("why", ""))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


# This start's HELLO results, {node: (version or None, reason or "")}, for the mode file's figures.
HELLO: dict = {}


def _waiting(cfg, prev, node, why):
    now = time.time()
    same = prev.get("mode") == WAITING and prev.get("node") == node
    since = prev.get("since") if same else now
    write_state(cfg, {"mode": WAITING, "node": node, "reason": why, "since": since, "at": now}, prev, HELLO)
    if not same:
        log(f"serving waits for {node} (it holds target layers) since {_iso(since)}: {why}")


def choose(cfg, prev):
    """(mode, node, reason) for this start."""
    if not cfg.get("draft"):
        return PLAIN, None, ""
    node = cfg["draft"]["node"]
    if not cfg["modes"].get(DEGRADED):
        return SPECULATIVE, node, ""  # the draft node also holds target layers: waited for above
    # Coming from degraded (a restart in between): no grace, the watcher decides when to come back.
    # Otherwise (boot, deploy, a crash while speculative) give the tunnel a few seconds — unless the
    # watcher has just seen the draft go and said how long it may take to come back (a killed ssh or
    # rpc-server: seconds; a link that stopped answering: not worth waiting for, every held request
    # waits with us). Asked again at each probe: systemd may start this before the watcher wrote it.
    start = time.monotonic()
    grace = 0.0 if prev.get("mode") == DEGRADED and not cfg.get("_rejoin") else float(cfg.get("grace", 10))
    lost = _lost_grace(cfg, prev)
    grace = grace if lost is None else min(grace, lost[0])
    ok, why = probe_draft(cfg, 3.0)
    for _ in range(int(grace) + 2):
        lost = _lost_grace(cfg, prev) or lost
        grace = grace if lost is None else min(grace, lost[0])
        if ok or time.monotonic() >= start + grace or not _tunnel_may_come(cfg):
            break
        time.sleep(min(1.0, max(0.05, start + grace - time.monotonic())))
        ok, why = probe_draft(cfg, min(3.0, max(0.5, start + grace - time.monotonic())))
    if not ok and lost is not None and lost[1].startswith("tunnel down"):
        # The tunnel's ssh gave up on the node: say so, not what the next ssh (still connecting) refused.
        why = lost[1]
    if ok:
        return SPECULATIVE, node, why
    return DEGRADED, node, why


def _lost_grace(cfg, prev):
    """(seconds, why): the grace the watcher gave the draft when it saw it go while this llama-server's
    predecessor was speculative (its flag is newer than the mode file), and why; else None."""
    if prev.get("mode") != SPECULATIVE:
        return None
    try:
        with open(_lost_path(cfg)) as f:
            lost = json.load(f)
        if float(lost["at"]) > float(prev.get("at", 0)):
            return max(0.0, float(lost.get("grace", 0))), str(lost.get("why", ""))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _lost_path(cfg):
    """The watcher's own file (next to its rejoin flag): when it saw the draft go, why, and the grace."""
    return os.path.join(os.path.dirname(cfg["rejoin_flag"]), "lost.json")


def _tunnel_may_come(cfg):
    """Worth waiting a few seconds for: the tunnel's ssh is running or starting (at boot, after a
    deploy). One that failed and waits to be restarted is not coming back within the grace."""
    active, sub = unit_state(cfg["draft"]["tunnel_unit"])
    return active == "active" or (active == "activating" and sub == "start")


def launch(cfg_path):
    cfg = load_config(cfg_path)
    prev = read_state(cfg)
    now = time.time()
    # The watcher asked for this restart to bring the draft back (its own flag file: it cannot write
    # llama-server's runtime directory, nor should it).
    cfg["_rejoin"] = _rejoin_flag(cfg) > float(prev.get("at", 0))
    missing = wait_required(cfg, prev)
    if missing is not None and missing[0] == WAITING:
        _waiting(cfg, read_state(cfg), *missing[1:])
        return 1
    if read_state(cfg).get("mode") == WAITING:
        prev = read_state(cfg)  # the node is back: what comes now is a change, said once
    if missing is not None:
        mode, node, why = missing
        argv = cfg["without"][node]["argv"]
    else:
        mode, node, why = choose(cfg, prev)
        argv = cfg["modes"][mode if mode != PLAIN else SPECULATIVE]
    now = time.time()
    same = prev.get("mode") == mode and (mode != SPLIT_DEGRADED or prev.get("node") == node)
    since = prev.get("since", now) if same else now
    state = {
        "mode": mode,
        "node": node,
        "reason": why if mode in (DEGRADED, SPLIT_DEGRADED) else "",
        "since": since,
        "at": now,
    }
    last = read_state(cfg)  # counters as _waiting may have advanced them during this start
    write_state(cfg, state, last, HELLO, start=True)  # llama-server is exec'd below
    if not same:
        if mode == SPLIT_DEGRADED:
            log(f"mode split-degraded: serving from the other devices, without {node}: {why}")
        elif prev.get("mode") == SPLIT_DEGRADED and mode == PLAIN:
            log("serving the full split again: {} is back".format(prev.get("node")))
        elif mode == SPECULATIVE:
            log("mode speculative: draft on {} ({})".format(",".join(cfg["draft"]["devices"]), node))
        elif mode == DEGRADED:
            log(f"mode degraded: serving the target alone, without the draft on {node}: {why}")
        elif mode == PLAIN:
            log("serving without a draft model")
    sys.stdout.flush()
    os.execv(argv[0], argv)


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ---- watch -----------------------------------------------------------------------------------------
def tunnel_sockets(port):
    """(listening, close_wait) for 127.0.0.1:port from /proc/net/tcp: whether the tunnel's ssh listens
    there (it stops when ssh exits), and how many connections to it the other end has closed
    (CLOSE-WAIT: the node's RPC server went away). Read four times a second: no process is started."""
    want = f"0100007F:{port:04X}"
    listening, close_wait = False, 0
    try:
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) > 3 and parts[1] == want and parts[3] == "0A":
                    listening = True
                elif len(parts) > 3 and parts[2] == want and parts[3] == "08":
                    close_wait += 1
    except OSError:
        return True, 0  # cannot tell: the unit's state, read every second, still can
    return listening, close_wait


def connect_unix_nofollow(s, path):
    """Connect to the unix socket at `path` without following a link: the front's user owns the
    directory of its stats socket, and the watcher runs as root (SECURITY.md, invariant A). The socket
    is opened as a path (O_PATH|O_NOFOLLOW), must be a socket owned by that directory's owner, and is
    reached through its descriptor, so a link swapped in after the check is never followed."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        owner = os.stat(os.path.dirname(path)).st_uid
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid not in (0, owner):
            raise OSError(f"{path} is not the front's socket")
        s.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def front_busy(cfg):
    """True while the front has a request in flight or waiting for llama-server (HAProxy `show stat`);
    None when it cannot tell (then the watcher does not switch back)."""
    f = cfg.get("front") or {}
    path = f.get("stats")
    if not path:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            connect_unix_nofollow(s, path)
            s.sendall(b"show stat\n")
            data = b""
            for _ in range(1000):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()
    if not lines or not lines[0].startswith("# "):
        return None
    head = lines[0][2:].split(",")
    try:
        px, sv, qcur, scur = (head.index(k) for k in ("pxname", "svname", "qcur", "scur"))
    except ValueError:
        return None
    for line in lines[1:]:
        row = line.split(",")
        if len(row) > max(px, sv, qcur, scur) and row[px] == f.get("backend", "llama") and row[sv] == "BACKEND":
            return int(row[qcur] or 0) + int(row[scur] or 0) > 0
    return None


def restart_llama(cfg, why):
    log(why)
    subprocess.run(["systemctl", "restart", "--no-block", cfg["unit"]], timeout=30)


# While speculative the watcher reads /proc four times a second (a link cut is noticed by the tunnel's
# ssh — ServerAliveInterval 1 s x 3 — which exits and takes its listener with it) and systemd's unit
# states once a second; while degraded it sends a HELLO once a second.
FAST_TICK = 0.25
TICKS_PER_SECOND = 4


def draft_lost(d, slow):
    """(why, grace) when the draft cannot be used any more, else (None, None). `grace`: how long the
    launcher should wait for it to come back (a killed process is restarted by systemd within about a
    second; an ssh that gave up on a node that stopped answering is not back soon)."""
    listening, close_wait = tunnel_sockets(int(d["port"]))
    if listening and close_wait:
        return "the RPC connection through the tunnel was closed by the other end", 3.0
    if listening and not slow:
        return None, None
    t_active, t_sub = unit_state(d["tunnel_unit"])
    if listening and t_active == "active":
        return None, None
    why = "tunnel down ({} {}/{})".format(d["tunnel_unit"], t_active, t_sub)
    failed = t_active == "failed" or (t_active == "activating" and t_sub == "auto-restart")
    if failed or t_active == "inactive":
        result = _unit_prop(d["tunnel_unit"], "Result")
        if result == "signal":
            return why + ": its ssh was killed", 3.0
        if result != "success":
            return why, 0.0  # ssh gave up by itself (no answer from the node, refused): not back soon
    # Being restarted (a deploy), or already started again: it listens within a second.
    return why, 3.0


def _replace_llama(cfg, state, why, grace, message, node=None):
    """A node llama-server computes on is gone: tell the launcher how long to wait for it (`grace`),
    and replace llama-server now — killed, not stopped: it cannot compute, and a request it holds must
    come back to the front as a dropped connection (which the front retries) rather than as an error
    answer. It would abort at its next RPC call anyway (llama.cpp's RPC client never reconnects).
    False when there was nothing to replace."""
    active, _ = unit_state(cfg["unit"])
    if active not in ("active", "activating"):
        return False  # stopped on purpose (a deploy, a teardown): not ours to start, nothing to tell
    _write_lost(cfg, why, grace, node)
    if read_state(cfg).get("at") != state.get("at"):
        return False  # llama-server was started again meanwhile (it aborted, systemd restarted it)
    log(message)
    subprocess.run(
        ["systemctl", "kill", "--kill-whom=main", "--signal=SIGKILL", "--", cfg["unit"]],
        capture_output=True,
        timeout=30,
    )
    subprocess.run(["systemctl", "restart", "--no-block", "--", cfg["unit"]], timeout=30)
    return True


def lose_draft(cfg, d, state, why, grace):
    """The draft is gone: llama-server restarts with the draft if it is back within `grace`, else
    serves the target alone."""
    return _replace_llama(
        cfg,
        state,
        why,
        grace,
        "draft on {} lost: {}; restarting llama-server {}".format(
            d["node"],
            why,
            f"with the draft if it is back within {grace:g}s, else the target alone"
            if grace
            else "to serve the target alone",
        ),
    )


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


def watch(cfg_path):
    cfg = load_config(cfg_path)
    if not cfg.get("draft") and cfg.get("without"):
        return split_watch(cfg_path)
    if not cfg.get("draft") or not cfg["modes"].get(DEGRADED):
        log("no draft-only node: nothing to watch")
        return 0
    d = cfg["draft"]
    rejoin_after = float(cfg.get("rejoin_after", 20))
    steady_since = None
    flaps = Flaps(rejoin_after)  # a link that flaps waits longer before the next rejoin
    log(
        "watching {} (draft on {}); switching back after {:g}s of steady answers".format(
            d["node"], d["endpoint"], rejoin_after
        )
    )
    handled = None  # the llama-server start (its mode file's `at`) whose loss was dealt with
    for tick in range(1, 10**12):  # until systemd stops it
        if tick % TICKS_PER_SECOND:
            # Between the once-a-second rounds only the speculative mode's /proc checks run.
            state = read_state(cfg)
            if state.get("mode") == SPECULATIVE and state.get("at") != handled:
                why, grace = draft_lost(d, False)
                if why:
                    handled = state.get("at")
                    if lose_draft(cfg, d, state, why, grace):
                        flaps.lost()
                        _sleep_until_restarted(cfg)
            time.sleep(FAST_TICK)
            continue
        cfg = load_config(cfg_path)  # a deploy may have changed it; same unit, same node names
        state = read_state(cfg)
        active, sub = unit_state(cfg["unit"])
        mode = state.get("mode")
        if mode == SPECULATIVE:
            steady_since = None
            # Also while llama-server is not active: it aborted on the lost draft and systemd starts it
            # again in a second — the launcher should know why (and a restart now saves that second).
            why, grace = draft_lost(d, True) if state.get("at") != handled else (None, None)
            if why:
                handled = state.get("at")
                if lose_draft(cfg, d, state, why, grace):
                    flaps.lost()
                    _sleep_until_restarted(cfg)
            elif sub == "auto-restart" and _lost_at(cfg) < float(state.get("at", 0)):
                # llama-server aborted while its tunnel is up: most likely the node's rpc-server went
                # away (an RPC error aborts llama.cpp's client before any CLOSE-WAIT can be seen). The
                # launcher waits 3 s for it rather than its fresh start's 10.
                _write_lost(cfg, "llama-server ended while speculative (the node's RPC server?)", 3.0)
                log(
                    "llama-server ended while drafting on {} (its RPC server gone?); the draft gets 3s to "
                    "answer at its next start".format(d["node"])
                )
        elif active != "active":
            steady_since = None
        elif mode == DEGRADED:
            ok, why = probe_draft(cfg, 2.0)
            _record_hello(cfg)
            if not ok:
                if steady_since is not None:
                    log("{} stopped answering again ({})".format(d["node"], why))
                steady_since = None
            else:
                if steady_since is None:
                    steady_since = time.monotonic()
                    wait = flaps.wait()
                    log(
                        "{} answers again ({}); the draft comes back after {:g}s of steady answers, when idle".format(
                            d["node"], why, wait
                        )
                    )
                wait = flaps.wait()
                if time.monotonic() - steady_since >= wait and front_busy(cfg) is False:
                    _set_rejoin_flag(cfg)
                    restart_llama(
                        cfg,
                        "{} steady for {:g}s and llama-server idle: restarting it with the draft on {}".format(
                            d["node"], wait, ",".join(d["devices"])
                        ),
                    )
                    steady_since = None
                    _sleep_until_restarted(cfg)
                    flaps.rejoin()
        time.sleep(FAST_TICK)
    return 0


def lose_node(cfg, node, state, why, grace):
    """A target node the split can be served without is gone (full split): llama-server restarts
    without it unless it answers within `grace` (none when the tunnel's ssh gave up on the node)."""
    return _replace_llama(
        cfg,
        state,
        why,
        grace,
        f"{node} lost: {why}; restarting llama-server without it unless it answers within {grace:g}s",
        node,
    )


def _closed_on_purpose(unit):
    """The tunnel was stopped (`tunnel close`, a teardown), not lost: inactive with Result=success,
    still so a second later (a restart passes through inactive)."""
    for i in range(2):
        active, _ = unit_state(unit)
        if active != "inactive" or _unit_prop(unit, "Result") != "success":
            return False
        if i == 0:
            time.sleep(1.0)
    return True


def split_watch(cfg_path):
    """A split with no draft whose remaining devices hold the model without some target node
    (`without` in the modes file). Full split (plain): the /proc checks of each such node's tunnel,
    four times a second, and its unit once a second — a loss kills llama-server, the launcher starts
    it without the node. Split-degraded: HELLO to the missing node through its tunnel once a second;
    once it answered `rejoin_after` seconds in a row and the front is idle, restart llama-server (the
    launcher finds the node and starts the full split). A tunnel closed on purpose stops llama-server,
    as PartOf= does for the other target nodes."""
    cfg = load_config(cfg_path)
    rejoin_after = float(cfg.get("rejoin_after", 20))
    steady_since, handled, flaps = None, None, Flaps(rejoin_after)
    log(
        "watching {} (the split is served without any one of them while it is away); back to the full "
        "split after {:g}s of steady answers".format(", ".join(sorted(cfg["without"])), rejoin_after)
    )
    for tick in range(1, 10**12):  # until systemd stops it
        slow = tick % TICKS_PER_SECOND == 0
        if slow:
            cfg = load_config(cfg_path)  # a deploy may have changed it
        without = cfg.get("without") or {}
        state = read_state(cfg)
        mode = state.get("mode")
        if mode == PLAIN and state.get("at") != handled:
            steady_since = None
            for node, w in sorted(without.items()):
                why, grace = draft_lost(w, slow)
                if not why:
                    continue
                handled = state.get("at")
                if _closed_on_purpose(w["tunnel_unit"]):
                    log("{} closed: stopping llama-server (it holds target layers there)".format(w["tunnel_unit"]))
                    subprocess.run(["systemctl", "stop", "--no-block", "--", cfg["unit"]], timeout=30)
                elif lose_node(cfg, node, state, why, min(grace, float(cfg.get("split_wait", 5)))):
                    flaps.lost()
                    _sleep_until_restarted(cfg)
                break
        elif mode == SPLIT_DEGRADED and slow:
            node = state.get("node")
            w = without.get(node)
            active, _ = unit_state(cfg["unit"])
            if w is None or active != "active":
                steady_since = None
            else:
                version, err = RPC.probe(w["endpoint"], 2.0)
                if version is not None and cfg.get("expect") and version != cfg["expect"]:
                    err = "protocol mismatch ({} speaks RPC v{}, main v{})".format(node, version, cfg["expect"])
                    version = None
                HELLO[node] = (version, "" if version is not None else (err or "no answer"))
                _record_hello(cfg)
                if version is None:
                    if steady_since is not None:
                        log(f"{node} stopped answering again ({err})")
                    steady_since = None
                else:
                    wait = flaps.wait()
                    if steady_since is None:
                        steady_since = time.monotonic()
                        log(
                            f"{node} answers again (RPC v{version}); the full split comes back after {wait:g}s of steady answers, "
                            "when idle"
                        )
                    if time.monotonic() - steady_since >= wait and front_busy(cfg) is False:
                        _set_rejoin_flag(cfg)
                        restart_llama(
                            cfg, f"{node} steady for {wait:g}s and llama-server idle: restarting it with the full split"
                        )
                        steady_since = None
                        _sleep_until_restarted(cfg)
                        flaps.rejoin()
        time.sleep(FAST_TICK)
    return 0


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


def _sleep_until_restarted(cfg, limit=60.0):
    """Give the restart a moment to record its new mode (bounded)."""
    before = read_state(cfg).get("at")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if read_state(cfg).get("at") != before:
            return


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("launch", "watch", "state"):
        print("usage: tunnelspec-draftwatch launch|watch|state CONFIG", file=sys.stderr)
        return 2
    cmd, cfg_path = argv
    if cmd == "launch":
        return launch(cfg_path)
    if cmd == "watch":
        return watch(cfg_path)
    print(json.dumps(read_state(load_config(cfg_path)), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
