"""`tunnelspec bench`'s command lines, as pure functions of the deployed one: what the deployed
llama-server runs (speculative with a remote draft, a target split over RPC nodes, or local), and
the baseline's argv, the same model and flags on main alone (or with the deployed placement).

The deployed command line is the llama-server unit's ExecStart= (rendered by components/server/args.py);
nothing here depends on how it was built, so a kind tunnelspec learns to deploy later is benched the
same way as long as its flags are llama-server's own.
"""

from __future__ import annotations

import re
from itertools import pairwise
import shlex

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.components.server.args import UNIT

# Flags (every spelling across builds) that carry the RPC placement, each with a value.
# -sm/-ts/-ngl describe the deployed devices (-ngl: main's CPU share of a split): kept with them
# (same placement), dropped with them (main alone takes every layer its devices can).
PLACEMENT_FLAGS = frozenset(
    {
        "--rpc",
        "-dev",
        "--device",
        "-sm",
        "--split-mode",
        "-ts",
        "--tensor-split",
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
    }
)
# The draft and its settings, and --port (the baseline has its own), each with a value.
DRAFT_FLAGS = frozenset(
    {
        "--spec-type",
        "--spec-draft-model",
        "-md",
        "--model-draft",
        "--spec-draft-device",
        "-devd",
        "--device-draft",
        "--spec-draft-ngl",
        "-ngld",
        "--gpu-layers-draft",
        "--n-gpu-layers-draft",
        "--spec-draft-n-max",
        "--draft-max",
        "--draft-n",
        "--draft",
        "--port",
        "--spec-draft-p-min",
        "--draft-p-min",
    }
)
_MODEL_DRAFT = ("--spec-draft-model", "-md", "--model-draft")
_RPC_DEVICE = re.compile(r"^RPC(\d+|\[.*\])$", re.I)


def parse_exec_start(unit_text: str) -> list[str]:
    """The ExecStart= argv of a unit tunnelspec rendered (systemd_exec quoting: doubled % and $,
    double quotes with backslash escapes, which POSIX shlex reads the same way)."""
    m = re.search(r"^ExecStart=(.+)$", unit_text, re.M)
    if not m:
        raise TaskFailed(f"main: no ExecStart= in /etc/systemd/system/{UNIT}: run `tunnelspec deploy` first")
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(m.group(1))]


def flag_value(argv: list[str], *names: str) -> str | None:
    """The value after the last of these flags (llama-server's last one wins), or None."""
    out = None
    for flag, value in pairwise(argv):
        if flag in names:
            out = value
    return out


def deployed_kind(argv: list[str]) -> str:
    """ "speculative" (a draft model), "split" (target layers over RPC devices, no draft) or "local"."""
    if flag_value(argv, *_MODEL_DRAFT):
        return "speculative"
    return "split" if flag_value(argv, "--rpc") else "local"


def rpc_ports(argv: list[str]) -> list[int]:
    """The ports of the --rpc endpoints (every tunnel listens on 127.0.0.1:<tunnel_port> of main)."""
    out = []
    for ep in (flag_value(argv, "--rpc") or "").split(","):
        host, _, port = ep.strip().rpartition(":")
        if host and port.isdigit():
            out.append(int(port))
    return out


def local_devices(argv: list[str], default: str) -> str:
    """main's own devices for the main-alone baseline: the deployed -dev without its RPC devices
    ("CPU" is what `-dev none` means), else `default` (llama_target_devices) when -dev named only
    RPC devices or none at all."""
    names = [d for d in (flag_value(argv, "-dev", "--device") or "").split(",") if d]
    local = [d for d in names if not _RPC_DEVICE.match(d) and d.upper() not in ("CPU", "NONE")]
    if local:
        return ",".join(local)
    if any(d.upper() == "CPU" for d in names):
        return "none"  # main's share was its CPU: the baseline is the CPU alone
    return default or "none"


def describe_placement(argv: list[str]) -> str:
    """One line: where the target and the draft run, from the argv's own flags."""
    dev = flag_value(argv, "-dev", "--device") or "default devices"
    ts = flag_value(argv, "-ts", "--tensor-split")
    target = ("target on main's CPU (-dev none)" if dev == "none" else f"target on {dev}") + (
        f" (-ts {ts})" if ts else ""
    )
    ngl = flag_value(argv, "-ngl", "--gpu-layers", "--n-gpu-layers")
    if ngl is not None and dev != "none":
        target += f" and main's CPU (-ngl {ngl})"
    draft = flag_value(argv, "--spec-draft-device", "-devd", "--device-draft")
    if flag_value(argv, *_MODEL_DRAFT):
        return f"{target}, draft on {draft or 'default devices'}"
    return f"{target}, no draft"


def baseline_argv(argv: list[str], local: str, port: int, same_placement: bool = False) -> list[str]:
    """The deployed argv without the draft, on `port`. Default: without RPC too (target on main's own
    devices `local`). same_placement: keep --rpc, -dev, -sm, -ts, so target layers stay where they
    are deployed. Its address is loopback: the baseline is never reachable from outside (and speaks
    plain HTTP: TLS is the front's, never llama-server's)."""
    drop = DRAFT_FLAGS if same_placement else DRAFT_FLAGS | PLACEMENT_FLAGS
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        if out and out[-1] == "--host":
            a = LOOPBACK
        out.append(a)
    if same_placement:
        return out + ["--port", str(port)]
    return out + ["-dev", local or "none", "--port", str(port)]


def context_size(argv: list[str]) -> int | None:
    """-c/--ctx-size when the argv sets it (0 means the model's own: None)."""
    v = flag_value(argv, "-c", "--ctx-size")
    return int(v) if v and v.isdigit() and int(v) > 0 else None
