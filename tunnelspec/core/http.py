"""A tiny HTTP/1.1 client over an asyncio (reader, writer) stream.

llama-server listens on 127.0.0.1 of the main host only. The controller reaches it through the SSH
connection it already has (`conn.open_connection(LOOPBACK, port)`), so verify, status and bench need
neither curl on the host nor any port exposed. One request per connection (`Connection: close`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable

from tunnelspec.core.constants import LOOPBACK

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
MAX_BODY = 16 * 2**20  # replies here are small JSON documents; a bigger one is a bug or an attack
MAX_HEADER_LINES = 100


class HttpError(Exception):
    """No HTTP answer: refused, closed, timed out or malformed."""


class NoAnswer(HttpError):
    """The request's time ran out before a complete answer came (the server accepted it, or not)."""

    def __init__(self, timeout: float):
        super().__init__(f"no answer within {timeout:g}s")
        self.timeout = timeout


class OutputParserError(HttpError):
    """llama-server generated text and then refused it: an HTTP 500 from its output parser. Some builds
    parse /completion text like chat output (b9093: "Failed to parse input at pos 0"; b10001: "produced
    output that does not match the expected Content-only format"), and fail on text that is not valid
    UTF-8 — a model whose tokens are single bytes, or a real one cut by n_predict mid-character. Not a
    lost connection: asking again does not help."""

    def __init__(self, message: str, server_message: str):
        super().__init__(message)
        self.server_message = server_message


# What those builds' 500s say (matched case-insensitively in the error message).
OUTPUT_PARSER_SIGNS = ("failed to parse input", "does not match the expected", "failed to parse output")


def output_parser_message(status: int, body: bytes) -> str | None:
    """The server's message when a non-200 answer is the output-parser failure, else None."""
    if status != 500:
        return None
    text = body[:2000].decode(errors="replace")
    try:
        err = json.loads(text).get("error")
        msg = str(err.get("message", "")) if isinstance(err, dict) else str(err or "")
    except (ValueError, AttributeError):
        msg = text
    return msg.strip() if any(sign in msg.lower() for sign in OUTPUT_PARSER_SIGNS) else None


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8", errors="replace"))
        except ValueError as e:
            raise HttpError(f"HTTP {self.status}: body is not JSON: {self.body[:200]!r}") from e


def _request_bytes(method: str, path: str, host: str, body: bytes | None, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close", "Accept: application/json"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        for _ in range(1_000_000):  # bounded: a chunk loop ends with a zero-size chunk
            size_line = await reader.readline()
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return bytes(out)
            if len(out) + size > MAX_BODY:
                raise HttpError("response body too large")
            out += await reader.readexactly(size)
            await reader.readexactly(2)
        raise HttpError("too many chunks")
    if "content-length" in headers:
        n = int(headers["content-length"])
        if n > MAX_BODY:
            raise HttpError("response body too large")
        return await reader.readexactly(n)
    data = await reader.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:
        raise HttpError("response body too large")
    return data


async def request(
    opener: Opener,
    method: str,
    path: str,
    payload=None,
    *,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
    host: str = LOOPBACK,
) -> Response:
    """One request; `payload` (if not None) is sent as JSON. Raises HttpError when there is no answer."""
    body = json.dumps(payload).encode() if payload is not None else None

    async def go() -> Response:
        try:
            reader, writer = await opener()
        except Exception as e:  # noqa: BLE001 - refused locally or through SSH (ChannelOpenError)
            raise HttpError(f"cannot connect: {getattr(e, 'reason', None) or e}") from e
        try:
            writer.write(_request_bytes(method, path, host, body, headers or {}))
            await writer.drain()
            status_line = (await reader.readline()).decode("latin-1").strip()
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise HttpError(f"not an HTTP response: {status_line[:100]!r}")
            hdrs: dict[str, str] = {}
            for _ in range(MAX_HEADER_LINES):
                line = (await reader.readline()).decode("latin-1")
                if line in ("\r\n", "\n", ""):
                    break
                k, _, v = line.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            data = await _read_body(reader, hdrs)
            return Response(int(parts[1]), parts[2] if len(parts) > 2 else "", hdrs, data)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as e:
            raise HttpError(f"connection closed mid-response: {e}") from e
        finally:
            try:
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), 2.0)
            except Exception:  # noqa: BLE001 - closing a dead stream may fail in many ways
                pass

    try:
        return await asyncio.wait_for(go(), timeout)
    except TimeoutError:
        raise NoAnswer(timeout) from None


