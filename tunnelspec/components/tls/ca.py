"""The inventory's own certificate authority on the controller, and the server certificates it issues.

Design (docs/tls.md has the reasons):
- One CA per inventory, in `<inventory dir>/<inventory file name>.tls/` (`ca_dir_for`): `ca.crt`
  (public, what clients pin), `ca.key` (0600, the directory 0700, never printed, never sent to a
  host), `ca.previous.crt` (the certificate of the CA a rotation replaced, for display only; its key
  is deleted by the rotation), a `.gitignore` keeping the keys out of a repository.
- Keys are EC P-256 (ECDSA with SHA-256): accepted by every TLS stack a client may use (OpenSSL 1.1
  and 3 — HAProxy, Python's ssl, curl —, browsers, Go, Java, rustls), where
  Ed25519 certificates are refused by browsers, by many Java and Windows clients and by TLS 1.2.
- The CA key is kept like an SSH private key (unencrypted, 0600): a deploy must issue and renew
  without a prompt, and it trusts the controller's unencrypted SSH key (root on every host) anyway.
  A CA key whose file is readable by others is refused, as ssh refuses such a private key.
- A server key is generated in the controller's memory (a `Secret`) and written only on main.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tunnelspec.core.secrets import Secret
from tunnelspec.components.tls.keyfiles import (
    CertError,
    check_private_file,
    fsync_dir,
    locked,
    prepare_dir,
    write_private,
    write_public,
)
from tunnelspec.cluster.tls_names import ca_dir_for, parse_names  # noqa: F401  (part of this module's API)

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_PREVIOUS = "ca.previous.crt"
NEW = ".new"
CA_DAYS = 3650
SERVER_DAYS = 365
RENEW_MARGIN_DAYS = 30
CLOCK_SKEW = dt.timedelta(minutes=5)  # not_before is back-dated this much: hosts' clocks differ a little


@dataclass(frozen=True)
class CA:
    dir: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey  # in memory only; repr shows nothing of it

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def cert_file(self) -> Path:
        return self.dir / CA_CERT

    def __repr__(self) -> str:
        return f"CA({str(self.dir)!r}, {fingerprint(self.cert)})"


@dataclass(frozen=True)
class ServerCert:
    cert_pem: str
    key_pem: Secret  # PKCS#8 PEM, unencrypted (the front, HAProxy, cannot ask for a passphrase)
    names: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert_pem)


# ---- where ----------------------------------------------------------------------------------------
def _name_text(entry: x509.GeneralName) -> str:
    return str(entry.value)


# ---- the CA ---------------------------------------------------------------------------------------
def _new_ca(label: str, now: dt.datetime, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tunnelspec"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"tunnelspec CA {label} {now:%Y-%m-%d %H:%M:%S}"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load_pair(key_path: Path, cert_path: Path) -> CA:
    check_private_file(key_path)
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise CertError(f"not an unencrypted PEM private key ({e})", key_path) from None
    cert = load_cert(cert_path)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not same_public(key, cert):
        raise CertError(f"does not belong to the CA certificate {cert_path}", key_path)
    return CA(cert_path.parent, cert, key)


def same_public(key, cert: x509.Certificate) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def _recover(d: Path) -> None:
    """Finish or drop a rotation that a crash interrupted (rotate_ca's steps, in order: write both
    `.new` files; copy the old certificate to ca.previous.crt; rename the key; rename the cert)."""
    key_new, cert_new = d / (CA_KEY + NEW), d / (CA_CERT + NEW)
    if key_new.exists() and not cert_new.exists():
        key_new.unlink()  # died while writing the new pair: no rotation happened
    elif cert_new.exists():
        if key_new.exists():
            os.replace(key_new, d / CA_KEY)  # both written: roll forward
        os.replace(cert_new, d / CA_CERT)  # key already renamed: finish
        fsync_dir(d)


def load_ca(d: str | os.PathLike) -> CA:
    d = Path(d)
    with locked(d):
        _recover(d)
        return _load_pair(d / CA_KEY, d / CA_CERT)


def ensure_ca(
    d: str | os.PathLike, *, label: str | None = None, now: dt.datetime | None = None, days: int = CA_DAYS
) -> tuple[CA, bool]:
    """The CA in `d`, created when there is none. Returns (ca, created). Idempotent: an existing CA is
    loaded and checked (key 0600 and matching the certificate), never replaced — clients pinned it.
    Half a CA (a key without its certificate or the reverse) is an error, not a reason to make a new one."""
    d = Path(d)
    now = now or dt.datetime.now(dt.UTC)
    prepare_dir(d)
    with locked(d):
        _recover(d)
        key_path, cert_path = d / CA_KEY, d / CA_CERT
        if key_path.exists() or cert_path.exists():
            if not (key_path.exists() and cert_path.exists()):
                have, lacks = (key_path, cert_path) if key_path.exists() else (cert_path, key_path)
                raise CertError(
                    f"{have.name} is there but {lacks.name} is missing: restore it, or "
                    "remove the directory for a new CA (clients must then pin the new ca.crt)",
                    d,
                )
            return _load_pair(key_path, cert_path), False
        key, cert = _new_ca(label or d.name.removesuffix(".tls"), now, days)
        write_private(key_path, _key_pem(key))
        write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        fsync_dir(d)
        return CA(d, cert, key), True


def rotate_ca(d: str | os.PathLike, *, now: dt.datetime | None = None, days: int = CA_DAYS) -> CA:
    """A new CA in place of the current one. The old key is deleted at once (nothing may be signed by
    it again; the server is re-issued under the new CA and clients switch to the new ca.crt: a hard
    cut, no overlap); the old certificate is kept as ca.previous.crt for display only."""
    d = Path(d)
    now = now or dt.datetime.now(dt.UTC)
    prepare_dir(d)
    with locked(d):
        _recover(d)
        old = d / CA_CERT
        old_pem = old.read_bytes() if old.exists() else None
        key, cert = _new_ca(d.name.removesuffix(".tls"), now, days)
        for n in (CA_KEY + NEW, CA_CERT + NEW):
            (d / n).unlink(missing_ok=True)
        write_private(d / (CA_KEY + NEW), _key_pem(key))
        write_public(d / (CA_CERT + NEW), cert.public_bytes(serialization.Encoding.PEM))
        fsync_dir(d)
        if old_pem is not None:
            write_public(d / CA_PREVIOUS, old_pem)
        os.replace(d / (CA_KEY + NEW), d / CA_KEY)
        os.replace(d / (CA_CERT + NEW), d / CA_CERT)
        fsync_dir(d)
        return CA(d, cert, key)


# ---- server certificates ---------------------------------------------------------------------------
def issue_server_cert(ca: CA, names, days: int = SERVER_DAYS, *, now: dt.datetime | None = None) -> ServerCert:
    """A new key (P-256, in memory) and a certificate for `names` (DNS names and addresses, the first
    one also the subject's CN), signed by `ca`, valid `days` from now (never past the CA's own end)."""
    sans = parse_names(names)
    now = now or dt.datetime.now(dt.UTC)
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _name_text(sans[0])[:64])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return ServerCert(
        cert.public_bytes(serialization.Encoding.PEM).decode(),
        Secret(_key_pem(key).decode()),
        tuple(_name_text(s) for s in sans),
    )


# ---- reading and judging certificates ---------------------------------------------------------------
def load_cert(path: str | os.PathLike) -> x509.Certificate:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CertError(f"cannot read: {e.strerror}", path) from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise CertError(f"not a PEM certificate ({e})", path) from None


def _as_cert(cert) -> x509.Certificate:
    if isinstance(cert, x509.Certificate):
        return cert
    if isinstance(cert, str):
        cert = cert.encode()
    return x509.load_pem_x509_certificate(cert)


def fingerprint(cert) -> str:
    """SHA256 of the DER certificate, colon-separated upper-case hex (as `openssl x509 -fingerprint
    -sha256` prints it)."""
    digest = _as_cert(cert).fingerprint(hashes.SHA256())
    return "SHA256:" + ":".join(f"{b:02X}" for b in digest)


def needs_renewal(cert_pem, now: dt.datetime | None = None, margin_days: int = RENEW_MARGIN_DAYS) -> bool:
    """True when the certificate ends within `margin_days` of `now` (or has ended, or is not yet valid)."""
    cert = _as_cert(cert_pem)
    now = now or dt.datetime.now(dt.UTC)
    return cert.not_valid_after_utc - now <= dt.timedelta(days=margin_days) or cert.not_valid_before_utc > now


def issued_by(cert_pem, ca: CA | x509.Certificate) -> bool:
    """Whether `cert_pem` was signed by this CA (a certificate of a rotated-away CA is not)."""
    issuer = ca.cert if isinstance(ca, CA) else ca
    try:
        _as_cert(cert_pem).verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


def cert_names(cert_pem) -> tuple[str, ...]:
    try:
        san = _as_cert(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple(_name_text(n) for n in san)


def covers(cert_pem, names) -> bool:
    """Whether the certificate's SANs are exactly the ones `names` asks for (a changed
    llama_server_tls_names re-issues)."""
    return set(cert_names(cert_pem)) == {_name_text(s) for s in parse_names(names)}


def needs_issue(
    cert_pem: str | None, ca: CA, names, now: dt.datetime | None = None, margin_days: int = RENEW_MARGIN_DAYS
) -> str | None:
    """Why main's certificate must be (re-)issued, or None when it may stay: the deploy's decision."""
    if not cert_pem:
        return "no certificate on main"
    try:
        cert = _as_cert(cert_pem)
    except ValueError:
        return "the certificate on main is not a PEM certificate"
    if not issued_by(cert, ca):
        return "issued by another CA (rotated)"
    if not covers(cert, names):
        return f"names changed: {', '.join(cert_names(cert))} → {', '.join(_name_text(s) for s in parse_names(names))}"
    if needs_renewal(cert, now, margin_days):
        return f"ends {cert.not_valid_after_utc:%Y-%m-%d}, within {margin_days} days"
    return None


def describe(cert) -> dict:
    """What may be shown about a certificate (never a key)."""
    c = _as_cert(cert)
    return {
        "subject": c.subject.rfc4514_string(),
        "issuer": c.issuer.rfc4514_string(),
        "names": list(cert_names(c)),
        "not_before": c.not_valid_before_utc.isoformat(),
        "not_after": c.not_valid_after_utc.isoformat(),
        "sha256": fingerprint(c),
        "serial": f"{c.serial_number:x}",
    }


def sha256_file(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
