"""An unexpected exception (a bug) is one line on the terminal and a file holding its traceback.

The user sees what broke and where the details are, never a traceback in the middle of a run's
output (exit 70, docs/ci.md). The file goes to ~/.cache/tunnelspec (XDG_CACHE_HOME), else to the
temporary directory; it carries the command line with every -e value masked, since extra variables
are where secrets come from, and the exception's text with every secret value this process met masked
(core/secrets.py), as well as any `KEY=VALUE` whose KEY names a secret."""

from __future__ import annotations

import os
import platform
import re
import secrets as random_names
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tunnelspec import __version__
from tunnelspec.core import vault
from tunnelspec.core.secrets import MASK, is_secret_name, mask_text, secret_values, seen
from tunnelspec.inventory.extra_file import read_extra_vars_file

# A new file only, never through a link planted at its name (the temporary directory is everyone's).
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _mask(value: str) -> str:
    if value.startswith("@"):
        return value
    key, eq, _ = value.partition("=")
    return f"{key}={MASK}" if eq else MASK


def _e_value(arg: str) -> tuple[str | None, bool]:
    """How click reads one word as -e: (the -e value within the word, or None; whether the next word
    is -e's value). A word of short options (`-vCe`) is read letter by letter, and -e takes the rest of
    the word (`-CeK=V`, `-e=K=V`) or, when nothing is left, the next word. The first `e` is taken as
    -e even after a letter that takes a value itself (`-le`): masking too much loses nothing here."""
    if arg == "--extra-vars":
        return None, True
    if arg.startswith("--extra-vars="):
        return arg[len("--extra-vars=") :], False
    if arg.startswith("-") and not arg.startswith("--") and "e" in arg[1:]:
        at = arg.index("e", 1) + 1
        return (None, True) if at == len(arg) else (arg[at:], False)
    return None, False


def masked_argv(argv: list[str]) -> list[str]:
    """The command line, each -e/--extra-vars value (in every spelling click takes) reduced to its key
    (KEY=***); @FILE is kept."""
    out, value_next = [], False
    for a in argv:
        glued, takes_next = _e_value(a)
        if value_next:
            out.append(_mask(a))
        elif glued is not None:
            out.append(a[: len(a) - len(glued)] + _mask(glued))
        else:
            out.append(a)
        value_next = takes_next
    return out


def _extra_values(argv: list[str]) -> list[str]:
    """The -e values of the command line, as click gives them to -e."""
    found, value_next = [], False
    for a in argv:
        if value_next:
            found.append(a)
        glued, value_next = _e_value(a)
        if glued is not None:
            found.append(glued)
    return found


def _secrets_of(argv: list[str]) -> list[str]:
    """Secret values to mask: those this process met, and the secret-named -e values of the command
    line (also in -e @FILE), which the crash may have come before anything read."""
    variables: dict = {}
    vault.hold_passwords()  # a crash report never prompts for, or runs, a vault password source
    for v in _extra_values(argv):
        if v.startswith("@"):
            try:
                variables.update(read_extra_vars_file(v[1:]))
            except Exception:  # noqa: BLE001 - unreadable now: the report is written all the same
                pass
        elif "=" in v:
            key, val = v.split("=", 1)
            variables[key] = val
    return sorted({*seen(), *secret_values(variables)}, key=len, reverse=True)


# KEY=VALUE, KEY: VALUE, 'KEY': 'VALUE', "KEY"="VALUE": the value (quoted, or up to a blank or a
# delimiter) of a KEY that names a secret (core/secrets.py) is masked in an exception's message.
_PAIR = re.compile(
    r"""(?P<key>[A-Za-z_][\w.-]*)['"]?\s*[=:]\s*(?:'(?P<sq>[^']*)'|"(?P<dq>[^"]*)"|(?P<bare>[^\s'",;)}\]]+))"""
)


def _mask_pairs(text: str) -> str:
    def repl(m: re.Match) -> str:
        if not is_secret_name(m["key"]):
            return m[0]
        group = next(g for g in ("sq", "dq", "bare") if m[g] is not None)
        start, end = m.span(group)
        return m[0][: start - m.start()] + MASK + m[0][end - m.start() :]

    return _PAIR.sub(repl, text)


def _scrub(text: str, secrets: list[str]) -> str:
    return _mask_pairs(mask_text(text, secrets))


def _report_text(exc: BaseException, argv: list[str]) -> str:
    secrets = _secrets_of(argv)
    parts = []
    for chunk in traceback.format_exception(type(exc), exc, exc.__traceback__):
        # A frame (`File "…", line N`) shows code, where `api_key=key` is a name; the rest is messages.
        frame = chunk.lstrip(" |").startswith('File "')
        parts.append(mask_text(chunk, secrets) if frame else _scrub(chunk, secrets))
    command = " ".join(masked_argv(argv))
    return (
        f"tunnelspec {__version__}, Python {platform.python_version()}, {platform.platform()}\n"
        f"command: {mask_text(command, secrets)}\n\n" + "".join(parts)
    )


def _file_names() -> list[str]:
    """The file's name, and others should that one exist (or someone planted a link there)."""
    base = f"tunnelspec-crash-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    return [f"{base}.txt"] + [f"{base}-{random_names.token_hex(4)}.txt" for _ in range(3)]


def _candidates() -> list[Path]:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(cache) / "tunnelspec", Path(tempfile.gettempdir())]


def write_report(exc: BaseException, argv: list[str] | None = None) -> str | None:
    """Writes the traceback; returns the file's path, or None when no directory took it."""
    text = _report_text(exc, list(argv if argv is not None else sys.argv[1:]))
    for d in _candidates():
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        for name in _file_names():
            path = d / name
            try:
                fd = os.open(path, _CREATE, 0o600)
            except FileExistsError:
                continue
            except OSError:
                break
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return str(path)
    return None


def one_line(exc: BaseException, argv: list[str] | None = None) -> str:
    msg = _scrub(str(exc), _secrets_of(list(argv if argv is not None else sys.argv[1:]))).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}" if msg else type(exc).__name__
