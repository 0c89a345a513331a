"""TLS for tunnelspec's own HTTP client (verify, status, bench, logs), pinned to one CA.

`tls_opener(opener, ...)` wraps any asyncio-like (reader, writer) pair — a TCP stream, an asyncssh
channel from `conn.open_connection(host, port)` — with Python's ssl through ssl.MemoryBIO and
SSLObject, so the TLS session runs end to end from the controller to the front (HAProxy on main,
where TLS terminates) even when the bytes travel inside SSH. `tcp_tls_opener` is the same for a direct TCP connection (asyncio's own TLS).

Both verify against the pinned CA only: no system trust store (load_default_certs is never called,
SSL_CERT_FILE/SSL_CERT_DIR are never read), certificate and name always checked, TLS 1.2 at least,
and no switch to turn any of it off. The name checked (`server_name`) is the one clients use — one of
llama_server_tls_names —, independent of the address the stream is opened to (127.0.0.1 through SSH).
Either opener returns a pair that `tunnelspec.core.http.request` uses unchanged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from pathlib import Path

from tunnelspec.core.http import Opener

CHUNK = 65536
# A plain-HTTP server may never answer a ClientHello (llama-server's cpp-httplib waits for a request
# line that never comes, up to --timeout, 600 s): the handshake needs its own limit, shorter than a
# request's, so that the error says what happened instead of "no answer".
HANDSHAKE_TIMEOUT = 8.0


class TlsError(ConnectionError):
    """The TLS session could not be set up (certificate, name, or the peer does not speak TLS)."""

    # Asking again cannot help (a certificate the pinned CA does not trust, or for another name):
    # pollers such as http.wait_health stop at once instead of waiting out their deadline.
    permanent = False


class TlsRejected(TlsError):
    """The server's certificate was refused: not trusted by the pinned CA, or not for the name."""

    permanent = True


