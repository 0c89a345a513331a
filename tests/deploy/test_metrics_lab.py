"""Metrics for operators, in the lab: a real Prometheus (Debian's /usr/bin/prometheus, run here on 127.0.0.1 with
its own temporary data, stopped by PID) scrapes main's /metrics through the front's TLS with the CA
and the scrape token. It sees `speculative`; the draft node's link cut shows `degraded` within 15 s of
the switch and `speculative` after it returns; a tunnel ssh killed shows as a reconnect. Without the
token, or with the API key as one, the scrape gets 401; no secret is in any scraped series. The lab's
own inventory is deployed again at the end (metrics off: the exporter goes)."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from support.labdeploy import converge, deploy, failures, sh

pytestmark = pytest.mark.lab

KEY_FILE = "/etc/tunnelspec/metrics-test-api-key"
TOKEN_FILE = "/etc/tunnelspec/metrics-test-token"
PROMETHEUS = "/usr/bin/prometheus"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fetch(url: str, ca_file: str, token: str | None, name: str) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = True
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Prom:
    def __init__(self, tmp_path, target: str, ca_file: str, token_file: str, server_name: str):
        self.port = _free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(json.dumps({
            # The exporter answers within 3 s however busy llama-server is (1.5 s per source at most).
            "global": {"scrape_interval": "3s", "scrape_timeout": "3s"},
            "scrape_configs": [{"job_name": "tunnelspec", "scheme": "https",
                                "tls_config": {"ca_file": ca_file, "server_name": server_name},
                                "authorization": {"type": "Bearer", "credentials_file": token_file},
                                "static_configs": [{"targets": [target]}]}]}))
        self.log = open(tmp_path / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def query(self, expr: str) -> list:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)["data"]["result"]
        except OSError:
            return []

    def wait(self, expr: str, timeout: float) -> float:
        """Seconds until `expr` returns a series (polled with a deadline)."""
        t0 = time.monotonic()
        while not self.query(expr):
            assert self.proc.poll() is None, "prometheus exited"
            assert time.monotonic() - t0 < timeout, f"{expr} not true within {timeout}s; targets: " + \
                json.dumps(self.query("up"))
            time.sleep(0.5)
        return time.monotonic() - t0

    def stop(self):
        self.proc.terminate()  # our own child, by PID
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def _mode_since(lab) -> tuple[str, float]:
    st = json.loads(sh(lab, "main", "cat", "/run/tunnelspec-llama/mode.json"))
    return st["mode"], float(st["since"])


def _main_time(lab) -> float:
    return float(sh(lab, "main", "date", "+%s.%N"))


def test_prometheus_sees_modes_reconnects_and_only_the_token_opens_it(lab_tools, tmp_path):
    lab = lab_tools
    if not shutil.which(PROMETHEUS):
        pytest.skip("prometheus not installed (scripts/setup.sh)")
    main_ip = lab.hosts["main"]
    api_key, token = secrets.token_hex(24), secrets.token_hex(24)
    for path, value in ((KEY_FILE, api_key), (TOKEN_FILE, token)):
        sh(lab, "main", "sh", "-c", 'umask 077; mkdir -p "$(dirname "$2")"; printf "%s\\n" "$1" > "$2"', "sh",
           value, path)
    inv = tmp_path / "metrics.ini"
    inv.write_text(lab.inventory.read_text() + "\n[main:vars]\n" + "\n".join([
        f"llama_server_host={main_ip}", "llama_server_public_bind=true", f"llama_server_api_key_file={KEY_FILE}",
        "metrics=true", f"metrics_token_file={TOKEN_FILE}"]) + "\n")
    ca_file = str(tmp_path / "metrics.ini.tls" / "ca.crt")
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    prom = None
    try:
        first = deploy(inv)
        assert first.rc == 0, failures(first)
        again = deploy(inv)
        assert again.rc == 0 and all(h["changed"] == 0 for h in again.recap.values()), failures(again)
        url = f"https://{main_ip}:8080/metrics"
        # Only the scrape token opens it; the API key is no scrape credential.
        assert _fetch(url, ca_file, None, main_ip)[0] == 401
        assert _fetch(url, ca_file, api_key, main_ip)[0] == 401
        status, body = _fetch(url, ca_file, token, main_ip)
        assert status == 200 and 'tunnelspec_serving_mode{mode="speculative"} 1' in body, body[:3000]
        assert "llamacpp:" in body and "haproxy_" in body and 'tunnelspec_exporter_source_up{source="llama_server"} 1' in body
        assert api_key not in body and token not in body
        # Each of the exporter's sources answered: the mode file, the generation, systemd, llama-server, the
        # front, the certificate.
        for source in ("state", "generation", "systemd", "llama_server", "front", "certificate"):
            assert f'tunnelspec_exporter_source_up{{source="{source}"}} 1' in body, (source, body[:3000])
        assert re.search(r"^tunnelspec_generation [1-9]\d*$", body, re.M), body[:3000]
        assert 'tunnelspec_node_rpc_info{node="rpc-a",version="' in body and 'tunnelspec_tunnel_up{node="rpc-b"} 1' in body
        end = [float(l.split()[1]) for l in body.splitlines()
               if l.startswith("tunnelspec_tls_certificate_expiry_timestamp_seconds ")]
        assert end and 300 * 86400 < end[0] - time.time() < 366 * 86400, end
        # Nothing new listens off loopback on main but the front; nothing new on the nodes.
        listen = sh(lab, "main", "ss", "-Hltn")
        assert "127.0.0.1:9466" in listen and f"{main_ip}:9466" not in listen and "0.0.0.0:9466" not in listen
        # On main, the loopback endpoint (what an SSH tunnel reaches) serves the same figures.
        local = sh(lab, "main", "python3", "-c", "import urllib.request as u; "
                   "print(u.urlopen('http://127.0.0.1:9466/metrics', timeout=10).read().decode())")
        assert 'tunnelspec_serving_mode{mode="speculative"} 1' in local and api_key not in local

        prom = Prom(tmp_path, f"{main_ip}:8080", ca_file, str(token_file), main_ip)
        prom.wait('tunnelspec_serving_mode{mode="speculative"} == 1', 60)

        lab.link("rpc-a", False)
        try:
            deadline = time.monotonic() + 90
            while _mode_since(lab)[0] != "degraded":
                assert time.monotonic() < deadline, "no switch to degraded"
                time.sleep(0.5)
            since = _mode_since(lab)[1]
            prom.wait('tunnelspec_serving_mode{mode="degraded"} == 1', 30)
            seen = _main_time(lab)
            assert seen - since <= 15, f"degraded seen {seen - since:.1f}s after the switch"
            print(f"\n  link cut: Prometheus saw degraded {seen - since:.1f}s after the switch")
        finally:
            lab.link("rpc-a", True)
        try:
            prom.wait('tunnelspec_serving_mode{mode="speculative"} == 1', 180)
        except AssertionError as e:
            t0 = time.monotonic()
            got = _fetch(url, ca_file, token, main_ip)
            raise AssertionError(f"{e}\nscrape by hand: {got[0]} in {time.monotonic() - t0:.1f}s: {got[1][:1500]}\n"
                                 + sh(lab, "main", "sh", "-c", "cat /run/tunnelspec-llama/mode.json; journalctl -q "
                                      "-n 30 -u tunnelspec-metrics -u tunnelspec-llama-server -u tunnelspec-front")
                                 + (tmp_path / "prometheus.log").read_text()[-2000:]) from None
        assert prom.query('tunnelspec_serving_mode_entered_total{mode="degraded"} >= 1')

        # A tunnel's ssh killed by its PID: systemd reconnects it, counted as a restart.
        before = prom.query('tunnelspec_tunnel_restarts_total{node="rpc-b"}')
        n0 = float(before[0]["value"][1]) if before else 0.0
        pid = sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", "tunnelspec-tunnel-rpc-b.service").strip()
        assert pid and pid != "0"
        sh(lab, "main", "kill", "-KILL", pid)
        prom.wait(f'tunnelspec_tunnel_restarts_total{{node="rpc-b"}} > {n0}', 60)

        # No secret in any series Prometheus stored.
        series = prom.query('{job="tunnelspec"}')
        text = json.dumps(series)
        assert series and api_key not in text and token not in text
    finally:
        if prom is not None:
            prom.stop()
        lab.link("rpc-a", True)
        converge(lab.inventory)
        sh(lab, "main", "rm", "-f", KEY_FILE, TOKEN_FILE)
    # Metrics off again: the exporter, its files and its listener are gone, and the lab's own inventory
    # deploys with changed=0.
    assert sh(lab, "main", "sh", "-c", "systemctl cat tunnelspec-metrics.service >/dev/null 2>&1 && echo yes || "
              "echo no").strip() == "no"
    assert sh(lab, "main", "sh", "-c", "ls /etc/tunnelspec/metrics.json /usr/local/lib/tunnelspec/tunnelspec-metrics "
              "/usr/local/lib/tunnelspec/tunnelspec-metrics-sources 2>/dev/null; :").strip() == ""
    assert ":9466" not in sh(lab, "main", "ss", "-Hltn")
    again = deploy(lab.inventory)
    assert again.rc == 0 and all(h["changed"] == 0 for h in again.recap.values()), failures(again)
