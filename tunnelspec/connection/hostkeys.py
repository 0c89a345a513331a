"""Host-key policy: strict by default; accepting a new key is explicit and reported; a changed
key always fails, naming both fingerprints."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import asyncssh

from tunnelspec.core.errors import HostKeyError, UsageError


_KEY_TYPE = re.compile(r"(^|\s)(ssh-|ecdsa-|sk-|rsa-sha2-|x509v3-)\S*\s+\S")


def is_known_hosts_content(spec: str) -> bool:
    """TUNNELSPEC_KNOWN_HOSTS is the file's content or a path. Content has several lines, or one entry
    (`HOSTS KEYTYPE BASE64`, or an @marker line); anything else (no spaces, a slash, no key type) is a
    path, and a path that does not exist is an empty file, never parsed as known_hosts lines."""
    if "\n" in spec.strip():
        return True
    line = spec.strip()
    return line.startswith(("@cert-authority", "@revoked")) or bool(_KEY_TYPE.search(line))


def load_known_hosts_text(spec: str | None) -> str:
    """spec is a path or the file's content (TUNNELSPEC_KNOWN_HOSTS accepts both). A path that does not
    exist yet reads as empty (its hosts are then unknown, exit 4, or pinned there with
    --accept-new-host-keys); one that cannot be read, or does not hold known_hosts lines, is a usage
    error (exit 2) naming it."""
    if not spec:
        return ""
    if is_known_hosts_content(spec):
        text, where = spec, "TUNNELSPEC_KNOWN_HOSTS"
    else:
        p = Path(spec).expanduser()
        where = f"known_hosts file {p}"
        if p.is_dir():
            raise UsageError(
                f"{where} is a directory; tunnelspec_known_hosts (or TUNNELSPEC_KNOWN_HOSTS) must name a file"
            )
        try:
            text = p.read_text()
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{where} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    try:
        parsed_known_hosts(text)
    except (ValueError, asyncssh.Error) as e:
        raise UsageError(
            f"{where}: not a known_hosts file ({e}); fix or remove the line, "
            "or let `tunnelspec hostkeys scan` print the lines to use"
        ) from None
    return text


def host_patterns(address: str, port: int) -> list[str]:
    return [address] if port == 22 else [f"[{address}]:{port}"]


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


@functools.lru_cache(maxsize=8)
def parsed_known_hosts(text: str) -> asyncssh.SSHKnownHosts:
    """One parse per known_hosts content per run, not two per host (matching does not modify it)."""
    return asyncssh.import_known_hosts(text)


def match_for(text: str, address: str, port: int) -> tuple:
    """asyncssh's known_hosts match for one host: (host keys, CA keys, revoked keys, x509 …)."""
    if not text.strip():
        return ((), (), (), (), (), (), ())
    return parsed_known_hosts(text).match(address, address, port)


def keys_for(text: str, address: str, port: int) -> list[asyncssh.SSHKey]:
    return list(match_for(text, address, port)[0])


class HostKeyPolicy:
    """Validates keys not matched by asyncssh's own known_hosts check."""

    def __init__(
        self, host_name: str, address: str, port: int, known_text: str, accept_new: bool, pin_path: str | None
    ):
        self.host_name, self.address, self.port = host_name, address, port
        self._text = known_text
        self._match = match_for(known_text, address, port)
        self.known = list(self._match[0])
        self.accept_new = accept_new
        self.pin_path = pin_path
        self.seen_key: asyncssh.SSHKey | None = None
        self.pinned_line: str | None = None

    def asyncssh_known_hosts(self):
        """What asyncssh checks first: the match already made above (each match resolves the address
        again, ≈ 1 ms), unless X.509 entries are involved — then the parsed file, matched by asyncssh."""
        if any(self._match[3:]):
            return parsed_known_hosts(self._text)
        return tuple(tuple(x) for x in self._match[:3])

    def validate(self, key: asyncssh.SSHKey) -> bool:
        self.seen_key = key
        if self.known:
            return False  # a known host presenting another key: never accepted
        if self.accept_new:
            line = f"{','.join(host_patterns(self.address, self.port))} {key.export_public_key().decode().strip()}\n"
            self.pinned_line = line
            if self.pin_path:
                p = Path(self.pin_path).expanduser()
                p.parent.mkdir(parents=True, exist_ok=True)
                with open(p, "a") as f:
                    f.write(line)
            return True
        return False

    def error(self) -> HostKeyError:
        fp = fingerprint(self.seen_key) if self.seen_key else "(none received)"
        where = f"{self.host_name} ({self.address}:{self.port})"
        if self.known:
            pinned = ", ".join(fingerprint(k) for k in self.known)
            return HostKeyError(
                f"{where}: HOST KEY CHANGED. Pinned {pinned}, host presented {fp}. This may be an attack; "
                "if the host was really reinstalled, remove the old line from known_hosts and re-verify."
            )
        into = f"add the line it prints to {self.pin_path}" if self.pin_path else "add its line to known_hosts"
        return HostKeyError(
            f"{where}: unknown host key {fp}. Run `tunnelspec hostkeys scan`, verify the fingerprint out of band, "
            f"then {into}; or pass --accept-new-host-keys to pin it on first use."
        )
