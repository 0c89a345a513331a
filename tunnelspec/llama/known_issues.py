"""Open upstream llama.cpp failure modes a topology can trigger, by build range: the one table that
`tunnelspec check` (cluster/model.py, Cluster.require_models) reads offline against the inventory's
pinned build (`llama_build_number`). Pure data and a lookup; no cluster types (llama/ is below cluster/).

A build is AFFECTED from the first build reported bad up to the last build reported bad (`last_reported`;
None: up to the fix), never at or after the first fixed build; at or after the fix it is FIXED. A build
after the last one reported, with no fix released, is UNCONFIRMED: nobody reported it bad, and where
tunnelspec's lab ran the trigger on it and it worked, the entry says so (`unconfirmed`). With no build
number pinned, or older than the first build reported (nobody reported on it either way), its status
is UNKNOWN. An affected build with the trigger is refused; an unconfirmed or unknown one is a warning:
the range is what upstream reported, and refusing builds nobody saw fail would refuse working ones.

Sources (upstream issue and pull request threads, read 2026-12; recheck when a fix lands and move
`fixed` to the first release build that has it, or `last_reported` to a newer build reported bad):
- ggml-org/llama.cpp issue 27850 (closed in favour of issue 27839, still open) and PR 27897 (open): a
  `--spec-type` list that combines draft-mtp with a draft-model type (draft-simple, draft-eagle3,
  draft-dflash, draft-dspark) while `-md` is given exits at start ("failed to create MTP context"):
  one shared context-params object gives the external draft model's context the MTP type. Reported
  on a development branch (commit 07822bdd), no build number; no fix released. draft-mtp alone with a
  separate MTP file from `-md` is not affected (the lab serves it on b11434). tunnelspec passes one
  `--spec-type` (spec_type takes one value and the flag is its own), so it cannot trigger this today;
  the entry guards the day spec_type takes a list.
- ggml-org/llama.cpp issue 28487 (open, labelled bug-unconfirmed): with 3 or more `--rpc` endpoints the
  client deadlocks within minutes (one RPC dispatcher thread blocked in recv, the others idle; 2
  endpoints work). Reported on b10819, also on b10751 and b10620, with llama-bench and 3-30B models over
  real 10 GbE links; no fix released. The per-endpoint dispatcher it blocks in came with RPC protocol
  6.0 (2026-08); builds before b10620 were not reported either way. Not reproduced in tunnelspec's lab
  on b11434 (CPU build, a tiny 2-layer model, three rpc-servers on one host's loopback, the target split
  over two and the draft on the third): 100 sequential completions, then 4 concurrent clients for 150 s,
  1454 completions, none failed or hung. A loopback lab is not a 10 GbE network with big models, so
  later builds are a warning, not a pass; at run time a completion that makes no answer within its
  bound on 3 or more endpoints is reported naming the issue (`no_progress`: verify, bench).
- issue 25719 (an assert when spec_draft_n_max + 1 exceeds the slots) has no known build range and is
  a plan-time warning of its own (llama/known_bugs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

AFFECTED, FIXED, UNKNOWN, UNCONFIRMED = "affected", "fixed", "unknown", "unconfirmed"
RPC_DEADLOCK = 28487  # the issue a completion without progress on 3 or more RPC endpoints is named as
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
    first_bad: int | None  # the oldest build reported affected; None: not known
    fixed: int | None  # the first build with the fix; None: none released
    instead: str  # what to do on an affected build
    last_reported: int | None = None  # the newest build reported affected; None: affected up to the fix
    unconfirmed: str = ""  # after last_reported, unfixed: what is known of those builds (e.g. our lab's run)

    def status(self, build: int | None) -> str:
        if build is None:
            return UNKNOWN
        if self.fixed is not None and build >= self.fixed:
            return FIXED
        if self.first_bad is None or build < self.first_bad:
            return UNKNOWN
        if self.last_reported is not None and build > self.last_reported:
            return UNCONFIRMED
        return AFFECTED

    def builds(self) -> str:
        if self.first_bad is None:
            start = "an unknown build and later"
        elif self.last_reported is not None:
            start = f"reported on b{self.first_bad}–b{self.last_reported}"
        else:
            start = f"b{self.first_bad} and later"
        end = f"fixed in b{self.fixed}" if self.fixed is not None else "no fix released"
        return f"{start}, {end}"

    def triggered(self, topo: Topology) -> bool:
        if self.number == 27850:
            types = set(topo.spec_types)
            return topo.draft_model and "draft-mtp" in types and bool(types & DRAFT_MODEL_TYPES)
        if self.number == RPC_DEADLOCK:
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
        RPC_DEADLOCK,
        "llama-server deadlocks within minutes",
        "3 or more RPC endpoints",
        first_bad=10620,
        last_reported=10819,
        fixed=None,
        instead="use at most 2 rpc nodes, or pin a build after b10819",
        unconfirmed=(
            "not reproduced in tunnelspec's lab on b11434 (1454 completions with 3 endpoints and 4 clients); "
            "a completion that makes no progress is reported naming this issue (verify, bench)"
        ),
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
        elif status == UNCONFIRMED:
            known = f": {issue.unconfirmed}" if issue.unconfirmed else ""
            warned.append(f"{text}; {shown} is later than any build reported and not known to be fixed{known}")
        elif status == UNKNOWN:
            warned.append(f"{text}; whether {shown} is affected is not known: {issue.instead} if it hangs or exits")
    return refused, warned


def no_progress(rpc_endpoints: int, what: str, unit: str) -> str:
    """The message for a completion that got no answer within its bound (`what` says which and the
    bound) on a topology that triggers issue 28487; '' on fewer endpoints (nothing to name).
    `unit`: llama-server's systemd unit on main, for the restart."""
    [issue] = [i for i in ISSUES if i.number == RPC_DEADLOCK]
    if not issue.triggered(Topology(rpc_endpoints=rpc_endpoints, spec_types=(), draft_model=False)):
        return ""
    return (
        f"{what}, with {rpc_endpoints} RPC endpoints: this looks like llama.cpp issue {issue.number} "
        f"({issue.what} with {issue.trigger}; {issue.builds()}); a deadlocked llama-server does not "
        f"recover by itself. Restart serving (`systemctl restart {unit}` on main), or deploy "
        "with at most 2 rpc nodes; if it comes back on this build, add the build number and topology "
        f"to llama.cpp issue {issue.number}"
    )
