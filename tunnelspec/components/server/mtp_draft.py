"""spec_type=draft-mtp: is llama_draft_model an MTP head of llama_model? Not a task of its own: the
llama_server_plan task asks, on main, before the llama-server unit is written — a draft that would
make llama-server exit or abort at every start (a restart loop) is refused there, naming the build
(llama/speculative.py `mtp_draft_refusal`, which says what was read in b11434 and tried for real).
Read-only: the two GGUF headers, read with `head -c` on main."""

from __future__ import annotations

import base64
import shlex

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import gguf_header, speculative

# The metadata and the tensor infos: 1 MiB holds them for a small vocabulary; a 150k-token list takes
# a few MiB, read only when the first read was cut.
HEADER_BYTES = (2**20, 16 * 2**20)


async def read_header(conn, path: str) -> gguf_header.Header | str:
    """The GGUF header of `path` on the host, or why it could not be read."""
    q = shlex.quote(path)
    h: gguf_header.Header | str = f"{path}: nothing read"
    for n in HEADER_BYTES:
        res = await conn.probe(["sh", "-c", f"stat -L -c %s {q} && head -c {n} {q} | base64 -w0"], timeout=120)
        if res.rc != 0:
            return f"cannot read {path}: {res.stderr.strip()[:200]}"
        size_line, _, b64 = res.stdout.partition("\n")
        try:
            h = gguf_header.parse(base64.b64decode(b64))
        except ValueError as e:
            return f"{path}: {e}"
        if h.tensors is not None or int(size_line) <= n:
            break
    return h


async def check_mtp_draft(conn, target_path: str, draft_path: str, build: str) -> list[str]:
    """Warnings (the draft serves, badly), or TaskFailed with the reason it cannot serve. A header
    that cannot be read is a warning: llama-server itself will say more."""
    target, draft = await read_header(conn, target_path), await read_header(conn, draft_path)
    unread = [h for h in (target, draft) if isinstance(h, str)]
    if unread:
        return [f"draft-mtp draft not checked: {'; '.join(unread)}"]
    why = speculative.mtp_draft_refusal(target, draft, build, target_path, draft_path)
    if why:
        raise TaskFailed(why)
    return speculative.mtp_draft_warnings(target, draft, draft_path)
