"""Source and build state of one host for `tunnelspec status` (read-only, one command per host).

info = await source_build_status(conn, root)        # root: the host's tunnelspec root
info.as_dict() -> {"commit", "head", "tree", "patches", "dirty", "build_key", "targets", "current"}
format_rows({host: info}) -> list of text lines (a table; trees that differ are flagged)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from tunnelspec.llama.build_plan import split_sections

# Prints the checkout's HEAD/tree/modifications, the stack record, and the stamp of the current build.
_SCRIPT = r"""
root=$1 d=$1/src/llama.cpp
if [ -e "$d/.git" ]; then
  echo "head $(git -C "$d" rev-parse -q --verify HEAD 2>/dev/null || echo none)"
  echo "tree $(git -C "$d" rev-parse -q --verify 'HEAD^{tree}' 2>/dev/null || echo none)"
  echo "dirty $(git -C "$d" status --porcelain 2>/dev/null | wc -l)"
else
  echo "head none"
fi
echo "current $(readlink -- "$root/current" 2>/dev/null || echo none)"
echo "--- stack"
cat -- "$d/.git/tunnelspec-stack" 2>/dev/null
echo "--- stamp"
cat -- "$root/current/.tunnelspec-stamp" 2>/dev/null
exit 0
"""


@dataclass
class SourceBuildStatus:
    head: str | None = None
    tree: str | None = None
    dirty: int = 0
    commit: str | None = None  # the pinned base commit of the applied stack
    patches: list[str] = field(default_factory=list)
    stack_current: bool = False  # HEAD is what the recorded stack produced
    current: str | None = None
    build_key: str | None = None
    targets: list[str] = field(default_factory=list)
    build_tree: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def parse_status(text: str) -> SourceBuildStatus:
    st = SourceBuildStatus()
    head, sections = split_sections(text)
    for line in head:
        key, _, value = line.partition(" ")
        if key in ("head", "tree", "current"):
            setattr(st, key, None if value == "none" else value)
        elif key == "dirty" and value.strip().isdigit():
            st.dirty = int(value)
    stack, stamp = (_json("\n".join(sections.get(s, []))) for s in ("stack", "stamp"))
    if stack:
        st.commit = stack.get("base")
        st.patches = [p.get("id", "?") for p in stack.get("patches", [])]
        st.stack_current = stack.get("head") == st.head and st.head is not None
    if stamp:
        st.build_key = stamp.get("key")
        st.targets = list(stamp.get("targets", []))
        st.build_tree = stamp.get("tree")
    return st


def _json(raw: str) -> dict | None:
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return None


async def source_build_status(conn, root: str) -> SourceBuildStatus:
    res = await conn.probe(["sh", "-c", _SCRIPT, "sh", root.rstrip("/") or "/"], timeout=30)
    return parse_status(res.stdout)


def format_rows(statuses: dict[str, SourceBuildStatus]) -> list[str]:
    """One line per host: commit, tree, patches, build; a note when trees differ or the build is stale."""
    trees = {s.tree for s in statuses.values() if s.tree}
    rows = [("HOST", "COMMIT", "TREE", "PATCHES", "BUILD", "NOTE")]
    for host, s in sorted(statuses.items()):
        notes = []
        if s.head is None:
            notes.append("no checkout")
        if s.dirty:
            notes.append(f"{s.dirty} local modification(s)")
        if s.head and not s.stack_current:
            notes.append("HEAD is not the applied stack")
        if len(trees) > 1:
            notes.append("trees differ between hosts")
        if s.build_tree and s.tree and s.build_tree != s.tree:
            notes.append("current build is of another tree")
        build = f"{s.build_key} ({', '.join(s.targets)})" if s.build_key else "-"
        rows.append(
            (host, (s.commit or "-")[:12], (s.tree or "-")[:12], str(len(s.patches)), build, "; ".join(notes) or "ok")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]


def default_root(cluster, host: str) -> str:
    """The host's root from the Cluster (main or rpc node)."""
    if cluster.main.name == host:
        return cluster.main.root
    return cluster.node(host).root


__all__ = ["SourceBuildStatus", "source_build_status", "parse_status", "format_rows", "default_root"]
