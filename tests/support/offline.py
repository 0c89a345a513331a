"""An inventory whose hosts cannot be reached: every address is 127.0.0.1 port 9, where nothing listens,
so a command that connected would end in exit 4, never in the exit 2 of a refusal found offline."""

from __future__ import annotations

from pathlib import Path

SHA = "8c22f3ff082f60e8b97ed51afbf8e51e63208260"


def unreachable_inventory(directory: Path, main_vars: str = "") -> Path:
    """`directory`/inventory.ini: main (line 2, with `main_vars`) and one node, both on port 9."""
    inv = directory / "inventory.ini"
    inv.write_text(f"""[main]
main ansible_host=127.0.0.1 ansible_port=9 {main_vars}
[rpc]
rpc-a ansible_host=127.0.0.1 ansible_port=9
[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit="{SHA}"
llama_model=/m/t.gguf
llama_draft_model=/m/d.gguf
""")
    return inv
