"""The repository stands alone: nothing in it points at documents outside it (what the code relies
on is written in docs/: design.md, llama-facts.md, internals.md, modules.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file itself is not a hit for `git grep '\.\./shared'`.
OUTSIDE = ("../" + "shared", "LLAMA_" + "FACTS", "DESIGN" + ".md")


def test_no_file_cites_a_document_outside_the_repository():
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    hits = []
    for name in files.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1)
                 if any(word in line for word in OUTSIDE)]
    assert hits == []


def test_the_docs_the_code_cites_exist():
    for doc in ("design.md", "llama-facts.md", "internals.md", "modules.md", "output.md"):
        assert (ROOT / "docs" / doc).is_file(), doc
