"""The `server_tls` task over a real sshd "main" (tests/support/sshd_harness.py): issued by the
inventory's CA on the controller, installed 0600, second run ok; renewal of a near-expiry certificate,
re-issue after a CA rotation, an interrupted install, your own files, removal without public bind,
--check creating nothing; never a key in any output. Then the real front (HAProxy with tunnelspec's
front configuration) serving the installed pair in front of the controller's real llama-server (plain
HTTP on loopback), reached the way verify and status reach it: TLS inside the SSH connection, the CA
pinned."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from support.cli import tunnelspec
from tunnelspec.components.tls import ca as C

SHA = "0123456789abcdef0123456789abcdef01234567"
NAMES = "main.test,127.0.0.1"


def _inventory(cluster, tmp_path, main_vars: str = "", name: str = "inventory.ini"):
    main, rpc = cluster.hosts
    common = f"ansible_host=127.0.0.1 ansible_user=root ansible_ssh_private_key_file={cluster.key}"
    text = "\n".join([
        "[main]", f"m1 {common} ansible_port={main.port} root={main.root} "
        f"tunnelspec_pending_dir={main.dir / 'pending'} llama_server_public_bind=true "
        f"llama_server_api_key_file=/etc/tunnelspec/key llama_server_tls_names={NAMES} {main_vars}", "",
        "[rpc]", f"r1 {common} ansible_port={rpc.port} rpc_role=draft", "",
        "[all:vars]", f"tunnelspec_known_hosts={cluster.known_hosts}", f"tunnelspec_lock_dir={cluster.base / 'lock'}",
        "llama_repo=/srv/llama.cpp", f'llama_commit="{SHA}"', ""])
    path = tmp_path / name
    path.write_text(text)
    return path


PLAY = """- hosts: main
  tasks:
    - name: tls
      server_tls: {owner: root, dir: "{{ root }}/tls", cert: "{{ root }}/tls/c.crt"}
