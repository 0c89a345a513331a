"""A large controller file to a host: chunked (a model is gigabytes; one SSH channel per 8 MiB keeps
memory flat), written to `DEST.tunnelspec-upload`, its sha256 checked on the host, then renamed over
DEST. An interrupted or corrupt upload never leaves a half file under the final name, and the
temp file is removed whatever happens."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable

from tunnelspec.core.errors import TaskFailed

CHUNK = 8 * 2**20
SUFFIX = ".tunnelspec-upload"


async def remote_sha256(conn, path: str) -> str | None:
    res = await conn.probe(["sh", "-c", '[ -f "$1" ] || exit 3; sha256sum < "$1"', "sh", path])
    return res.stdout.split()[0] if res.rc == 0 and res.stdout.strip() else None


async def upload_file(
    conn, local: Path, dest: str, sha256: str, mode: int = 0o644, progress: Callable[[str, int], None] | None = None
) -> None:
    tmp = dest + SUFFIX
    await conn.run(["sh", "-c", 'umask 077; mkdir -p -- "$(dirname -- "$1")" && : > "$1"', "sh", tmp], check=True)
    size = max(1, local.stat().st_size)
    sent = 0
    try:
        with local.open("rb") as f:
            for _ in range(size // CHUNK + 2):
                block = f.read(CHUNK)
                if not block:
                    break
                await conn.run(["sh", "-c", 'cat >> "$1"', "sh", tmp], input=block, check=True)
                sent += len(block)
                if progress and size > 4 * CHUNK:
                    progress(f"upload {local.name} {100 * sent // size}%", 100 * sent // size)
        got = await remote_sha256(conn, tmp)
        if got != sha256:
            raise TaskFailed(f"upload of {local} to {dest}: sha256 {got} != {sha256}")
        await conn.run(
            ["sh", "-c", 'chmod "$3" "$1" && mv -f -- "$1" "$2"', "sh", tmp, dest, format(mode, "o")], check=True
        )
    finally:
        await conn.run(["rm", "-f", "--", tmp])
