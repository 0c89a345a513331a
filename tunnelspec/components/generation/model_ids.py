"""A generation's models by identity (docs/generations.md, "Models"): per file llama-server loads on
main, its size, mtime and the sha256 of its header (the key/value metadata and the tensor infos:
every byte before the tensor data, llama/gguf_header.py computes it on the host), next to the whole
file's sha256 model_proof kept. A return to a generation whose model at the same path is another
file — its size or its header differs — is refused before anything changes: the generation would
serve a model it never verified. A changed mtime alone (same size, same header) is a touch, not a
swap: a warning. Pure: the record's entries, the comparison and the wording; generation_pick reads
the live files (tasks.py).

Records from before these entries (the sha256 alone, `model_sha256`) carry none: a return to them
warns as it always did (restore.py)."""

from __future__ import annotations

import posixpath

from tunnelspec.cluster.hub_ref import is_hub_ref
from tunnelspec.components.generation.record import SHA256

KEY = "model_files"  # the record's key: {path on main: entry}
HUB, UPLOAD, IN_PLACE = "hub", "upload", ""


def placed_by(src: str, path: str) -> str:
    """How the model at `path` came there: HUB (tunnelspec downloaded it from `src`, an hf:// reference),
    UPLOAD (tunnelspec uploaded `src`, a controller file), IN_PLACE (the inventory names it on the host;
    a split GGUF's other parts lie next to it)."""
    if is_hub_ref(src):
        return HUB
    if src.startswith("/") and posixpath.dirname(src) == posixpath.dirname(path):
        return IN_PLACE
    return UPLOAD if src else IN_PLACE


def entry(proof: dict, src: str = "", path: str = "") -> dict | None:
    """A record's entry for one file from its proof line (gguf_header.inspect); None when the proof
    holds no identity (the file could not be read, its header does not parse)."""
    ident = proof.get("id")
    if not (isinstance(ident, list) and len(ident) == 3 and all(_is_int(x) for x in ident)):
        return None
    header = proof.get("header_sha256")
    if not isinstance(header, str) or not SHA256.fullmatch(header):
        return None
    return {
        "size": ident[0],
        "mtime_ns": ident[1],
        "header_sha256": header,
        "sha256": _sha256_or_none(proof.get("sha256")),
        "src": src,
        "placed": placed_by(src, path or str(proof.get("path") or "")),
    }


def entries(proofs: dict[str, dict], sources: dict[str, str]) -> dict[str, dict]:
    """{path: entry} of every file with an identity; `sources`: path → the inventory's setting."""
    out = {}
    for path, proof in sorted(proofs.items()):
        got = entry(proof, sources.get(path, ""), path)
        if got is not None:
            out[path] = got
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _sha256_or_none(x) -> str | None:
    return x if isinstance(x, str) and SHA256.fullmatch(x) else None


def recorded(record: dict) -> dict[str, dict]:
    """The record's well-formed entries (a record is data: an entry of another shape is not compared,
    as if the generation predated them)."""
    got = record.get(KEY) if isinstance(record, dict) else None
    if not isinstance(got, dict):
        return {}
    out = {}
    for path, e in got.items():
        if not (isinstance(path, str) and path.startswith("/") and isinstance(e, dict)):
            continue
        if not (_is_int(e.get("size")) and _is_int(e.get("mtime_ns"))):
            continue
        if not (isinstance(e.get("header_sha256"), str) and SHA256.fullmatch(e["header_sha256"])):
            continue
        out[path] = {
            "size": e["size"],
            "mtime_ns": e["mtime_ns"],
            "header_sha256": e["header_sha256"],
            "sha256": _sha256_or_none(e.get("sha256")),
            "src": e.get("src") if isinstance(e.get("src"), str) else "",
            "placed": e.get("placed") if e.get("placed") in (HUB, UPLOAD) else IN_PLACE,
        }
    return out


def changes(want: dict, proof: dict | None) -> tuple[list[str], bool]:
    """What differs between a recorded entry and the live file's proof line: (phrases, touched).
    Phrases name a different file (a refusal); `touched` alone means its mtime changed with its size
    and header the same (a warning)."""
    if not proof or not _is_int(proof.get("size")):
        why = str((proof or {}).get("error") or "no proof of it")
        return [f"it is gone ({why})"], False
    out = []
    if proof["size"] != want["size"]:
        out.append(f"size {want['size']} → {proof['size']}")
    header = proof.get("header_sha256")
    if not isinstance(header, str):
        out.append(f"its header does not parse ({proof.get('error') or 'no header digest'})")
    elif header != want["header_sha256"]:
        out.append("header digest differs")
    sha = proof.get("sha256")
    if not out and want["sha256"] and isinstance(sha, str) and sha != want["sha256"]:
        out.append(f"sha256 {want['sha256'][:12]} → {sha[:12]}")
    ident = proof.get("id")
    mtime = ident[1] if isinstance(ident, list) and len(ident) == 3 else None
    return out, not out and mtime != want["mtime_ns"]


def how_back(want: dict, n) -> str:
    """What puts the generation's model back, by who placed it (a return itself never downloads)."""
    src = want["src"]
    if want["placed"] == HUB:
        return (
            f"tunnelspec downloaded it from {src}: a deploy naming that reference downloads it again, "
            f"checked against the Hub's sha256, and with the rest of generation {n}'s inventory makes "
            f"generation {n} current again (a rollback never downloads)"
        )
    if want["placed"] == UPLOAD:
        sha = f" (sha256 {want['sha256'][:12]})" if want["sha256"] else ""
        return (
            f"tunnelspec uploaded it from {src} on the controller{sha}: a deploy naming that file "
            f"uploads it again, and with the rest of generation {n}'s inventory makes generation {n} "
            "current again (a rollback never uploads)"
        )
    return f"put the file generation {n} served back at its path"


def verdict(record: dict, proofs: dict[str, dict], host: str) -> tuple[str | None, list[str]]:
    """Returning to `record` on `host` (main), with `proofs` the live files' proof lines: (the refusal,
    None when none; the warnings)."""
    n = record.get("n")
    refused, warnings = [], []
    for path, want in sorted(recorded(record).items()):
        diff, touched = changes(want, proofs.get(path))
        if diff:
            refused.append(
                f"{host}: model {path} is not the file generation {n} served ({', '.join(diff)}); {how_back(want, n)}"
            )
        elif touched:
            warnings.append(
                f"{host}: model {path} has another mtime than when generation {n} recorded it, with the "
                "same size and header digest (a touch, not a swap): served as it is"
            )
    if not refused:
        return None, warnings
    return (
        f"refusing to return to generation {n}: " + "; ".join(refused) + " (nothing was changed; pick another "
        "generation — `tunnelspec status` lists them — or bring the file back first)",
        warnings,
    )