"""


@pytest.fixture
def setup(sshd_cluster, tmp_path):
    cluster = sshd_cluster(2)
    inv = _inventory(cluster, tmp_path)
    pb = tmp_path / "tls.yml"
    pb.write_text(PLAY)
    return cluster, inv, pb, cluster.hosts[0].root / "tls"


def _play(inv, pb, *args):
    return tunnelspec("play", str(inv), str(pb), "--format", "json", *args)


def _status(r):
    return [(e["status"], e.get("msg", "")) for e in r.results()]


def _no_key(r, *pems):
    for pem in pems:
        body = "".join(line for line in pem.splitlines() if not line.startswith("-----"))
        assert body[:40] not in r.stdout + r.stderr


def test_issue_renew_rotate(setup, tmp_path):
    cluster, inv, pb, d = setup
    ca_dir = tmp_path / "inventory.ini.tls"

    check = _play(inv, pb, "--check")
    assert check.rc == 3, check.stdout + check.stderr
    assert "the inventory's CA is created first" in check.stdout and not ca_dir.exists()

    first = _play(inv, pb, "--diff")
    assert first.rc == 0, first.stdout + first.stderr
    assert _status(first)[0][0] == "changed" and "CA is created first" in _status(first)[0][1]
    ca = C.load_ca(ca_dir)
    assert stat.S_IMODE(os.stat(ca_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(ca_dir / "ca.key").st_mode) == 0o600
    key, cert = (d / "c.crt.key").read_text(), (d / "c.crt").read_text()
    assert stat.S_IMODE((d / "c.crt.key").stat().st_mode) == 0o600 and stat.S_IMODE(d.stat().st_mode) == 0o750
    assert C.issued_by(cert, ca) and set(C.cert_names(cert)) == {"main.test", "127.0.0.1"}
    assert "key: ***" in first.stdout
    _no_key(first, key, (ca_dir / "ca.key").read_text())

    again = _play(inv, pb)
    assert again.rc == 0 and _status(again)[0][0] == "ok", again.stdout
    assert (d / "c.crt").read_text() == cert

    # A certificate ending in 10 days (put there by hand) is renewed by the next run.
    near = C.issue_server_cert(ca, ["main.test", "127.0.0.1"], days=10)
    (d / "c.crt").write_text(near.cert_pem)
    (d / "c.crt.key").write_text(near.key_pem.reveal())
    renewed = _play(inv, pb)
    assert renewed.rc == 0 and "within 30 days" in _status(renewed)[0][1], renewed.stdout
    assert C.describe((d / "c.crt").read_text())["not_after"] > C.describe(near.cert_pem)["not_after"]

    # An interrupted install (the certificate's .new left behind) installs a new pair.
    (d / "c.crt.new").write_text("x")
    healed = _play(inv, pb)
    assert "interrupted" in _status(healed)[0][1] and not (d / "c.crt.new").exists(), healed.stdout

    # A rotated CA: re-issued by the new one; the old one no longer validates it.
    new = C.rotate_ca(ca_dir)
    rotated = _play(inv, pb)
    assert rotated.rc == 0 and "issued by another CA" in _status(rotated)[0][1], rotated.stdout
    cert = (d / "c.crt").read_text()
    assert C.issued_by(cert, new) and not C.issued_by(cert, ca)
    assert _status(_play(inv, pb))[0][0] == "ok"

    # Names changed: re-issued.
    inv2 = _inventory(cluster, tmp_path, "llama_server_tls_names=other.test", name="inventory.ini")
    named = _play(inv2, pb)
    assert "names changed" in _status(named)[0][1] and C.cert_names((d / "c.crt").read_text()) == ("other.test",)


def test_wrong_key_owner_mode_is_fixed(setup):
    cluster, inv, pb, d = setup
    assert _play(inv, pb).rc == 0
    os.chmod(d / "c.crt.key", 0o644)
    fixed = _play(inv, pb)
    assert _status(fixed)[0][0] == "changed" and "→ 600 root" in _status(fixed)[0][1]
    assert stat.S_IMODE((d / "c.crt.key").stat().st_mode) == 0o600


def test_llama_servers_earlier_tls_files_are_removed(setup):
    """Before the front, llama-server terminated TLS with llama-server.key/.crt in this directory: a
    deploy removes them (no second private key left on main), then changes nothing."""
    cluster, inv, pb, d = setup
    assert _play(inv, pb).rc == 0
    for name in ("llama-server.key", "llama-server.crt"):
        (d / name).write_text("earlier\n")
    cleaned = _play(inv, pb)
    assert _status(cleaned)[0][0] == "changed" and "llama-server's own TLS files" in _status(cleaned)[0][1], \
        cleaned.stdout
    assert sorted(p.name for p in d.iterdir()) == ["c.crt", "c.crt.key"]
    assert _status(_play(inv, pb))[0][0] == "ok"


def test_own_files_and_removal(setup, tmp_path):
    cluster, inv, pb, d = setup
    pki = C.ensure_ca(tmp_path / "pki")[0]
    own = C.issue_server_cert(pki, ["main.test", "127.0.0.1"])
    (tmp_path / "own.crt").write_text(own.cert_pem)
    (tmp_path / "own.key").write_text(own.key_pem.reveal())
    os.chmod(tmp_path / "own.key", 0o600)
    inv = _inventory(cluster, tmp_path, "llama_server_tls_cert_file=own.crt llama_server_tls_key_file=own.key "
                     f"llama_server_tls_ca_file={pki.cert_file}")
    first = _play(inv, pb)
    assert first.rc == 0 and _status(first)[0][0] == "changed", first.stdout
    assert (d / "c.crt").read_text().strip() == own.cert_pem.strip()
    assert (d / "c.crt.key").read_text() == own.key_pem.reveal()
    assert not (tmp_path / "inventory.ini.tls").exists()  # no CA of ours with your own files
    _no_key(first, own.key_pem.reveal())
    assert _status(_play(inv, pb))[0][0] == "ok"
    cfg = json.loads(tunnelspec("client-config", str(inv), "--format", "json").stdout)
    assert cfg["ca_file"] == str(pki.cert_file) and cfg["base_url"] == "https://main.test:8080/v1"

    # An own key others may read: refused by name, nothing installed.
    os.chmod(tmp_path / "own.key", 0o644)
    bad = _play(inv, pb)
    assert bad.rc == 1 and "too open" in bad.results("failed")[0]["msg"]
    os.chmod(tmp_path / "own.key", 0o600)

    # Back to loopback: the files go.
    loop = tmp_path / "loop.ini"
    loop.write_text(inv.read_text().replace("llama_server_public_bind=true", "llama_server_public_bind=false"))
    gone = _play(loop, pb)
    assert _status(gone)[0][0] == "changed" and not d.exists(), gone.stdout
    assert _status(_play(loop, pb))[0][0] == "ok"


def test_certs_rotate_refuses_own_files_and_loopback(setup, tmp_path):
    cluster, inv, pb, d = setup
    loop = tmp_path / "loop.ini"
    loop.write_text(inv.read_text().replace("llama_server_public_bind=true", "llama_server_public_bind=false"))
    r = tunnelspec("certs", "rotate", str(loop))
    assert r.rc == 2 and "no TLS to manage" in r.stderr


# ---- the real front with the installed pair, in front of the real llama-server --------------------
SERVED = """- hosts: main
  tasks:
    - name: served
      server_tls_served: {cert: "{{ root }}/tls/c.crt", timeout: 3}
