"""Seed 004's example inventory through `deploy --check` in the lab (each seed's quickstart
inventory is checked there; seed 003's is in test_examples.py, seed 000 is deployed whole by
tests/deploy/test_mtp_lab.py).

What the lab cannot have is swapped, and only that: the hosts (the CUDA box and the AMD box become
the lab's CPU hosts `main` and `rpc-a`: their hardware variables — backend, devices, the tensor split
over two GPUs — go with them), the models (a tiny target and a tiny DFlash draft, tests/support/gguf_drafts.py)
and [all:vars] (the lab's login and its offline source; the example's patch stack is commented out
as shipped). Kept as written: the speculative type (draft-dflash), the draft node's role, the
sections. The check reads the lab's built llama-server --help, so the plan proves draft-dflash on
RPC0 composes for the pinned build; nothing changes on any host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.cli import failed_report, tunnelspec

pytestmark = pytest.mark.lab

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed004-tensor-parallel-dflash.ini"
HARDWARE = ("llama_backend", "llama_target_devices", "rpc_devices", "llama_split_mode")
HOSTS = {"box": "main", "coal": "rpc-a"}


def lab_variant(lab, models: Path) -> tuple[Path, list[str]]:
    """The example with the lab's hosts, models and [all:vars]; returns the path and what was dropped."""
    lab_text = Path(lab.inventory).read_text()
    ips = dict(re.findall(r"^(\S+) ansible_host=(\S+)", lab_text, re.M))
    text = EXAMPLE.read_text()
    dropped = []
    out = []
    for line in text[:text.index("[all:vars]")].splitlines():
        name = line.split(" ", 1)[0]
        if name in HOSTS:
            words = []
            for w in line.split()[1:]:
                key = w.split("=", 1)[0]
                if key in HARDWARE:
                    dropped.append(w)
                elif key == "ansible_host":
                    words.append(f"ansible_host={ips[HOSTS[name]]}")
                else:
                    words.append(w)
            line = " ".join([HOSTS[name], *words])
        elif line.startswith(("llama_model=", "llama_draft_model=")):
            dropped.append(line)
            key = line.split("=", 1)[0]
            line = f"{key}={models / ('constant-target.gguf' if key == 'llama_model' else 'dflash.gguf')}"
        out.append(line)
    lab_all = lab_text[lab_text.index("[all:vars]"):]
    lab_all = re.sub(r"^llama_(draft_)?model=.*\n", "", lab_all, flags=re.M)
    path = Path(lab.dir) / "example-seed004.ini"
    path.write_text("\n".join(out) + "\n\n" + lab_all)
    return path, dropped


def test_seed004_example_deploy_check_in_the_lab(lab, tmp_path):
    from support import gguf_drafts

    gguf_drafts.write_constant_target(tmp_path / "constant-target.gguf")
    gguf_drafts.write_dflash_draft(tmp_path / "dflash.gguf")
    # The lab's own source and build first (a no-op when an earlier test built them): the plan check
    # reads the built llama-server's --help, which a fresh lab has not built yet. Services untouched.
    base = tunnelspec("deploy", lab.inventory, "--tags", "source,build", "--format", "json", timeout=3600)
    assert base.rc == 0, failed_report(base)
    inv, dropped = lab_variant(lab, tmp_path)
    print("\nswapped for the lab:", dropped)
    assert sorted(w.split("=")[0] for w in dropped) == sorted(
        ["llama_backend", "llama_target_devices", "llama_split_mode", "llama_backend", "llama_model",
         "llama_draft_model"]), dropped
    text = inv.read_text()
    assert "spec_type=draft-dflash" in text and re.search(r"^rpc-a .*rpc_role=draft", text, re.M)
    r = tunnelspec("deploy", str(inv), "--check", "--format", "json", timeout=1800)
    assert r.rc in (0, 3), failed_report(r)
    assert not r.results("failed"), r.results("failed")
    plan = next(e for e in r.results() if e.get("module") == "llama_server_plan")
    assert plan["status"] in ("ok", "changed"), plan
    assert "draft-dflash" in (plan.get("msg", "") + str(plan.get("after", ""))), plan
