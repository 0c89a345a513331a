"""The deploys the invariant checks read: everything the deploy playbook renders for a few realistic
inventories (tests/support/deploy_render.py), rendered once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.deploy_render import ROOT, lab_inventory, render_deploy

KEY = "/etc/tunnelspec/llama-api-key"
VARIANTS = {
    # The lab's own inventory (tunnelspec lab up), with the metrics exporter and an API key.
    "lab": lambda d: lab_inventory(d, f"metrics=true\nllama_server_api_key_file={KEY}\n"),
    # Public bind: TLS in the front, /metrics behind a scrape token.
    "lab-public": lambda d: lab_inventory(
        d, f"llama_server_host=192.0.2.10\nllama_server_public_bind=true\nllama_server_api_key_file={KEY}\n"
           "metrics=true\nmetrics_token_file=/etc/tunnelspec/metrics-token\n"),
    # The lab's hosts serving a split with no draft (no watcher, the launcher's plain mode), rpc-server
    # without its cache.
    "lab-split": lambda d: _split(lab_inventory(d, "", "rpc_cache=false\n")),
    # The documented example (non-default ports, users and a CPU draft device).
    "example": lambda d: _copy(ROOT / "inventory.example.ini", d),
}


def _split(path: Path) -> Path:
    text = path.read_text().replace("rpc_role=draft", "rpc_role=target")
    path.write_text("\n".join(x for x in text.splitlines() if not x.startswith("llama_draft_model=")) + "\n")
    return path


def _copy(src: Path, d: Path) -> Path:
    shutil.copy(src, d / src.name)
    return d / src.name


@pytest.fixture(scope="session")
def deploys(tmp_path_factory):
    out = {}
    for name, make in VARIANTS.items():
        d = tmp_path_factory.mktemp(f"deploy-{name}")
        out[name] = render_deploy(name, make(d), d / "cache")
    return out
