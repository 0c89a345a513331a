"""Open upstream llama.cpp failure modes a topology can trigger, by build range: the one table that
`tunnelspec check` (cluster/model.py, Cluster.require_models) reads offline against the inventory's
pinned build (`llama_build_number`). Pure data and a lookup; no cluster types (llama/ is below cluster/).

A build is AFFECTED from the first build known bad up to (not including) the first fixed build; at or
after the fix it is FIXED; with no build number pinned, or older than the first build known bad (nobody
reported on it either way), its status is UNKNOWN. An affected build with the trigger is refused; an
unknown one with the trigger is a warning: the range is what upstream reported, and refusing builds
nobody tested would refuse working ones.

Sources (upstream issue and pull request threads, read 2026-12; recheck when a fix lands and move
`fixed` to the first release build that has it):
- ggml-org/llama.cpp issue 27850 (closed in favour of issue 27839, still open) and PR 27897 (open): a
  `--spec-type` list that combines draft-mtp with a draft-model type (draft-simple, draft-eagle3,
  draft-dflash, draft-dspark) while `-md` is given exits at start ("failed to create MTP context"):
  one shared context-params object gives the external draft model's context the MTP type. Reported
  on a development branch (commit 07822bdd), no build number; no fix released. draft-mtp alone with a
  separate MTP file from `-md` is not affected (the lab serves it on b11434). tunnelspec passes one
  `--spec-type` (spec_type takes one value and the flag is its own), so it cannot trigger this today;
  the entry guards the day spec_type takes a list.
- ggml-org/llama.cpp issue 28487 (open): with 3 or more `--rpc` endpoints the client deadlocks within
  minutes (one RPC dispatcher thread blocked in recv, the others idle; 2 endpoints work). Reported on
  b10819, also reproduced on b10751 and b10620; no fix released. The per-endpoint dispatcher it blocks
  in came with RPC protocol 6.0 (2026-08); builds before b10620 were not reported either way.
- issue 25719 (an assert when spec_draft_n_max + 1 exceeds the slots) has no known build range and is
  a plan-time warning of its own (llama/known_bugs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

AFFECTED, FIXED, UNKNOWN = "affected", "fixed", "unknown"
# The draft kinds that load an external model from -md besides the MTP head (core/constants.py DRAFT_TYPES).
DRAFT_MODEL_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})


@dataclass(frozen=True)
class Topology:
    """What a trigger looks at: the number of `--rpc` endpoints, the `--spec-type` values, a `-md` file."""

    rpc_endpoints: int
    spec_types: tuple[str, ...]
    draft_model: bool


@dataclass(frozen=True)
class KnownIssue:
    number: int
    what: str  # what happens, in our words
    trigger: str  # the topology or setting that triggers it
    first_bad: int | None  # the oldest build known affected; None: not known
    fixed: int | None  # the first build with the fix; None: none released
    instead: str  # what to do

    def status(self, build: int | None) -> str:
        if build is None:
            return UNKNOWN
        if self.fixed is not None and build >= self.fixed:
            return FIXED
        if self.first_bad is not None and build >= self.first_bad:
            return AFFECTED
        return UNKNOWN

    def builds(self) -> str:
        start = f"b{self.first_bad}" if self.first_bad is not None else "an unknown build"
        end = f"fixed in b{self.fixed}" if self.fixed is not None else "no fix released"
        return f"{start} and later, {end}"

    def triggered(self, topo: Topology) -> bool:
        if self.number == 27850:
            types = set(topo.spec_types)
            return topo.draft_model and "draft-mtp" in types and bool(types & DRAFT_MODEL_TYPES)
        if self.number == 28487:
            return topo.rpc_endpoints >= 3
        return False


ISSUES = (
    KnownIssue(
        27850,
        "llama-server exits at start (failed to create MTP context)",
        "a --spec-type list combining draft-mtp with another draft-model type, with -md",
        first_bad=None,
        fixed=None,
        instead="use one spec_type (draft-mtp alone with its separate MTP file is not affected)",
    ),
    KnownIssue(
        28487,
        "llama-server deadlocks within minutes",
        "3 or more RPC endpoints",
        first_bad=10620,
        fixed=None,
        instead="use at most 2 rpc nodes, or pin a build outside the affected range",
    ),
)


def findings(topo: Topology, build: int | None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for a topology on a build (its number; None: not pinned)."""
    refused, warned = [], []
    shown = f"b{build}" if build is not None else "the pinned build (no llama_build_number)"
    for issue in ISSUES:
        if not issue.triggered(topo):
            continue
        status = issue.status(build)
        text = f"llama.cpp issue {issue.number}: {issue.what} with {issue.trigger} (affected: {issue.builds()})"
        if status == AFFECTED:
            refused.append(f"{text}; {shown} is affected: {issue.instead}")
        elif status == UNKNOWN:
            warned.append(f"{text}; whether {shown} is affected is not known: {issue.instead} if it hangs or exits")
    return refused, warned
