#!/usr/bin/python3
# Part of tunnelspec-draftwatch (installed next to it as tunnelspec-draftwatch-watch; Python 3 standard
# library only): the watcher, `tunnelspec-draftwatch watch` (tunnelspec-draftwatch.service, root). It
# notices the draft node (or a target node the split can be served without) leaving and coming back, and
# restarts llama-server to switch.
import os
import socket
import stat
import subprocess
import sys
import time


# The state part its program (draftwatch.py) loaded and registered just before this file: this part
# is never run on its own, so it loads nothing itself.
STATE = sys.modules["tunnelspec_draftwatch_state"]
SPECULATIVE, DEGRADED, PLAIN, SPLIT_DEGRADED = STATE.SPECULATIVE, STATE.DEGRADED, STATE.PLAIN, STATE.SPLIT_DEGRADED
RPC, HELLO, Flaps = STATE.RPC, STATE.HELLO, STATE.Flaps
log, load_config, read_state, unit_state, probe_draft = (
    STATE.log,
    STATE.load_config,
    STATE.read_state,
    STATE.unit_state,
    STATE.probe_draft,
)
_lost_at, _record_hello, _set_rejoin_flag, _unit_prop, _write_lost = (
    STATE._lost_at,
    STATE._record_hello,
    STATE._set_rejoin_flag,
    STATE._unit_prop,
    STATE._write_lost,
)


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


def _sleep_until_restarted(cfg, limit=60.0):
    """Give the restart a moment to record its new mode (bounded)."""
    before = read_state(cfg).get("at")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if read_state(cfg).get("at") != before:
            return
