"""Known-vulnerable llama.cpp build ranges touching RPC (source: docs/llama-facts.md, "Security advisories").

Build numbers are upstream `bNNNN` tags (`git rev-list --count HEAD` on upstream master). A build
whose number is unknown (vendored copy, shallow clone) cannot be judged: `check(None)` says so
plainly and the caller decides (preflight refuses unless the user accepts it explicitly).
"""

from __future__ import annotations

from dataclasses import dataclass, field

AFFECTED = "affected"
POSSIBLE = "possible"  # inside an approximate window: verify the named fix is in the tree
MITIGATED = "mitigated"  # affected range, but tunnelspec's build flags remove the vulnerable code
CLEAN = "clean"
UNKNOWN = "unknown"
# The name deploy's --allow-vulnerable-llama puts in RunOptions.accepted (components/build/build.py reads it).
ACCEPT_VULNERABLE = "vulnerable-llama"


@dataclass(frozen=True)
class Advisory:
    id: str
    cve: str
    summary: str
    introduced: int | None  # first affected build; None: since the beginning
    fixed: int | None  # first fixed build; None: no build number known for the fix
    fix: str
    note: str = ""
    # Builds in [introduced, fixed) are only *possibly* affected: the bounds are approximate.
    approximate: bool = False
    # A build flag that removes the vulnerable code (tunnelspec always sets it).
    mitigation: str | None = None
    mitigated_text: str = ""  # what the run output says about a mitigated build, e.g. "RDMA off"

    def affects(self, build: int) -> bool:
        if self.fixed is None:
            return False  # the fix has no known build number: cannot judge by number
        lower = self.introduced if self.introduced is not None else 0
        return lower <= build < self.fixed

    @property
    def range_text(self) -> str:
        if self.fixed is None:
            return "unknown (no build number for the fix)"
        lower = f"b{self.introduced}" if self.introduced is not None else ""
        text = f"{lower} to < b{self.fixed}" if lower else f"< b{self.fixed}"
        return f"≈ {text}" if self.approximate else text


ADVISORIES: tuple[Advisory, ...] = (
    Advisory(
        "GHSA-j8rj-fmpv-wcxw",
        "CVE-2026-34159",
        "unauthenticated RCE via RPC GRAPH_COMPUTE (CVSS 9.8)",
        introduced=None,
        fixed=8492,
        fix="b8492 (PR #20908)",
        note="the GHSA listing names <= b7991; the CVE record says fixed in b8492",
    ),
    Advisory(
        "PR-21030-regression",
        "CVE-2026-34159",
        "regression of the PR #20908 fix, repaired by PR #21030 a few days later",
        introduced=8492,
        fixed=8841,
        fix="PR #21030",
        note="the build number of PR #21030 is not known here; the window ends at b8841, a build "
        "known to be weeks later. Avoid builds between the two PRs",
        approximate=True,
    ),
    Advisory(
        "CVE-2026-118375",
        "CVE-2026-118375",
        "RDMA receive stack overflow in the RPC transport",
        introduced=8841,
        fixed=11865,
        fix="b11865, or build with GGML_RPC_RDMA=OFF",
        note="RDMA never negotiates through a tunnel anyway",
        mitigation="GGML_RPC_RDMA=OFF",
        mitigated_text="RDMA off",
    ),
    Advisory(
        "CVE-2026-137567",
        "CVE-2026-137567",
        "COPY_TENSOR out-of-bounds write",
        introduced=11450,
        fixed=12658,
        fix="b12658",
    ),
    Advisory(
        "CVE-2024-42477/8/9",
        "CVE-2024-42477, CVE-2024-42478, CVE-2024-42479",
        "RPC server out-of-bounds read/write",
        introduced=None,
        fixed=3561,
        fix="b3561",
    ),
    Advisory(
        "GRAPH_RECOMPUTE-UAF",
        "-",
        "GRAPH_RECOMPUTE use-after-free",
        introduced=None,
        fixed=None,
        fix="PR #24292",
        note="no build number known for the fix: verify the tree contains PR #24292",
    ),
)


@dataclass(frozen=True)
class Finding:
    advisory: Advisory
    verdict: str  # AFFECTED, POSSIBLE or MITIGATED


@dataclass(frozen=True)
class AdvisoryCheck:
    build_number: int | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """UNKNOWN (no build number), AFFECTED, POSSIBLE, MITIGATED or CLEAN (worst wins)."""
        if self.build_number is None:
            return UNKNOWN
        for level in (AFFECTED, POSSIBLE, MITIGATED):
            if any(f.verdict == level for f in self.findings):
                return level
        return CLEAN

    @property
    def advisories(self) -> list[Advisory]:
        return [f.advisory for f in self.findings]

    @property
    def message(self) -> str:
        if self.build_number is None:
            return "build number unknown (vendored or shallow source): known-vulnerable RPC builds cannot be ruled out"
        if not self.findings:
            return f"b{self.build_number}: no known RPC advisory"
        parts = [_finding_text(f) for f in self.findings]
        return f"b{self.build_number}: " + "; ".join(parts)


def _finding_text(f: Finding) -> str:
    a = f.advisory
    if f.verdict == MITIGATED:
        # Say what makes it safe, so a run's output shows why a build in the range is accepted.
        what = f"{a.mitigated_text}, " if a.mitigated_text else ""
        return f"{a.id} ({a.summary}, {a.range_text}): mitigated — {what}built with {a.mitigation}"
    return f"{a.id} ({f.verdict}; fix: {a.fix})"


def check(build_number: int | None, rdma: bool = False) -> AdvisoryCheck:
    """Advisories that apply to `build_number`. `rdma=False` (tunnelspec's build) marks advisories
    whose mitigation is that flag as MITIGATED rather than AFFECTED."""
    if build_number is None:
        return AdvisoryCheck(None)
    findings = []
    for adv in ADVISORIES:
        if not adv.affects(build_number):
            continue
        if adv.mitigation and not rdma:
            verdict = MITIGATED
        elif adv.approximate:
            verdict = POSSIBLE
        else:
            verdict = AFFECTED
        findings.append(Finding(adv, verdict))
    return AdvisoryCheck(build_number, findings)


def table_rows() -> list[tuple[str, str, str, str, str]]:
    """(id, CVE, affected builds, fix, note) for display."""
    return [(a.id, a.cve, a.range_text, a.fix, a.note or a.summary) for a in ADVISORIES]


def format_table() -> str:
    header = ("ID", "CVE", "AFFECTED BUILDS", "FIX", "NOTE")
    rows = [header, *table_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
    return "\n".join(lines)
