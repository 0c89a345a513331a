"""Seed 000 (examples/seed000-mtp-laptop-gpu.ini) made runnable in the lab with only what the lab
cannot have swapped: the hosts (names, addresses, their hardware: a Mac's Metal GPU and a laptop's
CUDA GPU become the lab's CPU hosts), the models (the 27B files become the tiny MTP target and its
MTP draft, tests/support/gguf_mtp.py) and [all:vars] (the lab's login, known_hosts and its
offline source: the fixture repository at b11434 instead of GitHub). Every other line — the
speculative type, the draft's n-max, the draft's role, the section layout, the comments — is kept
as written, and `changed_lines` says which lines differ and why."""

from __future__ import annotations

import difflib
import re

# A host's hardware, which the lab's hosts do not share (CPU only): dropped with the host.
HARDWARE_VARS = ("llama_backend", "llama_target_devices", "rpc_devices")
MODEL_VARS = ("llama_model", "llama_draft_model")


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        m = re.match(r"^\[([^\]]+)\]\s*$", line)
        if m:
            current = m.group(1)
            out.setdefault(current, [])
        elif current and line.strip() and not line.lstrip().startswith(("#", ";")):
            out[current].append(line)
    return out


def _vars(line: str) -> tuple[str, dict[str, str]]:
    name, *rest = line.split()
    return name, dict(kv.split("=", 1) for kv in rest)


def _host_map(example: str, lab: str) -> dict[str, str]:
    """Example host → lab host: the [main] host to the lab's main, each [rpc] host to the lab node of
    the same rpc_role (in order)."""
    ex, lb = _sections(example), _sections(lab)
    out = {_vars(ex["main"][0])[0]: _vars(lb["main"][0])[0]}
    free = [_vars(l) for l in lb["rpc"]]
    for line in ex.get("rpc", []):
        name, v = _vars(line)
        pick = next((n for n, lv in free if lv.get("rpc_role") == v.get("rpc_role", "target")), None)
        if pick is None:
            raise ValueError(f"the lab has no free rpc node with rpc_role={v.get('rpc_role')} for {name}")
        free = [(n, lv) for n, lv in free if n != pick]
        out[name] = pick
    return out


def lab_variant(example: str, lab: str, target: str, draft: str) -> str:
    """The example's text with the lab's hosts, models `target`/`draft` and the lab's [all:vars]."""
    hosts = _host_map(example, lab)
    lab_lines = {(_vars(l)[0]): l for sec in ("main", "rpc") for l in _sections(lab).get(sec, [])}
    out: list[str] = []
    section = ""
    for line in example.splitlines():
        m = re.match(r"^\[([^\]]+)\]\s*$", line)
        if m:
            section = m.group(1)
            if section == "all:vars":
                break
            out.append(line)
            continue
        stripped = line.strip()
        if section in ("main", "rpc") and stripped and not stripped.startswith(("#", ";")):
            name, v = _vars(line)
            lab_name, lab_v = _vars(lab_lines[hosts[name]])
            keep = {k: x for k, x in v.items() if k != "ansible_host" and k not in HARDWARE_VARS}
            merged = {**lab_v, **keep}
            out.append(" ".join([lab_name, *(f"{k}={x}" for k, x in merged.items())]))
            continue
        key = stripped.split("=", 1)[0]
        if key in MODEL_VARS:
            out.append(f"{key}={target if key == 'llama_model' else draft}")
            continue
        out.append(line)
    lab_all = lab[lab.index("[all:vars]"):].splitlines()
    out += [l for l in lab_all if l.split("=", 1)[0] not in MODEL_VARS]
    return "\n".join(out) + "\n"


def changed_lines(example: str, variant: str) -> list[tuple[str, str, str]]:
    """(why, example line, variant line) for every line that differs; why is "host", "model" or
    "all:vars", else "other" (which must not happen)."""
    a, b = example.splitlines(), variant.splitlines()
    ex_hosts = {_vars(l)[0] for sec in ("main", "rpc") for l in _sections(example).get(sec, [])}
    all_start_b = b.index("[all:vars]") if "[all:vars]" in b else len(b)
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        olds, news = a[i1:i2], b[j1:j2]
        for k in range(max(len(olds), len(news))):
            old = olds[k] if k < len(olds) else ""
            new = news[k] if k < len(news) else ""
            key = (old or new).strip().split("=", 1)[0]
            if (j1 + k) >= all_start_b or (i1 + k) >= (a.index("[all:vars]") if "[all:vars]" in a else len(a)):
                why = "all:vars"
            elif key in MODEL_VARS:
                why = "model"
            elif old.split(" ", 1)[0] in ex_hosts:
                why = "host"
            else:
                why = "other"
            out.append((why, old, new))
    return out
