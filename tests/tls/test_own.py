"""A user's own certificate files: accepted when key, certificate, chain and names agree; otherwise an
error naming the file at fault."""

from __future__ import annotations

import datetime as dt
import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tunnelspec.components.tls import ca as C
from tunnelspec.components.tls.own import load_own

NOW = dt.datetime.now(dt.timezone.utc)


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject_key, cn, issuer_key, issuer_cert, *, ca=False, pathlen=None, sans=(), days=100, start=None):
    pub = subject_key.public_key()
    b = (x509.CertificateBuilder().subject_name(_name(cn))
         .issuer_name(issuer_cert.subject if issuer_cert else _name(cn))
         .public_key(pub).serial_number(x509.random_serial_number())
         .not_valid_before(start or NOW - dt.timedelta(days=1)).not_valid_after((start or NOW) + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=pathlen), critical=True)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
             (issuer_key or subject_key).public_key()), critical=False))
    if ca:
        b = b.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(C.parse_names(sans)), critical=False)
    return b.sign(issuer_key or subject_key, hashes.SHA256())


def pem(*certs):
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def keypem(k, password=None):
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


@pytest.fixture
def pki(tmp_path):
    """A user's PKI: root → intermediate → server (RSA, as many PKIs issue), files written 0600/0644."""
    root_k = ec.generate_private_key(ec.SECP384R1())
    root = _cert(root_k, "Corp Root", None, None, ca=True, pathlen=1)
    mid_k = ec.generate_private_key(ec.SECP256R1())
    mid = _cert(mid_k, "Corp Issuing", root_k, root, ca=True, pathlen=0)
    leaf_k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    leaf = _cert(leaf_k, "llm.corp.example", mid_k, mid, sans=["llm.corp.example", "10.1.2.3"])
    files = {"cert": tmp_path / "server.pem", "key": tmp_path / "server.key", "ca": tmp_path / "corp-root.pem"}
    files["cert"].write_bytes(pem(leaf, mid))
    files["key"].write_bytes(keypem(leaf_k))
    files["key"].chmod(0o600)
    files["ca"].write_bytes(pem(root))
    return {"files": files, "root": (root_k, root), "mid": (mid_k, mid), "leaf": (leaf_k, leaf)}


def test_own_files_accepted(pki):
    f = pki["files"]
    own = load_own(f["cert"], f["key"], f["ca"], ["llm.corp.example", "10.1.2.3"])
    assert own.names == ("llm.corp.example", "10.1.2.3")
    assert own.cert_pem.count("BEGIN CERTIFICATE") == 2 and own.ca_file == f["ca"]
    assert "***" in repr(own) and "PRIVATE" not in repr(own)
    assert load_own(f["cert"], f["key"], f["ca"]).names  # no names asked: the certificate's own


def test_key_of_another_certificate(pki, tmp_path):
    f = pki["files"]
    other = tmp_path / "other.key"
    other.write_bytes(keypem(ec.generate_private_key(ec.SECP256R1())))
    other.chmod(0o600)
    with pytest.raises(C.CertError, match=rf"^{other}: this key does not belong to the certificate in {f['cert']}"):
        load_own(f["cert"], other, f["ca"])


def test_certificate_of_another_ca(pki, tmp_path):
    f = pki["files"]
    stranger = tmp_path / "stranger.pem"
    k = ec.generate_private_key(ec.SECP256R1())
    stranger.write_bytes(pem(_cert(k, "Stranger Root", None, None, ca=True)))
    with pytest.raises(C.CertError, match=rf"^{f['cert']}: does not chain to a CA certificate of {stranger}"):
        load_own(f["cert"], f["key"], stranger)


def test_missing_intermediate(pki):
    f = pki["files"]
    f["cert"].write_bytes(pem(pki["leaf"][1]))
    with pytest.raises(C.CertError, match=rf"^{f['cert']}: does not chain"):
        load_own(f["cert"], f["key"], f["ca"])


def test_name_not_covered(pki):
    f = pki["files"]
    with pytest.raises(C.CertError, match=r"does not cover the name 'main.lan' \(it has: llm.corp.example, 10.1.2.3\)"):
        load_own(f["cert"], f["key"], f["ca"], ["llm.corp.example", "main.lan"])


def test_encrypted_open_and_garbage_keys(pki):
    f = pki["files"]
    f["key"].write_bytes(keypem(pki["leaf"][0], b"pw"))
    with pytest.raises(C.CertError, match=rf"^{f['key']}: the private key is encrypted"):
        load_own(f["cert"], f["key"], f["ca"])
    f["key"].write_bytes(keypem(pki["leaf"][0]))
    os.chmod(f["key"], 0o640)
    with pytest.raises(C.CertError, match=rf"^{f['key']}: permissions 0640 are too open"):
        load_own(f["cert"], f["key"], f["ca"])
    os.chmod(f["key"], 0o600)
    f["ca"].write_text("not a certificate\n")
    with pytest.raises(C.CertError, match=rf"^{f['ca']}: no PEM CA certificate"):
        load_own(f["cert"], f["key"], f["ca"])
    with pytest.raises(C.CertError, match=r"nope\.pem: cannot read"):
        load_own(f["cert"].parent / "nope.pem", f["key"], f["ca"])


def test_expired_certificate(pki):
    f = pki["files"]
    mid_k, mid = pki["mid"]
    leaf_k = pki["leaf"][0]
    old = _cert(leaf_k, "llm.corp.example", mid_k, mid, sans=["llm.corp.example"], days=10,
                start=NOW - dt.timedelta(days=30))
    f["cert"].write_bytes(pem(old, mid))
    with pytest.raises(C.CertError, match=rf"^{f['cert']}: the certificate ended on"):
        load_own(f["cert"], f["key"], f["ca"])


def test_our_own_ca_passes_as_a_user_pki(tmp_path, ca):
    sc = C.issue_server_cert(ca, ["main.test", "192.168.1.9"])
    (tmp_path / "s.crt").write_text(sc.cert_pem)
    (tmp_path / "s.key").write_text(sc.key_pem.reveal())
    (tmp_path / "s.key").chmod(0o600)
    assert load_own(tmp_path / "s.crt", tmp_path / "s.key", ca.cert_file, ["192.168.1.9"]).names == \
        ("main.test", "192.168.1.9")
