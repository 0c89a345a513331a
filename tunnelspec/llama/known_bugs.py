"""llama.cpp bugs that break a feature tunnelspec uses, reported at plan time (before any unit is
written or restarted), like the security advisories are before a build.

llama.cpp issue 25719: some builds abort on the first completion with
`GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max)` when the drafted tokens plus one exceed the
outputs the draft context reserved (one per parallel slot). The build range is not known here, so
the check is on the configuration that triggers it: a `spec_draft_n_max` the inventory imposes,
larger than the slots allow. tunnelspec itself never imposes one (the build's own default is used
when the inventory leaves it unset).
"""

from __future__ import annotations

ISSUE_25719 = "llama.cpp issue 25719"


def _int_after(argv: list[str], *names: str) -> int | None:
    for i, a in enumerate(argv):
        flag, _, inline = a.partition("=")
        if flag in names:
            value = inline or (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(value)
            except ValueError:
                return None
    return None


def n_parallel(extra_args: list[str], help_default: float | None) -> int | None:
    """The parallel slots llama-server will have: `-np N` in the extra args, else the build's own
    default when it is a fixed number (-1 = "auto" is not)."""
    n = _int_after(list(extra_args), "-np", "--parallel")
    if n is None and help_default is not None and help_default > 0:
        n = int(help_default)
    return n if n is not None and n > 0 else None


def draft_n_max_warnings(n_max: int | None, slots: int | None, build: str) -> list[str]:
    if n_max is None:
        return []
    if slots is not None and n_max + 1 <= slots:
        return []
    where = f"{slots} parallel slot(s)" if slots else "the parallel slots (auto: not known before start)"
    return [
        f"spec_draft_n_max={n_max}: {ISSUE_25719} — some builds abort on the first completion with "
        f"GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) when n_max + 1 exceeds {where}; "
        f"on {build} leave spec_draft_n_max unset (the build's own default) or raise -np"
    ]
