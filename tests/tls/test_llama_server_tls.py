"""The controller's own llama-server build serving TLS with a certificate of the inventory's CA
(--ssl-key-file/--ssl-cert-file; the build links OpenSSL, LLAMA_OPENSSL=ON): tunnelspec's client and
curl pin the CA; another CA, another name and plain HTTP fail."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from tunnelspec.constants import LOOPBACK
from tunnelspec.lab.localserver import free_port, spawn
from tunnelspec.llama import http
from tunnelspec.tls import ca as C
from tunnelspec.tls import client as T

pytestmark = pytest.mark.llama


def _help(binary):
    return subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout


def _start(llama_bin, llama_fixtures, tmp_path, tls: C.ServerCert | None, name: str):
    argv = [llama_bin.llama_server, "-m", llama_fixtures.model_local, "--host", LOOPBACK, "--port", str(free_port()),
            "-c", "256", "-t", "1", "--no-webui"]
    if tls is not None:
        (tmp_path / f"{name}.crt").write_text(tls.cert_pem)
        key = tmp_path / f"{name}.key"
        key.write_text(tls.key_pem.reveal())
        key.chmod(0o600)
        argv += ["--ssl-key-file", str(key), "--ssl-cert-file", str(tmp_path / f"{name}.crt")]
    proc = spawn(argv, tmp_path / f"{name}.log")
    proc.port = int(argv[argv.index("--port") + 1])
    return proc


async def _ready(opener, proc, deadline=60.0):
    end = time.monotonic() + deadline
    while True:
        if proc.proc.poll() is not None:
            raise AssertionError(f"llama-server exited {proc.proc.returncode}:\n{proc.log()[-2000:]}")
        try:
            r = await http.request(opener, "GET", "/health", timeout=5)
            if r.status == 200:
                return r
        except http.HttpError:
            if time.monotonic() > end:
                raise
        await asyncio.sleep(0.1)


@pytest.fixture
def servers(llama_bin, llama_fixtures, tmp_path):
    help_text = _help(llama_bin.llama_server)
    if "--ssl-cert-file" not in help_text:
        pytest.skip("this llama-server build has no TLS (built without OpenSSL: LLAMA_OPENSSL off or no headers)")
    if "--no-webui" not in help_text:
        pytest.skip("older llama-server")
    ca = C.ensure_ca(tmp_path / "inventory.ini.tls")[0]
    tls = _start(llama_bin, llama_fixtures, tmp_path, C.issue_server_cert(ca, ["main.test", LOOPBACK]), "tls")
    plain = _start(llama_bin, llama_fixtures, tmp_path, None, "plain")
    yield ca, tls, plain
    tls.stop()
    plain.stop()


def test_llama_server_tls_pinned(servers, tmp_path):
    ca, tls, plain = servers
    other = C.ensure_ca(tmp_path / "other.ini.tls")[0]
    good = T.pinned_context(ca_file=ca.cert_file)

    async def go():
        out = {}
        await _ready(T.tls_opener(http.tcp_opener(tls.port), good, "main.test"), tls)
        await _ready(http.tcp_opener(plain.port), plain)
        out["completion"] = await http.completion(T.tls_opener(http.tcp_opener(tls.port), good, "main.test"),
                                                  "Hello", n_predict=4)
        out["direct"] = (await http.request(T.tcp_tls_opener(LOOPBACK, tls.port, good), "GET", "/health")).status
        for label, opener in (
                ("other ca", T.tls_opener(http.tcp_opener(tls.port), T.pinned_context(other.cert_pem), "main.test")),
                ("other name", T.tls_opener(http.tcp_opener(tls.port), good, "evil.test")),
                ("tls to plain", T.tls_opener(http.tcp_opener(plain.port), good, "main.test", timeout=3)),
                ("tls to plain (asyncio)", T.tcp_tls_opener(LOOPBACK, plain.port, good, "main.test", timeout=3)),
                ("plain to tls", http.tcp_opener(tls.port))):
            try:
                r = await http.request(opener, "GET", "/health", timeout=10)
                out[label] = f"answered HTTP {r.status}"
            except http.HttpError as e:
                out[label] = f"error: {e}"
        return out

    out = asyncio.run(go())
    assert "content" in out["completion"] and out["direct"] == 200
    assert "not trusted by the pinned CA" in out["other ca"], out
    assert "not valid for 'evil.test'" in out["other name"], out
    for label in ("tls to plain", "tls to plain (asyncio)"):
        assert "TLS: no handshake with 'main.test' within 3s (a plain-HTTP server" in out[label], out
    assert out["plain to tls"].startswith("error:"), out  # no plain-HTTP answer from a TLS server


def test_curl_pins_the_ca(servers):
    if not shutil.which("curl"):
        pytest.skip("no curl")
    ca, tls, _ = servers
    asyncio.run(_ready(T.tls_opener(http.tcp_opener(tls.port), T.pinned_context(ca.cert_pem), "main.test"), tls))
    resolve = ["--resolve", f"main.test:{tls.port}:{LOOPBACK}"]

    def curl(*args):
        return subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                               *resolve, *args], capture_output=True, text=True, timeout=30)

    assert curl("--cacert", str(ca.cert_file), f"https://main.test:{tls.port}/health").stdout == "200"
    no_ca = curl(f"https://main.test:{tls.port}/health")  # system trust store only: refused
    assert no_ca.returncode == 60 and no_ca.stdout == "000", no_ca
    plain = curl(f"http://main.test:{tls.port}/health")
    assert plain.stdout != "200", plain
