"""The `tree_hash` gate: after the source play every host must hold the same source tree, or the
run stops before anything is built. The error is a per-host table: commit, tree hash, and the first
step of the patch stack where the host parts from the reference (the most common tree, ties broken
by host name; or the host named by the gate's `reference` argument)."""

from __future__ import annotations

from collections import Counter

from tunnelspec.modules.gates import register_gate
from tunnelspec.core.errors import TaskFailed


def _short(sha: str | None, n: int = 12) -> str:
    return (sha or "-")[:n]


def first_difference(src: dict, ref: dict) -> str:
    """Where `src` (a host's llama_src) first differs from `ref`: the base commit or a patch step."""
    if src.get("commit") != ref.get("commit"):
        return f"base commit {_short(src.get('commit'))} (reference {_short(ref.get('commit'))})"
    mine, theirs = src.get("patches") or [], ref.get("patches") or []
    for i in range(max(len(mine), len(theirs))):
        a = mine[i] if i < len(mine) else None
        b = theirs[i] if i < len(theirs) else None
        if a is None or b is None:
            extra = a or b or {}
            return f"patch {i + 1} {extra['id']} only on {'this host' if a else 'the reference'}"
        if a.get("id") != b.get("id"):
            return f"patch {i + 1}: {a.get('id')} (reference {b.get('id')})"
        if a.get("tree") != b.get("tree"):
            return f"patch {i + 1} {a['id']} gives tree {_short(a.get('tree'))} (reference {_short(b.get('tree'))})"
    return "same base and patches, different tree (files changed outside tunnelspec?)"


def compare_trees(sources: dict[str, dict | None], reference_host: str | None = None) -> str:
    """Raises TaskFailed with the per-host table unless every tree is equal; returns a summary."""
    present = {h: s for h, s in sources.items() if s}
    if not present:
        return "source play did not run (tags): trees not compared"
    missing = sorted(h for h, s in sources.items() if not s)
    if any(s.get("pending") for s in present.values()) and not missing:
        return "check mode: source trees are compared after the source play applies"
    trees = Counter(s.get("tree") for s in present.values())
    if not missing and len(trees) == 1:
        tree = next(iter(trees))
        return f"tree {tree} equal on {len(present)} host(s)"
    ref_host = (
        reference_host if reference_host in present else min(present, key=lambda h: (-trees[present[h].get("tree")], h))
    )
    ref = present[ref_host]
    rows = [("HOST", "COMMIT", "TREE", "FIRST DIFFERENCE")]
    for host in sorted(sources):
        s = sources[host]
        if not s:
            rows.append((host, "-", "-", "no source recorded"))
        elif host == ref_host:
            rows.append((host, _short(s.get("commit")), _short(s.get("tree")), "(reference)"))
        elif s.get("tree") == ref.get("tree"):
            rows.append((host, _short(s.get("commit")), _short(s.get("tree")), "-"))
        else:
            rows.append((host, _short(s.get("commit")), _short(s.get("tree")), first_difference(s, ref)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    table = "\n".join("  " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows)
    raise TaskFailed(
        "llama.cpp source trees differ between hosts; stopping before any build:\n"
        + table
        + "\nevery host must build the same source: pin one llama_commit and llama_patches for all hosts"
    )


@register_gate("tree_hash")
def tree_hash_gate(args: dict, hostvars: dict[str, dict]) -> str:
    var = args.get("var", "llama_src")
    sources = {h: hv.get(var) for h, hv in hostvars.items()}
    # The gate sees host variables only (no groups): the most common tree is the reference.
    return compare_trees(sources, args.get("reference"))
