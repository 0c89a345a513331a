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
#
# This file is the launcher; its parts lie next to it (tunnelspec/hostprogs/__init__.py):
# tunnelspec-draftwatch-state (the mode file, the watcher's files, systemd and HELLO queries) and
# tunnelspec-draftwatch-watch (the watchers).
import importlib.machinery
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _part(installed, source, name):
    """A part of this program, installed next to this file as `installed` (`source` in tunnelspec's
    source tree), loaded as module `name` and registered under it for the parts loaded after it."""
    path = os.path.join(HERE, installed)
    if not os.path.exists(path):
        path = os.path.join(HERE, source)  # running from tunnelspec's source (tests)
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    loader.exec_module(mod)
    return mod


# Loaded afresh with each load of this file: the watch part uses the state part loaded just before it.
STATE = _part("tunnelspec-draftwatch-state", "draftwatch_state.py", "tunnelspec_draftwatch_state")
WATCH = _part("tunnelspec-draftwatch-watch", "draftwatch_watch.py", "tunnelspec_draftwatch_watch")

# What the launcher uses, and what tests reach, as this module's own names: a test that replaces one
# here (unit_state, say) changes what the launcher's own functions below call; the parts keep theirs.
SPECULATIVE, DEGRADED, WAITING, PLAIN = STATE.SPECULATIVE, STATE.DEGRADED, STATE.WAITING, STATE.PLAIN
SPLIT_DEGRADED = STATE.SPLIT_DEGRADED
RPC = STATE.RPC
HELLO = STATE.HELLO
STATE_CAP, COUNTERS = STATE.STATE_CAP, STATE.COUNTERS
log, load_config, read_state, write_state = STATE.log, STATE.load_config, STATE.read_state, STATE.write_state
unit_state, Flaps = STATE.unit_state, STATE.Flaps
_iso, _lost_path, _rejoin_flag = STATE._iso, STATE._lost_path, STATE._rejoin_flag
watch, split_watch, draft_lost = WATCH.watch, WATCH.split_watch, WATCH.draft_lost
tunnel_sockets, connect_unix_nofollow, front_busy = WATCH.tunnel_sockets, WATCH.connect_unix_nofollow, WATCH.front_busy


def probe_draft(cfg, timeout):
    """The state part's HELLO probe of the draft node, asking systemd through this module's unit_state."""
    return STATE.probe_draft(cfg, timeout, unit_state)


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
