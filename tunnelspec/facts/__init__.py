"""Read-only observations: a command plus a pure parser of its output."""


def sections(text: str) -> dict[str, list[str]]:
    """A probe script's output split at its `== NAME` header lines: {NAME: the lines below it}."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("== "):
            cur = line[3:].strip()
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out
