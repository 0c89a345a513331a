"""The public bind in the lab: llama_server_public_bind=true serves the API over TLS, from a
certificate of the inventory's CA, and nothing secret leaks. Since the front came, TLS terminates in the
front (HAProxy, tunnelspec-front.service, its own user): its `bind ... ssl crt front.crt` with the key
in front.crt.key; llama-server stays plain HTTP on 127.0.0.1:18080 behind it.

One test, few deploys (each costs CI minutes): a public-bind deploy (no rebuild: llama-server needs
no TLS of its own), a second deploy (changed=0), `certs rotate` (a reload of the front: llama-server
keeps its PID), a deploy after a near-expiry certificate put on main (renewed), then the lab's own
inventory again. Between them: clients on the lab bridge that are not main — rpc-b (Python's ssl
and curl) and this controller (curl, and tunnelspec's own client) —, plain HTTP, a client without
the CA, llama-server's own port out of reach, verify/status, client-config, and a search of every
output, the logs bundle, main's journals and process list for the CA key, the server key and the
API key.

Another engineer may use the lab at the same time, so the test starts and ends with a deploy of the
lab's own inventory (loopback bind), as tests/deploy/test_lifecycle_extra.py does.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.labdeploy import DEPLOY_TIMEOUT, converge, deploy, failures, main_pid, running_argv, sh
from tunnelspec.components.tls import ca as C

pytestmark = pytest.mark.lab

KEY_FILE = "/etc/tunnelspec/tls-test-api-key"
TLS_CERT = "/etc/tunnelspec/tls/front.crt"
TLS_KEY = "/etc/tunnelspec/tls/front.crt.key"  # HAProxy's `crt <file>` loads the key from <file>.key
FRONT_CFG = "/etc/tunnelspec/front.cfg"
FRONT_UNIT = "tunnelspec-front.service"
FRONT_USER = "tunnelspec-front"
INTERNAL_PORT = 18080  # llama-server's own port, behind the front


def pem_body(pem: str) -> str:
    return "".join(line.strip() for line in pem.splitlines() if line.strip() and not line.startswith("-----"))


# Python on rpc-b: GET/POST with an optional CA file and key; prints the HTTP status, or ERR <reason>.
_CLIENT = r"""
import json, ssl, sys, urllib.request, urllib.error
url, ca, key = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
req = urllib.request.Request(url, data=json.dumps({"prompt": "Hello", "n_predict": 4}).encode(),
                             headers={"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})})
try:
    with urllib.request.urlopen(req, timeout=60, context=ctx if url.startswith("https") else None) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print("ERR", type(e).__name__, str(e)[:200])
"""


def from_rpc_b(lab, url: str, ca_path: str = "", key: str = "") -> str:
    return sh(lab, "rpc-b", "python3", "-c", _CLIENT, url, ca_path, key, timeout=120).strip().splitlines()[-1]


def served_cert(host: str, port: int, ca_file: str, name: str) -> dict:
    """This controller (on the lab bridge) with tunnelspec's own pinned client, directly over TCP."""
    from cryptography import x509

    from tunnelspec.core import http
    from tunnelspec.components.tls.client import pinned_context, tcp_tls_opener

    async def go():
        opener = tcp_tls_opener(host, port, pinned_context(ca_file=ca_file), name)
        reader, writer = await opener()
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        r = await http.request(tcp_tls_opener(host, port, pinned_context(ca_file=ca_file), name), "GET", "/health")
        return der, r.status

    der, status = asyncio.run(go())
    return {**C.describe(x509.load_der_x509_certificate(der)), "health": status}


def test_public_bind_serves_tls_with_the_inventorys_ca(lab, tmp_path):
    converge(lab.inventory)
    main_ip = lab.hosts["main"]
    api_key = secrets.token_hex(24)
    sh(lab, "main", "sh", "-c", 'umask 077; mkdir -p "$(dirname "$2")"; printf "%s\\n" "$1" > "$2"', "sh",
       api_key, KEY_FILE)
    inv = tmp_path / "public.ini"
    inv.write_text(lab.inventory.read_text() + "\n[main:vars]\n" + "\n".join([
        f"llama_server_host={main_ip}", "llama_server_public_bind=true", f"llama_server_api_key_file={KEY_FILE}"]) + "\n")
    ca_dir = tmp_path / "public.ini.tls"
    outputs: list[str] = []
    try:
        # ---- first TLS deploy ----------------------------------------------------------------
        first = tunnelspec("deploy", str(inv), "--diff", "-v", timeout=DEPLOY_TIMEOUT)
        outputs.append(first.stdout + first.stderr)
        assert first.rc == 0, (first.stdout[-3000:], first.stderr[-3000:])
        ca = C.load_ca(ca_dir)
        ca_file = str(ca.cert_file)
        assert (ca_dir / "ca.key").stat().st_mode & 0o777 == 0o600
        # TLS in the front; llama-server plain HTTP on loopback behind it, with no TLS flag at all.
        front_cfg = sh(lab, "main", "cat", FRONT_CFG)
        assert f"bind {main_ip}:8080 ssl crt {TLS_CERT} ssl-min-ver TLSv1.2" in front_cfg, front_cfg
        assert f"server llama 127.0.0.1:{INTERNAL_PORT} check" in front_cfg, front_cfg
        argv = running_argv(lab)
        assert not [a for a in argv if a.startswith("--ssl")], argv
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == str(INTERNAL_PORT)
        assert sh(lab, "main", "stat", "-c", "%a %U", TLS_KEY).split() == ["600", FRONT_USER]
        assert sh(lab, "main", "stat", "-c", "%a", TLS_CERT).split() == ["644"]
        assert sh(lab, "main", "stat", "-c", "%a %U %G", "/etc/tunnelspec/tls").split() == ["750", "root", FRONT_USER]
        assert sh(lab, "main", "ls", "/etc/tunnelspec/tls").split() == ["front.crt", "front.crt.key"]

        cfg_run = tunnelspec("client-config", str(inv), "--format", "json")
        outputs.append(cfg_run.stdout + cfg_run.stderr)
        cfg = json.loads(cfg_run.stdout)
        assert cfg["base_url"] == f"https://{main_ip}:8080/v1" and cfg["ca_file"] == ca_file
        assert cfg["ca_sha256"] == C.fingerprint(ca.cert) and cfg["api_key"]["path"] == KEY_FILE
        human = tunnelspec("client-config", str(inv))
        outputs.append(human.stdout + human.stderr)
        assert f"--cacert {ca_file}" in human.stdout

        # ---- clients on the bridge --------------------------------------------------------------
        # The CA file client-config names, as a client would take it.
        sh(lab, "rpc-b", "sh", "-c", 'cat > /tmp/tunnelspec-ca.crt', input=Path(cfg["ca_file"]).read_text())
        url = f"{cfg['server_url']}/completion"
        assert from_rpc_b(lab, url, "/tmp/tunnelspec-ca.crt", api_key) == "200"
        # curl on another lab host (rpc-b): /health with the CA pinned, a certificate error without it,
        # and a completion with the key (read from a file: never on a command line) that drafts.
        sh(lab, "rpc-b", "sh", "-c", "umask 077; cat > /tmp/tunnelspec-auth.h", input=f"Authorization: Bearer {api_key}\n")
        curl_b = ["curl", "-sS", "--max-time", "30", "--cacert", "/tmp/tunnelspec-ca.crt"]
        assert sh(lab, "rpc-b", *curl_b, "-o", "/dev/null", "-w", "%{http_code}", f"{cfg['server_url']}/health") == "200"
        assert lab.exec("rpc-b", ["curl", "-sS", "--max-time", "30", "-o", "/dev/null", f"{cfg['server_url']}/health"],
                        timeout=60).returncode == 60  # curl: the peer's certificate cannot be verified
        body = json.loads(sh(lab, "rpc-b", *curl_b, "-H", "@/tmp/tunnelspec-auth.h", "-H", "Content-Type: application/json",
                             "-d", json.dumps({"prompt": "Once upon a time", "n_predict": 32, "temperature": 0}),
                             f"{cfg['server_url']}/completion"))
        assert body["timings"]["draft_n"] > 0 and body["timings"]["draft_n_accepted"] > 0, body.get("timings")
        assert from_rpc_b(lab, url, "/tmp/tunnelspec-ca.crt", "") == "401"
        assert from_rpc_b(lab, url, "", api_key).startswith("ERR") and "CERTIFICATE_VERIFY_FAILED" in \
            from_rpc_b(lab, url, "", api_key)
        assert from_rpc_b(lab, f"http://{main_ip}:8080/completion", "", api_key) != "200"
        # llama-server's own port is on main's loopback only: nothing answers it on the bridge.
        assert from_rpc_b(lab, f"http://{main_ip}:{INTERNAL_PORT}/health").startswith("ERR")
        served = served_cert(main_ip, 8080, ca_file, main_ip)
        assert served["health"] == 200 and main_ip in served["names"] and "main" in served["names"]
        if shutil.which("curl"):
            curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20"]
            assert subprocess.run([*curl, "--cacert", ca_file, "-H", f"Authorization: Bearer {api_key}",
                                   f"{cfg['server_url']}/v1/models"], capture_output=True, text=True).stdout == "200"
            no_ca = subprocess.run([*curl, f"{cfg['server_url']}/health"], capture_output=True, text=True)
            assert no_ca.returncode == 60, no_ca

        # ---- verify / status report TLS and the certificate's end ----------------------------------
        ver = tunnelspec("verify", str(inv), "--format", "json", "-v", timeout=600)
        outputs.append(ver.stdout + ver.stderr)
        assert ver.rc == 0, failures(ver)
        (vres,) = [e for e in ver.results() if e.get("task", "").startswith("health, completion")]
        assert "TLS (CA pinned" in vres["msg"] and "certificate ends" in vres["msg"], vres
        st = tunnelspec("status", str(inv), "--format", "json", timeout=120)
        outputs.append(st.stdout + st.stderr)
        server = json.loads(st.stdout)["hosts"]["main"]["llama_server"]
        assert server["health"] == "ok" and server["tls"]["certificate"]["days_left"] >= 360, server
        assert server["tls"]["certificate"]["sha256"] == C.fingerprint(
            sh(lab, "main", "cat", TLS_CERT))

        # ---- second deploy: nothing to do -------------------------------------------------------------
        again = deploy(inv)
        outputs.append(again.stdout + again.stderr)
        assert again.rc == 0 and again.recap["main"]["changed"] == 0, again.results("changed")

        # ---- certs rotate: old CA fails, new one works; a reload of the front, llama-server untouched ----
        old_pem, pid = ca.cert_pem, main_pid(lab)
        front_pid = int(sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", FRONT_UNIT).strip())
        rot = tunnelspec("certs", "rotate", str(inv), "--format", "json", timeout=1200)
        outputs.append(rot.stdout + rot.stderr)
        assert rot.rc == 0, failures(rot)
        changed = [e.get("task") for e in rot.results("changed")]
        assert changed == ["front TLS key and certificate", "front reload"], rot.results()
        (served_task,) = [e for e in rot.results() if e.get("task") == "front serves the new certificate"]
        assert served_task["status"] == "ok", served_task
        assert main_pid(lab) == pid  # llama-server was not restarted: serving went on
        # HAProxy's master lives on through a reload (new workers under the same main PID).
        assert int(sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", FRONT_UNIT).strip()) == front_pid
        new_ca = C.load_ca(ca_dir)
        assert new_ca.cert_pem != old_pem and (ca_dir / "ca.previous.crt").read_text() == old_pem
        sh(lab, "rpc-b", "sh", "-c", 'cat > /tmp/tunnelspec-old-ca.crt', input=old_pem)
        sh(lab, "rpc-b", "sh", "-c", 'cat > /tmp/tunnelspec-ca.crt', input=new_ca.cert_pem)
        assert "CERTIFICATE_VERIFY_FAILED" in from_rpc_b(lab, url, "/tmp/tunnelspec-old-ca.crt", api_key)
        assert from_rpc_b(lab, url, "/tmp/tunnelspec-ca.crt", api_key) == "200"
        after = deploy(inv)
        outputs.append(after.stdout + after.stderr)
        assert after.rc == 0 and after.recap["main"]["changed"] == 0, after.results("changed")

        # ---- a certificate 10 days from its end is renewed by the next deploy -----------------------------
        near = C.issue_server_cert(new_ca, [main_ip, "main"], days=10)
        sh(lab, "main", "sh", "-c", f'umask 077; cat > {TLS_KEY} && chown {FRONT_USER}: {TLS_KEY}',
           input=near.key_pem.reveal())
        sh(lab, "main", "sh", "-c", f'cat > {TLS_CERT} && chmod 644 {TLS_CERT}', input=near.cert_pem)
        sh(lab, "main", "systemctl", "reload", FRONT_UNIT)
        pid = main_pid(lab)
        renew = deploy(inv)
        outputs.append(renew.stdout + renew.stderr)
        assert renew.rc == 0, failures(renew)
        (tls_task,) = [e for e in renew.results() if e.get("task") == "front TLS key and certificate"]
        assert tls_task["status"] == "changed" and "within 30 days" in tls_task["msg"], tls_task
        assert [e.get("task") for e in renew.results("changed")] == ["front TLS key and certificate", "front reload"]
        assert main_pid(lab) == pid
        st = tunnelspec("status", str(inv), "--format", "json", timeout=120)
        outputs.append(st.stdout + st.stderr)
        assert json.loads(st.stdout)["hosts"]["main"]["llama_server"]["tls"]["certificate"]["days_left"] >= 360

        # ---- no secret anywhere ----------------------------------------------------------------------------
        bundle = tmp_path / "bundle"
        logs = tunnelspec("logs", str(inv), "-o", str(bundle), timeout=600)
        outputs.append(logs.stdout + logs.stderr)
        assert logs.rc == 0, logs.stdout + logs.stderr
        texts = [p.read_text(errors="replace") for p in bundle.rglob("*") if p.is_file()]
        server_key = sh(lab, "main", "cat", TLS_KEY)
        journal = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", "tunnelspec-*", timeout=120)
        procs = sh(lab, "main", "ps", "-eo", "args")
        secrets_ = {"CA key": pem_body((ca_dir / "ca.key").read_text())[:48],
                    "server key": pem_body(server_key)[:48], "near-expiry key": pem_body(near.key_pem.reveal())[:48],
                    "API key": api_key}
        for label, value in secrets_.items():
            assert value and len(value) >= 40, label
            for where, text in (("outputs", "\n".join(outputs)), ("bundle", "\n".join(texts)),
                                ("journal", journal), ("process list", procs)):
                assert value not in text, f"{label} in {where}"
    finally:
        converge(lab.inventory)
        sh(lab, "main", "rm", "-f", "--", KEY_FILE)
        sh(lab, "rpc-b", "rm", "-f", "/tmp/tunnelspec-ca.crt", "/tmp/tunnelspec-old-ca.crt", "/tmp/tunnelspec-auth.h")
    # Back on loopback: the front binds 127.0.0.1 without TLS, and the TLS files are gone from main.
    front_cfg = sh(lab, "main", "cat", FRONT_CFG)
    assert "bind 127.0.0.1:8080\n" in front_cfg and " ssl " not in front_cfg, front_cfg
    assert sh(lab, "main", "sh", "-c", "test -e /etc/tunnelspec/tls && echo present || echo gone").strip() == "gone"
