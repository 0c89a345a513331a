"""The front (the real HAProxy with tunnelspec's front configuration, tests/support/front.py)
terminating TLS with a certificate of the inventory's CA, installed as main has it (`front.crt`, its
key in `front.crt.key` beside it), in front of the controller's real llama-server build serving plain
HTTP on another loopback port: tunnelspec's client and curl pin the CA; another CA, another name and
plain HTTP fail. Then a rotation as `certs rotate` does it: a new pair in place and the front reloaded
(master-worker, SIGUSR2, what `systemctl reload` sends): new handshakes get the new certificate, a
response in flight finishes, and llama-server is never restarted."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time

import pytest
from cryptography import x509

from support import front as front_proc
from tunnelspec.components.front import model as front
from tunnelspec.core.constants import LOOPBACK
from support.localserver import free_port, spawn
from tunnelspec.core import http
from tunnelspec.components.tls import ca as C
from tunnelspec.components.tls import client as T
from tunnelspec.components.tls.reach import Seen

pytestmark = pytest.mark.llama

NAME = "main.test"


def _install(d, pair: C.ServerCert) -> str:
    """The pair as server_tls installs it on main: the certificate, its key at <certificate>.key."""
    d.mkdir(exist_ok=True)
    crt = d / "front.crt"
    key = d / "front.crt.key"
    key.write_text(pair.key_pem.reveal())
    key.chmod(0o600)
    crt.write_text(pair.cert_pem)
    return str(crt)


def _llama(llama_bin, llama_fixtures, tmp_path):
    port = free_port()
    proc = spawn([llama_bin.llama_server, "-m", llama_fixtures.model_local, "--host", LOOPBACK, "--port", str(port),
                  "-c", "256", "-t", "1", "--no-webui"], tmp_path / "llama-server.log")
    proc.port = port
    return proc


async def _ready(opener, proc, deadline=60.0):
    end = time.monotonic() + deadline
    while True:
        if proc.proc.poll() is not None:
            raise AssertionError(f"{proc.argv[0]} exited {proc.proc.returncode}:\n{proc.log()[-2000:]}")
        try:
            r = await http.request(opener, "GET", "/health", timeout=5)
            if r.status == 200:
                return r
        except http.HttpError:
            if time.monotonic() > end:
                raise
        await asyncio.sleep(0.1)  # poll interval of the deadline loop


@pytest.fixture
def stack(llama_bin, llama_fixtures, tmp_path):
    """(ca, llama-server, TLS front, plain front): llama-server plain on loopback; one front with the
    installed pair (public bind), one without TLS (loopback bind), both in front of it."""
    if "--no-webui" not in subprocess.run([llama_bin.llama_server, "--help"], capture_output=True, text=True,
                                          timeout=60).stdout:
        pytest.skip("older llama-server")
    if not shutil.which(front.HAPROXY):
        pytest.skip("no haproxy (scripts/setup.sh installs it)")
    ca = C.ensure_ca(tmp_path / "inventory.ini.tls")[0]
    pem = _install(tmp_path / "tls", C.issue_server_cert(ca, [NAME, LOOPBACK]))
    llama = _llama(llama_bin, llama_fixtures, tmp_path)
    (tmp_path / "f-tls").mkdir()
    (tmp_path / "f-plain").mkdir()
    started = []
    try:
        asyncio.run(_ready(http.tcp_opener(llama.port), llama))
        started.append(front_proc.start(tmp_path / "f-tls", llama.port, hold=10, tls_pem=pem)[0])
        started.append(front_proc.start(tmp_path / "f-plain", llama.port, hold=10)[0])
        yield ca, llama, started[0], started[1]
    finally:
        for p in started:
            p.stop()
        llama.stop()


def test_front_terminates_tls_pinned(stack, tmp_path):
    ca, llama, tls, plain = stack
    other = C.ensure_ca(tmp_path / "other.ini.tls")[0]
    good = T.pinned_context(ca_file=ca.cert_file)

    async def go():
        out = {}
        seen = Seen()
        opener = T.tls_opener(http.tcp_opener(tls.port), good, NAME)
        await _ready(opener, tls)
        reader, writer = await opener()
        seen.der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        out["served"] = seen.describe()
        out["completion"] = await http.completion(opener, "Hello", n_predict=4)
        out["direct"] = (await http.request(T.tcp_tls_opener(LOOPBACK, tls.port, good), "GET", "/health")).status
        for label, opener_ in (
                ("other ca", T.tls_opener(http.tcp_opener(tls.port), T.pinned_context(other.cert_pem), NAME)),
                ("other name", T.tls_opener(http.tcp_opener(tls.port), good, "evil.test")),
                ("tls to plain llama-server", T.tls_opener(http.tcp_opener(llama.port), good, NAME, timeout=3)),
                ("tls to plain llama-server (asyncio)", T.tcp_tls_opener(LOOPBACK, llama.port, good, NAME, timeout=3)),
                ("tls to plain front", T.tls_opener(http.tcp_opener(plain.port), good, NAME, timeout=3)),
                ("plain to tls", http.tcp_opener(tls.port))):
            try:
                r = await http.request(opener_, "GET", "/health", timeout=10)
                out[label] = f"answered HTTP {r.status}"
            except http.HttpError as e:
                out[label] = f"error: {e}"
        return out

    out = asyncio.run(go())
    assert out["served"]["names"] == [NAME, LOOPBACK] and out["served"]["sha256"] == C.fingerprint(
        (tmp_path / "tls" / "front.crt").read_text()), out["served"]
    assert "content" in out["completion"] and out["direct"] == 200, out
    assert "not trusted by the pinned CA" in out["other ca"], out
    assert "not valid for 'evil.test'" in out["other name"], out
    for label in ("tls to plain llama-server", "tls to plain llama-server (asyncio)"):
        assert f"TLS: no handshake with '{NAME}' within 3s (a plain-HTTP server" in out[label], out
    assert "the server does not speak TLS (plain HTTP?)" in out["tls to plain front"], out
    assert out["plain to tls"].startswith("error:"), out  # no plain-HTTP answer from the TLS front


def test_curl_pins_the_ca(stack):
    if not shutil.which("curl"):
        pytest.skip("no curl")
    ca, _, tls, _ = stack
    asyncio.run(_ready(T.tls_opener(http.tcp_opener(tls.port), T.pinned_context(ca.cert_pem), NAME), tls))
    resolve = ["--resolve", f"{NAME}:{tls.port}:{LOOPBACK}"]

    def curl(*args):
        return subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                               *resolve, *args], capture_output=True, text=True, timeout=30)

    assert curl("--cacert", str(ca.cert_file), f"https://{NAME}:{tls.port}/health").stdout == "200"
    no_ca = curl(f"https://{NAME}:{tls.port}/health")  # system trust store only: refused
    assert no_ca.returncode == 60 and no_ca.stdout == "000", no_ca
    plain = curl(f"http://{NAME}:{tls.port}/health")
    assert plain.stdout != "200", plain


def test_rotation_is_a_front_reload(llama_bin, llama_fixtures, tmp_path):
    """The front in master-worker mode (as its unit runs it): a new pair from a new CA, SIGUSR2 to the
    master. A streamed completion started before the reload ends complete; new handshakes get the new
    certificate (the old CA fails); llama-server, a child of this test, runs on untouched."""
    if not shutil.which(front.HAPROXY):
        pytest.skip("no haproxy (scripts/setup.sh installs it)")
    ca = C.ensure_ca(tmp_path / "inventory.ini.tls")[0]
    pem = _install(tmp_path / "tls", C.issue_server_cert(ca, [NAME]))
    llama = _llama(llama_bin, llama_fixtures, tmp_path)
    port = free_port()
    (tmp_path / "f").mkdir()
    cfg = front_proc.render(tmp_path / "f", llama.port, port, hold=10, tls_pem=pem)
    haproxy = spawn([front.HAPROXY, "-W", "-db", "-f", str(cfg)], tmp_path / "f" / "haproxy.log")
    haproxy.port = port

    def fingerprint_served(ca_pem: str) -> str | None:
        async def go():
            try:
                _, w = await T.tls_opener(http.tcp_opener(port), T.pinned_context(ca_pem), NAME)()
            except T.TlsError:
                return None
            der = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
            w.close()
            return C.fingerprint(x509.load_der_x509_certificate(der))
        return asyncio.run(go())

    async def stream_across_reload(new_pair: C.ServerCert):
        opener = T.tls_opener(http.tcp_opener(port), T.pinned_context(ca.cert_pem), NAME)
        await _ready(opener, haproxy)
        reader, writer = await opener()
        body = json.dumps({"prompt": "Once upon a time", "n_predict": 48, "stream": True}).encode()
        writer.write(b"POST /completion HTTP/1.1\r\nHost: " + NAME.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"data: "), 60)  # the response has begun
        # The rotation, as certs rotate does it: the new pair in place, the front reloaded.
        _install(tmp_path / "tls", new_pair)
        haproxy.proc.send_signal(signal.SIGUSR2)
        rest = await asyncio.wait_for(reader.read(), 120)  # to the end (Connection: close)
        writer.close()
        return head + rest

    try:
        asyncio.run(_ready(http.tcp_opener(llama.port), llama))
        old = C.fingerprint((tmp_path / "tls" / "front.crt").read_text())
        new_ca = C.rotate_ca(tmp_path / "inventory.ini.tls")
        new_pair = C.issue_server_cert(new_ca, [NAME])
        streamed = asyncio.run(stream_across_reload(new_pair))
        assert streamed.startswith(b"HTTP/1.1 200"), streamed[:300]
        assert b'"stop":true' in streamed.replace(b" ", b""), streamed[-600:]  # the last event: complete
        # New handshakes: the new certificate, within a deadline (the new worker takes over).
        deadline = time.monotonic() + 20
        served = None
        while time.monotonic() < deadline:
            served = fingerprint_served(new_ca.cert_pem)
            if served == new_pair.fingerprint:
                break
            time.sleep(0.1)  # poll interval of the deadline loop
        assert served == new_pair.fingerprint != old, (served, old, haproxy.log()[-2000:])
        assert fingerprint_served(ca.cert_pem) is None  # the old CA no longer validates the front
        assert llama.proc.poll() is None  # llama-server served throughout and was never restarted
        assert haproxy.proc.poll() is None, haproxy.log()[-2000:]  # the master lives on after the reload
    finally:
        haproxy.stop()
        llama.stop()
