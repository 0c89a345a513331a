"""How tunnelspec's own commands (verify, status, bench, logs) reach the deployed API — the front
(HAProxy) on main, in front of llama-server: through the SSH connection to main, as plain HTTP on
loopback, or — public bind — TLS end to end to the front inside SSH, the CA pinned (components/tls/client.py:
no system store, no switch to turn checks off) and the name checked the first of
llama_server_tls_names, the one clients use."""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass, field

from cryptography import x509

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core import http
from tunnelspec.components.tls.ca import RENEW_MARGIN_DAYS, describe
from tunnelspec.components.tls.client import pinned_context, tls_opener


@dataclass(frozen=True)
class ApiTls:
    ca_file: str  # controller path of the pinned CA certificate
    server_name: str  # the name (or address) the certificate must be valid for

    @classmethod
    def of(cls, main) -> ApiTls | None:
        """From cluster.main (None: the API on loopback, plain HTTP)."""
        tls = getattr(main, "tls", None)
        return cls(tls.ca_file, tls.server_name) if tls is not None else None


@dataclass
class Seen:
    """The certificate the last TLS handshake was shown (DER), for status and verify to describe."""

    der: bytes | None = None
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)

    def describe(self, now: dt.datetime | None = None) -> dict | None:
        if self.der is None:
            return None

        cert = x509.load_der_x509_certificate(self.der)
        out = describe(cert)
        now = now or dt.datetime.now(dt.UTC)
        days = (cert.not_valid_after_utc - now).total_seconds() / 86400
        out["days_left"] = int(days)
        out["warning"] = (
            f"certificate ends {cert.not_valid_after_utc:%Y-%m-%d}, within {RENEW_MARGIN_DAYS} days: "
            "deploy renews one tunnelspec issued; renew your own in your PKI"
            if days <= RENEW_MARGIN_DAYS
            else None
        )
        return out


def api_opener(
    conn, port: int, host: str = LOOPBACK, tls: ApiTls | None = None, seen: Seen | None = None
) -> http.Opener:
    """Streams to host:port as seen from main (the front, or llama-server's own loopback port); with
    `tls`, TLS over them."""
    base = http.ssh_opener(conn, port, host)
    if tls is None:
        return base
    box = seen if seen is not None else Seen()

    async def open_():
        if box._ctx is None:  # read once, at the first connection (a missing CA file fails there, by name)
            try:
                box._ctx = pinned_context(ca_file=tls.ca_file)
            except OSError as e:
                raise http.HttpError(
                    f"the CA to pin, {tls.ca_file}, cannot be read ({e.strerror}): deploy creates it"
                ) from None
        reader, writer = await tls_opener(base, box._ctx, tls.server_name)()
        obj = writer.get_extra_info("ssl_object")
        if obj is not None:
            box.der = obj.getpeercert(binary_form=True)
        return reader, writer

    return open_


def summary(tls: ApiTls | None, seen: Seen) -> str:
    """One phrase for verify's message."""
    if tls is None:
        return "plain HTTP on loopback"
    d = seen.describe()
    if d is None:
        return f"TLS (CA {tls.ca_file} pinned, name {tls.server_name})"
    return (
        f"TLS (CA pinned, name {tls.server_name}; certificate ends {d['not_after'][:10]}, "
        f"{d['days_left']} days{'; WARNING ' + d['warning'] if d['warning'] else ''})"
    )