"""


@pytest.mark.llama
def test_front_serves_the_installed_pair_pinned_through_ssh(setup, tmp_path, llama_bin, llama_fixtures):
    """The front (HAProxy, master-worker as its unit runs it) with `crt c.crt` finds the key the task
    installed at c.crt.key; verify's way in (TLS inside SSH, CA pinned) reaches llama-server through
    it. server_tls_served: ok once the front serves main's certificate; after a rotation re-issued the
    pair but before the front reloaded it, a failure naming both; after the reload, ok again."""
    import signal

    from support import front as front_proc
    from tunnelspec.components.front import model as front
    from tunnelspec.connection import ConnectOptions, connect
    from tunnelspec.core.constants import LOOPBACK
    from tunnelspec.inventory import load_inventory
    from support.localserver import free_port, spawn
    from tunnelspec.core import http
    from tunnelspec.components.tls.reach import ApiTls, Seen, api_opener

    if not os.path.exists(front.HAPROXY):
        pytest.skip("no haproxy (scripts/setup.sh installs it)")
    cluster, _, _, d = setup
    port = free_port()
    inv = _inventory(cluster, tmp_path, f"llama_server_port={port}")
    pb = tmp_path / "tls.yml"
    assert _play(inv, pb).rc == 0
    served_pb = tmp_path / "served.yml"
    served_pb.write_text(SERVED)
    llama_port = free_port()
    llama = spawn([llama_bin.llama_server, "-m", llama_fixtures.model_local, "--host", LOOPBACK, "--port",
                   str(llama_port), "-c", "256", "-t", "1"], tmp_path / "server.log")
    (tmp_path / "front").mkdir()
    cfg = front_proc.render(tmp_path / "front", llama_port, port, hold=30, tls_pem=str(d / "c.crt"))
    haproxy = spawn([front.HAPROXY, "-W", "-db", "-f", str(cfg)], tmp_path / "front" / "haproxy.log")
    ca_file = str(tmp_path / "inventory.ini.tls" / "ca.crt")
    other = C.ensure_ca(tmp_path / "other.tls")[0]
    inventory = load_inventory(str(inv))

    async def go():
        conn = await connect("m1", inventory.host_vars("m1"), ConnectOptions(), inventory.path.parent)
        try:
            seen = Seen()
            ok = api_opener(conn, port, LOOPBACK, ApiTls(ca_file, "main.test"), seen)
            await http.wait_health(ok, 120)  # the front holds /health until llama-server has loaded
            body = await http.completion(ok, "Hello", 4)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            try:
                await http.wait_health(api_opener(conn, port, LOOPBACK, ApiTls(str(other.cert_file), "main.test")), 60)
                wrong = "answered"
            except http.HttpError as e:
                wrong = str(e)
            fast = loop.time() - t0
            try:
                r = await http.request(http.ssh_opener(conn, port), "GET", "/health", timeout=10)
                plain = f"HTTP {r.status}"
            except http.HttpError as e:
                plain = f"error {e}"
            return seen.describe(), body, wrong, fast, plain
        finally:
            await conn.close()

    try:
        served, body, wrong, fast, plain = asyncio.run(go())
        first = _play(inv, served_pb)
        want = C.fingerprint((d / "c.crt").read_text())
        # A rotation re-issues main's pair; until the front reloads, it serves the old certificate.
        C.rotate_ca(tmp_path / "inventory.ini.tls")
        assert _play(inv, pb).rc == 0
        stale = _play(inv, served_pb)
        haproxy.proc.send_signal(signal.SIGUSR2)  # what `systemctl reload tunnelspec-front` sends
        reloaded = _play(inv, served_pb)
    finally:
        haproxy.stop()
        llama.stop()
    assert "content" in body
    assert served["names"] == ["main.test", "127.0.0.1"] and served["days_left"] >= 360 and not served["warning"]
    assert served["sha256"] == want
    assert "not trusted by the pinned CA" in wrong and fast < 30, (wrong, fast)  # no 60 s wait on a refusal
    assert not plain.startswith("HTTP 200"), plain
    assert first.rc == 0 and _status(first)[0] == ("ok", f"the front on 127.0.0.1:{port} serves {want} "
                                                         f"(CA {ca_file} pinned, name main.test)"), first.stdout
    assert stale.rc == 1 and "does not serve the certificate installed on main" in stale.results("failed")[0]["msg"]
    new = C.fingerprint((d / "c.crt").read_text())
    assert new != want and new in stale.results("failed")[0]["msg"], stale.stdout
    assert reloaded.rc == 0 and new in _status(reloaded)[0][1], reloaded.stdout + haproxy.log()[-2000:]
