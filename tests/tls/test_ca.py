"""The inventory's CA on the controller: files and permissions, idempotence, SANs, renewal, rotation."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import stat
import subprocess

import pytest
from cryptography import x509

from tunnelspec.components.tls import ca as C

NOW = dt.datetime(2027, 3, 1, 12, 0, tzinfo=dt.timezone.utc)


def mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_ca_dir_is_derived_from_the_inventory_path(tmp_path):
    assert C.ca_dir_for(tmp_path / "prod.ini") == tmp_path / "prod.ini.tls"
    assert C.ca_dir_for(tmp_path / "prod.yml") != C.ca_dir_for(tmp_path / "prod.ini")
    rel = C.ca_dir_for("lab/inventory.ini")
    assert rel.is_absolute() and rel.name == "inventory.ini.tls"


def test_ensure_ca_creates_once_with_private_permissions(tmp_path):
    d = tmp_path / "inv.ini.tls"
    ca, created = C.ensure_ca(d)
    assert created
    assert mode(d) == 0o700 and mode(d / "ca.key") == 0o600 and mode(d / "ca.crt") == 0o644
    assert "*.key" in (d / ".gitignore").read_text()
    key_bytes, cert_bytes = (d / "ca.key").read_bytes(), (d / "ca.crt").read_bytes()
    again, created2 = C.ensure_ca(d)
    assert not created2 and again.cert == ca.cert
    assert (d / "ca.key").read_bytes() == key_bytes and (d / "ca.crt").read_bytes() == cert_bytes
    bc = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    assert ca.cert.public_key().curve.name == "secp256r1"
    # never shown: repr of the CA and of a server certificate carry no key material
    sc = C.issue_server_cert(ca, ["main.test"])
    key_text = (d / "ca.key").read_text()
    for shown in (repr(ca), str(ca), repr(sc)):
        assert "PRIVATE KEY" not in shown and key_text not in shown
    assert "***" in repr(sc)


def test_open_or_foreign_ca_key_is_refused_naming_the_file(tmp_path):
    d = tmp_path / "inv.ini.tls"
    C.ensure_ca(d)
    os.chmod(d / "ca.key", 0o644)
    with pytest.raises(C.CertError, match=r"ca\.key.*0644 are too open"):
        C.ensure_ca(d)
    os.chmod(d / "ca.key", 0o600)
    C.load_ca(d)
    (d / "ca.key").unlink()
    with pytest.raises(C.CertError, match="ca.crt is there but ca.key is missing"):
        C.ensure_ca(d)


def test_mismatched_ca_key_is_refused(tmp_path):
    a, b = tmp_path / "a.tls", tmp_path / "b.tls"
    C.ensure_ca(a)
    C.ensure_ca(b)
    shutil.copy(b / "ca.key", a / "ca.key")
    with pytest.raises(C.CertError, match="does not belong to the CA certificate"):
        C.load_ca(a)


def test_sans_dns_and_addresses_parsed(ca):
    sc = C.issue_server_cert(ca, ["Main.Example.", "10.0.0.5", "[fe80::1]", "2001:db8::7", "main.example",
                                  "10.0.0.5", "llama-1"], now=NOW)
    cert = x509.load_pem_x509_certificate(sc.cert_pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["main.example", "llama-1"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5"),
                                                       ipaddress.ip_address("fe80::1"),
                                                       ipaddress.ip_address("2001:db8::7")]
    assert sc.names == ("main.example", "10.0.0.5", "fe80::1", "2001:db8::7", "llama-1")
    assert cert.subject.rfc4514_string() == "CN=main.example"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert C.issued_by(sc.cert_pem, ca) and C.covers(sc.cert_pem, ["main.example", "10.0.0.5", "fe80::1",
                                                                   "2001:db8::7", "llama-1"])


@pytest.mark.parametrize("bad", ["", "*.example.com", "bad_name", "-x.example", "mäin.example", "a..b",
                                 "x" * 64 + ".example"])
def test_bad_names_refused(ca, bad):
    with pytest.raises(ValueError):
        C.issue_server_cert(ca, [bad])


def test_renewal_margin(ca):
    short = C.issue_server_cert(ca, ["main.test"], days=10, now=NOW)
    long = C.issue_server_cert(ca, ["main.test"], days=365, now=NOW)
    assert C.needs_renewal(short.cert_pem, NOW)
    assert not C.needs_renewal(long.cert_pem, NOW)
    assert not C.needs_renewal(long.cert_pem, NOW + dt.timedelta(days=334))
    assert C.needs_renewal(long.cert_pem, NOW + dt.timedelta(days=336))
    assert C.needs_renewal(long.cert_pem, NOW + dt.timedelta(days=400))  # ended
    assert C.needs_renewal(long.cert_pem, NOW - dt.timedelta(days=1))    # not yet valid
    assert C.needs_renewal(long.cert_pem, NOW + dt.timedelta(days=300), margin_days=90)


def test_server_cert_never_outlives_the_ca(tmp_path):
    ca, _ = C.ensure_ca(tmp_path / "x.tls", now=NOW, days=20)
    sc = C.issue_server_cert(ca, ["main.test"], days=365, now=NOW)
    assert x509.load_pem_x509_certificate(sc.cert_pem.encode()).not_valid_after_utc == ca.cert.not_valid_after_utc


def test_needs_issue_reasons(ca, other_ca):
    names = ["main.test", "10.0.0.5"]
    sc = C.issue_server_cert(ca, names, now=NOW)
    assert C.needs_issue(sc.cert_pem, ca, names, NOW) is None
    assert C.needs_issue(None, ca, names, NOW) == "no certificate on main"
    assert C.needs_issue("junk", ca, names, NOW).startswith("the certificate on main is not")
    assert C.needs_issue(sc.cert_pem, other_ca, names, NOW) == "issued by another CA (rotated)"
    assert C.needs_issue(sc.cert_pem, ca, ["main.test"], NOW).startswith("names changed")
    assert "within 30 days" in C.needs_issue(C.issue_server_cert(ca, names, days=10, now=NOW).cert_pem, ca, names, NOW)


def test_rotate_replaces_the_ca_and_deletes_the_old_key(tmp_path):
    d = tmp_path / "inv.ini.tls"
    old, _ = C.ensure_ca(d)
    old_key = (d / "ca.key").read_bytes()
    served = C.issue_server_cert(old, ["main.test"])
    new = C.rotate_ca(d)
    assert C.fingerprint(new.cert) != C.fingerprint(old.cert)
    assert (d / "ca.previous.crt").read_text() == old.cert_pem
    assert (d / "ca.key").read_bytes() != old_key and mode(d / "ca.key") == 0o600
    assert sorted(p.name for p in d.iterdir()) == [".gitignore", ".lock", "ca.crt", "ca.key", "ca.previous.crt"]
    assert not any(old_key in p.read_bytes() for p in d.iterdir() if p.is_file())
    assert C.load_ca(d).cert == new.cert
    assert C.needs_issue(served.cert_pem, new, ["main.test"]) == "issued by another CA (rotated)"
    assert C.ensure_ca(d)[1] is False


def test_interrupted_rotation_is_finished_or_dropped(tmp_path):
    d = tmp_path / "inv.ini.tls"
    C.ensure_ca(d)
    staged = C.rotate_ca(tmp_path / "staging.tls")
    # died after writing both new files: rolled forward
    shutil.copy(tmp_path / "staging.tls" / "ca.key", d / "ca.key.new")
    shutil.copy(tmp_path / "staging.tls" / "ca.crt", d / "ca.crt.new")
    assert C.load_ca(d).cert == staged.cert and not (d / "ca.key.new").exists()
    # died after renaming the key, before the certificate: finished
    staged2 = C.rotate_ca(tmp_path / "staging.tls")
    shutil.copy(tmp_path / "staging.tls" / "ca.key", d / "ca.key")
    shutil.copy(tmp_path / "staging.tls" / "ca.crt", d / "ca.crt.new")
    assert C.load_ca(d).cert == staged2.cert
    # died while writing the new key: no rotation
    (d / "ca.key.new").write_text("half")
    assert C.load_ca(d).cert == staged2.cert and not (d / "ca.key.new").exists()


def test_fingerprint_matches_openssl(tmp_path, ca):
    if not shutil.which("openssl"):
        pytest.skip("no openssl command")
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(ca.cert_file)],
                         capture_output=True, text=True, check=True).stdout
    assert C.fingerprint(ca.cert) == "SHA256:" + out.strip().split("=", 1)[1]


def test_openssl_verifies_the_chain_strictly(tmp_path, ca, other_ca):
    if not shutil.which("openssl"):
        pytest.skip("no openssl command")
    sc = C.issue_server_cert(ca, ["main.test", "10.0.0.5"])
    (tmp_path / "s.crt").write_text(sc.cert_pem)

    def verify(ca_file, *extra):
        return subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", "sslserver", *extra,
                               "-CAfile", str(ca_file), str(tmp_path / "s.crt")], capture_output=True, text=True)

    assert verify(ca.cert_file).returncode == 0
    assert verify(ca.cert_file, "-verify_ip", "10.0.0.5").returncode == 0
    assert verify(ca.cert_file, "-verify_hostname", "other.test").returncode != 0
    assert verify(other_ca.cert_file).returncode != 0
