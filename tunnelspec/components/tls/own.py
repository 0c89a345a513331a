"""A user's own certificate (from their PKI) instead of the inventory's CA: checked on the controller
before anything is sent to main, with errors that name the file at fault."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509 import verification as v

from tunnelspec.core.secrets import Secret
from tunnelspec.components.tls.ca import CertError, same_public, cert_names, check_private_file, parse_names


@dataclass(frozen=True)
class OwnCert:
    cert_pem: str  # the server certificate followed by any intermediates (what the front serves)
    key_pem: Secret  # unencrypted PEM, as the front (HAProxy) reads it
    ca_pem: str  # what clients pin
    ca_file: Path
    names: tuple[str, ...]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CertError(f"cannot read: {e.strerror}", path) from None


def _certs(path: Path, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(_read(path))
    except ValueError as e:
        raise CertError(f"no PEM {what} in it ({e})", path) from None
    return certs


def load_own(cert_file, key_file, ca_file, names=(), *, now: dt.datetime | None = None) -> OwnCert:
    """Check a user's cert/key/CA files: the key is an unencrypted private key of a usable type that
    only its owner may read, it belongs to the (first) certificate, that certificate chains through
    any following ones to a certificate of `ca_file`, is valid now, and covers every name in `names`
    (the names clients use; empty: the certificate's own)."""
    cert_file, key_file, ca_file = (Path(os.path.expanduser(str(p))) for p in (cert_file, key_file, ca_file))
    now = now or dt.datetime.now(dt.UTC)
    chain = _certs(cert_file, "certificate")
    roots = _certs(ca_file, "CA certificate")
    check_private_file(key_file)
    key_data = _read(key_file)
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        raise CertError(
            "the private key is encrypted: the front (HAProxy) cannot ask for a passphrase; "
            "give an unencrypted key (mode 0600)",
            key_file,
        ) from None
    except ValueError as e:
        raise CertError(f"not a PEM private key ({e})", key_file) from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey, ed25519.Ed25519PrivateKey)):
        raise CertError(f"{type(key).__name__}: use an EC (P-256), RSA or Ed25519 key", key_file)
    leaf, intermediates = chain[0], chain[1:]
    if not same_public(key, leaf):
        raise CertError(
            f"this key does not belong to the certificate in {cert_file} "
            "(the first certificate of that file must be the server's)",
            key_file,
        )
    if leaf.not_valid_after_utc <= now:
        raise CertError(f"the certificate ended on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC", cert_file)
    if leaf.not_valid_before_utc > now:
        raise CertError(
            f"the certificate is not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC", cert_file
        )
    own = cert_names(leaf)
    if not own:
        raise CertError("the certificate has no subjectAltName: clients check names only there", cert_file)
    wanted = [str(s.value) for s in parse_names(names)] if names else [own[0]]
    builder = (
        v.PolicyBuilder()
        .store(v.Store(roots))
        .time(now)
        .extension_policies(ca_policy=v.ExtensionPolicy.webpki_defaults_ca(), ee_policy=_EE_POLICY)
    )
    for i, name in enumerate(wanted):
        subject = _subject(name)
        try:
            builder.build_server_verifier(subject).verify(leaf, intermediates)
        except v.VerificationError as e:
            if i == 0 and name == own[0]:
                raise CertError(f"does not chain to a CA certificate of {ca_file}: {e}", cert_file) from None
            if name not in own:
                raise CertError(f"does not cover the name {name!r} (it has: {', '.join(own)})", cert_file) from None
            raise CertError(f"does not chain to a CA certificate of {ca_file} for {name!r}: {e}", cert_file) from None
    return OwnCert(
        b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain).decode(),
        Secret(key_data.decode()),
        _read(ca_file).decode(),
        ca_file,
        tuple(own),
    )


# The issuing CAs must be real CAs (web PKI rules for them: basicConstraints, keyCertSign); the server
# certificate itself may carry whatever extensions a private PKI adds, as long as it has a SAN.
_EE_POLICY = v.ExtensionPolicy.permit_all().require_present(x509.SubjectAlternativeName, v.Criticality.AGNOSTIC, None)


def _subject(name: str):
    try:
        return v.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return v.DNSName(name)
