"""metrics=true without a lab: the inventory's variables and refusals, and the real HAProxy with the
front's template (public bind, TLS of the inventory's CA) in front of a stand-in exporter: /metrics
only with the scrape token, the token not passed on, the front's own exporter on its unix socket, and
the front's configuration unchanged with metrics off."""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tunnelspec.components.front import model as front
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.templating import render_file
from tunnelspec.core.errors import ClusterError
from tunnelspec.cluster.front_vars import MetricsSettings
from tunnelspec.cluster.model import Cluster
from tunnelspec.inventory.loader import load_inventory
from support import front as front_proc
from support.localserver import free_port, spawn

ROOT = Path(__file__).resolve().parents[2]
BASE = """[main]
main ansible_host=10.0.0.10

[rpc]
rpc-a ansible_host=10.0.0.11 rpc_role=draft
rpc-b ansible_host=10.0.0.12 rpc_role=target

[all:vars]
ansible_user=root
llama_repo=https://github.com/ggml-org/llama.cpp
llama_commit=d4f3039b1fa47e918560a0e6f29b9dec16fc54b5
llama_model=/srv/m/t.gguf
llama_draft_model=/srv/m/d.gguf

[main:vars]
"""
PUBLIC = "llama_server_host=10.0.0.10\nllama_server_public_bind=true\nllama_server_api_key_file=/etc/tunnelspec/key\n"


def cluster(tmp_path, main_vars: str) -> Cluster:
    inv = tmp_path / "inv.ini"
    inv.write_text(BASE + main_vars)
    return Cluster.from_inventory(load_inventory(inv))


def test_off_by_default_and_nothing_of_it_in_the_front(tmp_path):
    c = cluster(tmp_path, "")
    assert c.main.front.metrics is None and front.metrics_fact(c) is None
    v = front.front_vars(c.main)
    assert v["metrics"] is False
    assert "metrics" not in render_file((ROOT / "templates" / "tunnelspec-front.cfg.j2").read_text(), v)


def test_loopback_metrics(tmp_path):
    c = cluster(tmp_path, "metrics=true\nmetrics_port=9500\n")
    assert c.main.front.metrics.port == 9500 and c.main.front.metrics.token_file is None
    doc = json.loads(front.metrics_fact(c)["config_json"])
    assert doc["listen"] == [LOOPBACK, 9500] and doc["certificate"] is None
    assert doc["tunnels"] == {"rpc-a": "tunnelspec-tunnel-rpc-a.service", "rpc-b": "tunnelspec-tunnel-rpc-b.service"}
    assert doc["llama_server"] == {"address": "127.0.0.1:18080", "api_key": False}


@pytest.mark.parametrize("main_vars, var, words", [
    ("metrics_port=9500\n", "metrics_port", "metrics is not"),
    ("metrics=true\n" + PUBLIC, "metrics", "metrics_token_file"),
    ("metrics=true\nmetrics_token_file=/etc/tunnelspec/t\n", "metrics_token_file", "public_bind"),
    ("metrics=true\nmetrics_token_file=etc/t\n" + PUBLIC, "metrics_token_file", "absolute"),
    ("metrics=true\nmetrics_token_file=/tmp/t\n" + PUBLIC, "metrics_token_file", "sandbox"),
    ("metrics=true\nmetrics_token_file=/etc/tunnelspec/key\n" + PUBLIC, "metrics_token_file", "API key"),
    ("metrics=true\nmetrics_port=18080\n", "metrics_port", "already"),
    ("metrics=true\nmetrics_port=15052\n", "tunnel_port", "metrics_port"),
])
def test_refusals_name_the_variable(tmp_path, main_vars, var, words):
    with pytest.raises(ClusterError) as e:
        cluster(tmp_path, main_vars.replace("15052", str(cluster_port(tmp_path))))
    assert e.value.var == var and words in str(e.value), str(e.value)


def cluster_port(tmp_path) -> int:
    """rpc-a's tunnel port (the default numbering) in the same inventory."""
    d = tmp_path / "probe"
    d.mkdir(exist_ok=True)
    return cluster(d, "").rpc[0].tunnel_port


class _Exporter(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):
        _Exporter.seen.append(self.headers.get("Authorization"))
        body = b"tunnelspec_serving_mode{mode=\"speculative\"} 1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.mark.skipif(shutil.which(front.HAPROXY) is None, reason="haproxy not installed (scripts/setup.sh)")
def test_the_front_serves_metrics_only_with_the_token(tmp_path):
    from tunnelspec.components.tls import ca as C

    ca = C.ensure_ca(tmp_path / "ca")[0]
    cert = C.issue_server_cert(ca, ["127.0.0.1"])
    pem = tmp_path / "front.crt"
    pem.write_text(cert.cert_pem)
    Path(str(pem) + ".key").write_text(cert.key_pem.reveal())
    token = tmp_path / "token"
    token.write_text("the-scrape-token\n")
    exporter = http.server.HTTPServer((LOOPBACK, 0), _Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    port = free_port()
    cfg = front_proc.render(tmp_path, free_port(), port, hold=2, tls_pem=str(pem),
                            metrics=MetricsSettings(port=exporter.server_address[1], token_file=str(token)))
    assert "the-scrape-token" not in cfg.read_text()
    proc = spawn([front.HAPROXY, "-db", "-f", str(cfg)], tmp_path / "haproxy.log")
    try:
        ctx = ssl.create_default_context(cafile=str(ca.cert_file))

        def get(auth):
            req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers={"Authorization": auth} if auth else {})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        deadline = time.monotonic() + 20
        while True:
            try:
                first = get(None)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.proc.poll() is None, proc.log()[-2000:]
                time.sleep(0.05)  # poll interval of the deadline loop
        assert first[0] == 401
        assert get("Bearer the-api-key")[0] == 401
        assert get("the-scrape-token")[0] == 401
        assert get("Bearer the-scrape-token2")[0] == 401 and get("Bearer the-scrape")[0] == 401
        status, body = get("Bearer the-scrape-token")
        assert status == 200 and "tunnelspec_serving_mode" in body
        assert _Exporter.seen == [None]  # the token goes no further than the front
        # The front's own figures, for the exporter, on its unix socket.
        import importlib.machinery
        import importlib.util
        loader = importlib.machinery.SourceFileLoader("tm", str(ROOT / "tunnelspec" / "hostprogs" / "metrics.py"))
        spec = importlib.util.spec_from_loader(loader.name, loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        text = mod.front_metrics({"front": {"socket": str(tmp_path / "metrics.sock")}})
        assert 'haproxy_backend_status{proxy="llama",state="UP"}' in text or "haproxy_backend_" in text
        # The exporter's count of requests dropped twice, from the front's outer backend (none yet).
        assert mod.SOURCES.dropped_twice(text, front.FRONT_RETRY_BACKEND) == 0
        assert mod.SOURCES.dropped_twice(text, "no_such_backend") is None
    finally:
        proc.stop()
        exporter.shutdown()