def ssh_opener(conn, port: int, host: str = LOOPBACK) -> Opener:
    """Streams to host:port as seen from the host behind `conn` (SSH or local)."""
    return lambda: conn.open_connection(host, port)


def tcp_opener(port: int, host: str = LOOPBACK) -> Opener:
    return lambda: asyncio.open_connection(host, port)


# Seconds between two reports of a /health wait, and before the first one while no answer came (an
# unhealthy answer is reported at once). A request may be held (the front holds it until llama-server
# is up): the reports go on while it is pending.
HEALTH_REPORT_EVERY = 5.0
HEALTH_FIRST_REPORT = 1.0


async def wait_health(
    opener: Opener,
    deadline_s: float = 120.0,
    interval: float = 0.5,
    *,
    report: Callable[[float, str], Awaitable[None]] | None = None,
    report_every: float = HEALTH_REPORT_EVERY,
    first_report: float = HEALTH_FIRST_REPORT,
) -> Response:
    """Poll /health until 200 (llama-server answers 503 while loading the model). Raises HttpError
    with the last status seen when the deadline passes. `report(elapsed_s, last_answer)` is awaited
    at the first answer that is not 200 (or after `first_report` s without one), then every
    `report_every` seconds while the wait lasts, a request in flight included."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + deadline_s
    last = "no answer yet"
    next_report, reported = first_report, False

    async def maybe_report(unhealthy: bool) -> None:
        nonlocal next_report, reported
        elapsed = loop.time() - start
        if report is None or (elapsed < next_report and (reported or not unhealthy)):
            return
        next_report, reported = (int(elapsed / report_every) + 1) * report_every, True
        await report(elapsed, last)

    for _ in range(int(deadline_s / interval) + 2):
        poll = asyncio.ensure_future(request(opener, "GET", "/health", timeout=min(10.0, max(1.0, end - loop.time()))))
        try:
            while report is not None:
                wait = max(0.0, next_report - (loop.time() - start))
                done, _ = await asyncio.wait({poll}, timeout=wait if wait > 0 else 0.01)
                if done:
                    break
                await maybe_report(False)
            r = await poll
            if r.status == 200:
                return r
            last = f"HTTP {r.status} {r.body[:120].decode(errors='replace').strip()}"
        except HttpError as e:
            last = str(e)
            if getattr(e.__cause__, "permanent", False):
                break  # e.g. TLS: a certificate the pinned CA does not trust; waiting cannot change it
        finally:
            if not poll.done():
                poll.cancel()
        if loop.time() >= end:
            break
        await maybe_report(True)
        await asyncio.sleep(interval)
    raise HttpError(f"/health not ok within {deadline_s:g}s (last: {last})")


async def completion(
    opener: Opener,
    prompt: str,
    n_predict: int = 32,
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
    extra: dict | None = None,
) -> dict:
    """POST /completion, greedy (so a draft equal to the target is always accepted); returns the JSON."""
    payload = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 1,
        "cache_prompt": False,
        "stream": False,
        **(extra or {}),
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = await request(opener, "POST", "/completion", payload, timeout=timeout, headers=headers)
    if r.status != 200:
        text = f"/completion: HTTP {r.status}: {r.body[:300].decode(errors='replace')}"
        parser = output_parser_message(r.status, r.body)
        if parser is not None:
            raise OutputParserError(text, parser)
        raise HttpError(text)
    return r.json()
