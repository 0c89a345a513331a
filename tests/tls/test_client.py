"""The pinned-CA TLS openers against real TLS servers on 127.0.0.1: Python's ssl server here, the
controller's llama-server build (built with OpenSSL) in test_llama_server_tls.py."""

from __future__ import annotations

import asyncio

import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core import http
from tunnelspec.components.tls import client as T


def get(opener, path="/health", **kw):
    return asyncio.run(http.request(opener, "GET", path, timeout=15, **kw))


def both(port, ctx, name):
    """The MemoryBIO opener over a plain asyncio stream and asyncio's own TLS over TCP."""
    return [T.tls_opener(http.tcp_opener(port), ctx, name), T.tcp_tls_opener(LOOPBACK, port, ctx, name)]


@pytest.mark.parametrize("name", ["main.test", "127.0.0.1", "MAIN.test"])
def test_right_ca_and_name(https_server, ca, name):
    for opener in both(https_server, T.pinned_context(ca.cert_pem), name):
        r = get(opener, headers={"Authorization": "Bearer k"})
        assert r.status == 200 and r.json()["auth"] == "Bearer k"


def test_ca_file_and_post_and_a_large_chunked_body(https_server, ca):
    ctx = T.pinned_context(ca_file=ca.cert_file)
    for opener in both(https_server, ctx, "main.test"):
        r = asyncio.run(http.request(opener, "POST", "/completion", {"prompt": "é" * 5000}, timeout=15))
        assert r.json() == {"echo": {"prompt": "é" * 5000}}
        big = get(opener, "/big")
        assert len(big.json()["x"]) == 300_000


def test_another_ca_is_refused(https_server, other_ca):
    for opener in both(https_server, T.pinned_context(other_ca.cert_pem), "main.test"):
        with pytest.raises(http.HttpError, match="not trusted by the pinned CA"):
            get(opener)


def test_wrong_name_is_refused(https_server, ca):
    for name in ("other.test", "10.9.9.9"):
        for opener in both(https_server, T.pinned_context(ca.cert_pem), name):
            with pytest.raises(http.HttpError, match=f"not valid for '{name}'"):
                get(opener)


def test_plain_http_server_is_refused(http_server, ca):
    for opener in both(http_server, T.pinned_context(ca.cert_pem), "main.test"):
        with pytest.raises(http.HttpError, match="TLS"):
            get(opener)
    assert get(http.tcp_opener(http_server)).status == 200  # the plain path is unchanged


def test_no_system_trust_store_even_when_the_environment_names_one(https_server, ca, other_ca, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert_file))
    monkeypatch.setenv("SSL_CERT_DIR", str(ca.dir))
    ctx = T.pinned_context(other_ca.cert_pem)
    assert len(ctx.get_ca_certs()) == 1
    with pytest.raises(http.HttpError, match="not trusted"):
        get(T.tls_opener(http.tcp_opener(https_server), ctx, "main.test"))


def test_pinned_context_is_strict():
    import ssl

    with pytest.raises(ValueError):
        T.pinned_context()
    with pytest.raises(ValueError, match="no CA certificate"):
        T.pinned_context("")
    with pytest.raises(ValueError, match="no CA certificate"):
        T.pinned_context("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


def test_context_settings(ca):
    import ssl

    ctx = T.pinned_context(ca.cert_pem)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and ctx.verify_flags & ssl.VERIFY_X509_STRICT
    assert len(ctx.get_ca_certs()) == 1  # the pinned CA, nothing from the system


def test_through_an_ssh_channel(sshd_cluster, https_server, ca, other_ca):
    """TLS end to end inside an asyncssh direct-tcpip channel, as verify/status/bench reach main."""
    import asyncssh

    cluster = sshd_cluster(1)
    host = cluster.hosts[0]

    async def go():
        async with asyncssh.connect(LOOPBACK, port=host.port, username="root", client_keys=[str(cluster.key)],
                                    known_hosts=str(cluster.known_hosts)) as conn:
            ssh = http.ssh_opener(conn, https_server)
            ok = await http.request(T.tls_opener(ssh, T.pinned_context(ca.cert_pem), "main.test"), "GET", "/big",
                                    timeout=15)
            errors = []
            for ctx, name in ((T.pinned_context(other_ca.cert_pem), "main.test"),
                              (T.pinned_context(ca.cert_pem), "wrong.test")):
                try:
                    await http.request(T.tls_opener(ssh, ctx, name), "GET", "/health", timeout=15)
                except http.HttpError as e:
                    errors.append(str(e))
            return ok, errors

    ok, errors = asyncio.run(go())
    assert ok.status == 200 and len(ok.json()["x"]) == 300_000
    assert len(errors) == 2 and "not trusted" in errors[0] and "not valid for 'wrong.test'" in errors[1]
