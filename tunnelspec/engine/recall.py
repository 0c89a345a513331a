"""The facts each host registered in its last run (a source tree's hash, a build's directory, the
server's plan), kept on the controller so that reading ahead (engine/prefetch.py) can name a later
play's probes before this run registers those facts again: on a run that changes nothing they are
the same, and the host is read in one batch instead of one more per play that needs them.

Only a guess, never an answer: a remembered fact names probes and nothing else. Every check renders
its arguments from this run's facts; where a guess was wrong, the probe it named differs from the
one the check asks for, is never served, and the check reads for itself (one read for nothing).

One file per host and inventory file (the host's part in that cluster is what its facts follow),
under the rule of the host facts' cache (components/host/facts_cache.py): best effort, the cache
root is never created, written whole with mode 0600, and anything that is not a record of this
version for this host is no record; records not written for PRUNE_DAYS are removed when another is
written. Kept: the facts that are JSON data with no secret in them (a value the run masks, anywhere
inside, leaves its fact out), over those of earlier runs (a `status` registers fewer than a
deploy); nothing from a `--check` run (its facts are plans).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tunnelspec.core import secrets
from tunnelspec.core.cachedir import cache_root, write_record

RECORD_VERSION = 1
PRUNE_DAYS = 30


def record_path(host: str, ident: tuple[str, ...] | None) -> Path | None:
    root = cache_root()
    if root is None or not ident:
        return None
    name = hashlib.sha256(json.dumps([RECORD_VERSION, host, *ident]).encode()).hexdigest()[:24]
    return Path(root) / "tunnelspec" / "registered" / f"{name}.json"


def load(host: str, ident: tuple[str, ...] | None) -> dict:
    """The facts `host` registered in its last run over this connection ({} when none are kept)."""
    path = record_path(host, ident)
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION or doc.get("host") != host:
        return {}
    facts = doc.get("facts")
    return facts if isinstance(facts, dict) else {}


def _has_secret(value, known: list[str]) -> bool:
    if isinstance(value, secrets.Secret):
        return True
    if isinstance(value, str):
        return any(s and s in value for s in known)
    if isinstance(value, dict):
        return any(_has_secret(k, known) or _has_secret(v, known) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_secret(v, known) for v in value)
    return False


def keepable(facts: dict, known_secrets: list[str]) -> dict:
    """The facts worth keeping: JSON data, no secret inside."""
    out = {}
    for name, value in facts.items():
        if _has_secret(value, known_secrets):
            continue
        try:
            out[name] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue
    return out


def save(host: str, ident: tuple[str, ...] | None, facts: dict, known_secrets: list[str], before: dict) -> None:
    """Keep `facts` over `before` (what was loaded: a fact this run did not register, as a `status`
    registers fewer than a deploy, stays) for the next run; nothing is written when that is what
    was loaded. Best effort: a controller that cannot write its cache only reads more batches next
    time."""
    path = record_path(host, ident)
    kept = {**before, **keepable(facts, [*known_secrets, *secrets.seen()])}
    if path is None or not kept or kept == before:
        return
    write_record(path, json.dumps({"version": RECORD_VERSION, "host": host, "facts": kept}), PRUNE_DAYS)
