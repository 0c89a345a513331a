"""sshd's configuration, read: the unconditional `Include` globs of an sshd_config, and the
effective settings `sshd -T` prints for one connection (a command plus pure parsers)."""

from __future__ import annotations

from tunnelspec.facts.fact import Fact


def _sshd_words(line: str) -> list[str]:
    """One sshd_config line split as sshd splits it: the keyword ends at whitespace or a single `=`
    (`Include=/path`); arguments are separated by whitespace, a double-quoted one may hold spaces;
    a `#` at the start of a word begins a comment."""
    words, word, quoted, started = [], "", False, False
    line = line.strip()
    key_end = next((i for i, c in enumerate(line) if c.isspace() or c == "="), len(line))
    if key_end:
        words.append(line[:key_end])
        rest = line[key_end:].lstrip()
        if rest.startswith("="):
            rest = rest[1:]
    else:
        rest = line
    for c in rest:
        if c == '"':
            quoted, started = not quoted, True
        elif c.isspace() and not quoted:
            if started:
                words.append(word)
            word, started = "", False
        elif c == "#" and not quoted and not started:
            break
        else:
            word, started = word + c, True
    if started:
        words.append(word)
    return words


def sshd_includes(config_text: str) -> list[str]:
    """Globs of the unconditional `Include` lines (before the first `Match`) of an sshd_config,
    made absolute the way sshd does (relative to /etc/ssh)."""
    globs = []
    for raw in config_text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        words = _sshd_words(raw)
        if not words:
            continue
        key = words[0].lower()
        if key == "match":
            break  # an Include inside a Match block is conditional: not ours to rely on
        if key == "include":
            globs += [w if w.startswith("/") else f"/etc/ssh/{w}" for w in words[1:]]
    return globs


def parse_sshd_T(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and key not in out:
            out[key] = value.strip()
    return out


def effective(sshd: str, user: str, address: str, config: str | None = None) -> Fact[dict[str, str]]:
    """What sshd would apply to `user` connecting from `address` (keywords lower-cased), with its
    own configuration or `config` (`sshd -T`)."""
    return Fact(
        [sshd, *(["-f", config] if config else []), "-T", "-C", f"user={user},host=tunnelspec-check,addr={address}"],
        parse_sshd_T,
    )


async def effective_settings(conn, sshd: str, user: str, address: str, config: str | None = None) -> dict[str, str]:
    """`effective`, gathered; raises RuntimeError with sshd's message when `sshd -T` fails."""
    fact = effective(sshd, user, address, config)
    res = await conn.probe(fact.argv)
    if res.rc != 0:
        raise RuntimeError(f"sshd -T failed: {res.stderr.strip()}")
    return fact.parse(res.stdout)
