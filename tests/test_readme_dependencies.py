"""README's "Why these dependencies" explains every runtime dependency pyproject.toml declares
(a new dependency without its reason fails here), and records the Fabric decision."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Why these dependencies\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "README.md has no '## Why these dependencies' section"
    return m.group(1)


def test_every_dependency_has_its_reason():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[; ]", d, 1)[0] for d in deps]
    section = _section()
    explained = {m.lower() for m in re.findall(r"^- \*\*([^*]+)\*\*: \S", section, re.M)}
    missing = [n for n in names if n.lower() not in explained]
    assert not missing, f"README 'Why these dependencies' does not explain: {missing}"


def test_fabric_decision_is_recorded():
    section = _section()
    assert "Fabric" in section and "one SSH stack" in section and "host-key" in section
    assert "OpenSSH `ssh`" in section and "systemd" in section
