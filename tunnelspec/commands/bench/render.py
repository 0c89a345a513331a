"""bench's human form: the two sides in columns (docs/cli.md, "tunnelspec bench", says what each row means)."""

from __future__ import annotations

LABEL_W, COL_W = 18, 28


def _secs(x: dict | None, extra: str = "") -> str:
    if not x:
        return "-"
    if x.get("seconds") is None:
        return "unknown"
    return f"{x['seconds']:.2f} s{extra}"


def _speed(v) -> str:
    return f"{v:.1f}" if isinstance(v, (int, float)) else "-"


def _draft(side: dict) -> str:
    return f"{side['draft_n_accepted']}/{side['draft_n']}" if side.get("draft_n") else "-"


def _wait(w: dict | None) -> str:
    if not w:
        return "-"
    if w.get("seconds") is None:
        return "unknown"
    if w["seconds"] == 0 and w.get("why"):
        return "0 (no RPC)"
    share = f" ({w['share']:.0%} of {w['of_seconds']:.2f} s)" if w.get("share") is not None else ""
    return f"{w['seconds']:.2f} s{share}"


def _rows(side: dict) -> list[str]:
    load = side.get("load")
    ready = side.get("ready_seconds")
    return [
        side.get("placement", "-"),
        _secs(load, f", /health {ready:.2f} s" if isinstance(ready, (int, float)) and load else ""),
        _speed(side.get("prompt_per_second")),
        _speed(side.get("predicted_per_second")),
        _draft(side),
        _wait(side.get("network_wait")),
    ]


LABELS = ["placement", "load time", "prompt tok/s", "generation tok/s", "draft accepted", "network wait"]


def render(r: dict) -> str:
    d, b = r["deployed"], r["baseline"]
    prompt = r["prompt"] if len(r["prompt"]) <= 60 else r["prompt"][:57] + "..."
    left_title = f"as deployed ({d['kind']})"
    left = _rows(d)
    right = _rows(b) if b.get("ran") else ["not run (see below)"] + ["-"] * (len(LABELS) - 1)
    width = max(COL_W, max(len(x) for x in [left_title, *left]) + 2)
    lines = [
        f"prompt {prompt!r}, {r['n_predict']} tokens per completion, median of {r['runs']} runs",
        f"{'':<{LABEL_W}} {left_title:<{width}} {b['title']}",
    ]
    for label, lt, rt in zip(LABELS, left, right, strict=True):
        lines.append(f"{label:<{LABEL_W}} {lt:<{width}} {rt}".rstrip())
    for name, w in (
        ("as deployed", d.get("network_wait")),
        ("baseline", b.get("network_wait") if b.get("ran") else None),
    ):
        if w and w.get("by_node") and len(w["by_node"]) > 1:
            lines.append(
                f"network wait by node ({name}): " + ", ".join(f"{n} {s:.2f} s" for n, s in w["by_node"].items())
            )
        if w and w.get("seconds") is None and w.get("why"):
            lines.append(f"network wait ({name}) unknown: {w['why']}")
    fit = b.get("fit")
    if fit and fit.get("level") in ("tight", "unknown") and b.get("ran"):
        lines.append(f"fit: {fit['message']}")
    if not b.get("ran"):
        lines.append(f"{b['title']} not run: {b.get('why')}")
    elif r.get("speedup"):
        lines.append(f"generation speed, as deployed / {b['title']}: {r['speedup']:.2f}x")
    return "\n".join(lines)