def pinned_context(ca_pem: str | None = None, *, ca_file: str | Path | None = None) -> ssl.SSLContext:
    """A client context that trusts exactly the CA certificate(s) given, nothing else."""
    if (ca_pem is None) == (ca_file is None):
        raise ValueError("give the pinned CA as ca_pem or ca_file (one of them)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname=True, CERT_REQUIRED, empty trust store
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        ca_pem = Path(ca_file).read_text()
    try:
        ctx.load_verify_locations(cadata=ca_pem)
    except (ValueError, ssl.SSLError) as e:
        raise ValueError(f"no CA certificate to pin in {ca_file or 'the PEM text'}: {e}") from None
    if not ctx.get_ca_certs():
        raise ValueError(f"no CA certificate to pin in {ca_file or 'the PEM text'}")
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    return ctx


def _explain(e: BaseException, server_name: str) -> TlsError:
    if isinstance(e, ssl.SSLCertVerificationError):
        why = e.verify_message or str(e)
        if "Hostname mismatch" in why or "IP address mismatch" in why:
            return TlsRejected(f"TLS: the server's certificate is not valid for {server_name!r} ({why})")
        return TlsRejected(f"TLS: the server's certificate is not trusted by the pinned CA ({why})")
    if isinstance(e, ssl.SSLError):
        reason = getattr(e, "reason", None) or ""
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"):
            return TlsError(f"TLS: the server does not speak TLS (plain HTTP?): {reason}")
        return TlsError(f"TLS handshake with {server_name!r} failed: {reason or e}")
    if isinstance(e, (EOFError, asyncio.IncompleteReadError)):
        return TlsError(f"TLS: {server_name!r} closed the connection during the handshake (plain HTTP?)")
    return TlsError(f"TLS handshake with {server_name!r} failed: {e}")


class _TlsWriter:
    """The writer half: plaintext in, TLS records out to the underlying writer."""

    def __init__(self, obj: ssl.SSLObject, outgoing: ssl.MemoryBIO, raw_writer, pump: asyncio.Task):
        self._obj, self._out, self._raw, self._pump = obj, outgoing, raw_writer, pump
        self._closed = False

    def _flush(self) -> None:
        data = self._out.read()
        if data:
            self._raw.write(data)

    def write(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionError("TLS stream closed")
        view = memoryview(data)
        while view:
            n = self._obj.write(view[:CHUNK])
            view = view[n:]
            self._flush()

    async def drain(self) -> None:
        await self._raw.drain()

    def get_extra_info(self, name, default=None):
        if name == "ssl_object":
            return self._obj
        if name == "peercert":
            return self._obj.getpeercert()
        return self._raw.get_extra_info(name, default)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._obj.unwrap()  # close_notify; the peer's answer is not awaited
        except ssl.SSLError:
            pass
        try:
            self._flush()
        except Exception:  # noqa: BLE001 - the transport may be gone already
            pass
        self._pump.cancel()
        self._raw.close()

    def is_closing(self) -> bool:
        return self._closed

    async def wait_closed(self) -> None:
        try:
            await self._raw.wait_closed()
        finally:
            try:
                await self._pump
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - its failure was reported to the reader
                pass


async def _handshake(obj: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, reader, writer) -> None:
    for _ in range(10_000):  # a handshake is a few round trips; bounded all the same
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            data = outgoing.read()
            if data:
                writer.write(data)
                await writer.drain()
            chunk = await reader.read(CHUNK)
            if chunk:
                incoming.write(chunk)
            else:
                incoming.write_eof()
    data = outgoing.read()  # TLS 1.3: the client's Finished
    if data:
        writer.write(data)
        await writer.drain()


async def _pump(
    obj: ssl.SSLObject,
    incoming: ssl.MemoryBIO,
    raw_reader,
    out: asyncio.StreamReader,
    raw_writer,
    outgoing: ssl.MemoryBIO,
) -> None:
    """Raw TLS records → plaintext into `out` until the peer's close_notify or EOF."""
    try:
        while True:
            chunk = await raw_reader.read(CHUNK)
            if chunk:
                incoming.write(chunk)
            else:
                incoming.write_eof()
            while True:
                try:
                    data = obj.read(CHUNK)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:  # close_notify
                    out.feed_eof()
                    return
                except ssl.SSLEOFError:
                    # EOF without close_notify: reported as EOF (ssl's suppress_ragged_eofs default);
                    # the HTTP client's framing (Content-Length, chunked) still detects a truncated body.
                    out.feed_eof()
                    return
                if not data:
                    out.feed_eof()
                    return
                out.feed_data(data)
            pending = outgoing.read()  # e.g. a KeyUpdate answer
            if pending:
                raw_writer.write(pending)
            if not chunk:
                out.feed_eof()
                return
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - handed to the reader, which raises it at the next read
        out.set_exception(e if isinstance(e, ConnectionError) else ConnectionError(f"TLS: {e}"))


async def wrap_stream(
    reader, writer, ctx: ssl.SSLContext, server_name: str, timeout: float = HANDSHAKE_TIMEOUT
) -> tuple[asyncio.StreamReader, _TlsWriter]:
    """TLS over an established (reader, writer) pair; the handshake checks certificate and name.
    Raises TlsError (the raw stream is then closed)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname=_sni(server_name))
    try:
        await asyncio.wait_for(_handshake(obj, incoming, outgoing, reader, writer), timeout)
    except TimeoutError:
        writer.close()
        raise TlsError(
            f"TLS: no handshake with {server_name!r} within {timeout:g}s "
            "(a plain-HTTP server waits silently; or the server is overloaded)"
        ) from None
    except (ssl.SSLError, EOFError, ConnectionError, OSError) as e:
        writer.close()
        raise _explain(e, server_name) from e
    out = asyncio.StreamReader(limit=2**20)
    pump = asyncio.ensure_future(_pump(obj, incoming, reader, out, writer, outgoing))
    return out, _TlsWriter(obj, outgoing, writer, pump)


def _sni(server_name: str) -> str:
    name = server_name[1:-1] if server_name.startswith("[") and server_name.endswith("]") else server_name
    try:
        return str(ipaddress.ip_address(name))  # ssl checks an address against IP SANs (and sends no SNI)
    except ValueError:
        return name


def tls_opener(opener: Opener, ctx: ssl.SSLContext, server_name: str, timeout: float = HANDSHAKE_TIMEOUT) -> Opener:
    """An Opener speaking TLS over the streams `opener` gives (e.g. http.ssh_opener(conn, port))."""

    async def open_():
        reader, writer = await opener()
        return await wrap_stream(reader, writer, ctx, server_name, timeout)

    return open_


def tcp_tls_opener(
    host: str, port: int, ctx: ssl.SSLContext, server_name: str | None = None, timeout: float = HANDSHAKE_TIMEOUT
) -> Opener:
    """An Opener for a direct TCP connection with asyncio's own TLS; `server_name` defaults to `host`."""
    name = server_name or host

    async def open_():
        try:
            return await asyncio.open_connection(
                host, port, ssl=ctx, server_hostname=_sni(name), ssl_handshake_timeout=timeout
            )
        except (ssl.SSLError, EOFError) as e:
            raise _explain(e, name) from e
        except (TimeoutError, ConnectionAbortedError):  # asyncio: "SSL handshake is taking longer…"
            raise TlsError(
                f"TLS: no handshake with {name!r} within {timeout:g}s "
                "(a plain-HTTP server waits silently; or the server is overloaded)"
            ) from None
        except ConnectionResetError as e:  # a plain server that drops the ClientHello
            raise TlsError(f"TLS: {host}:{port} reset the connection during the handshake (plain HTTP?)") from e

    return open_
