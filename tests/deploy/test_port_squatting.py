"""Port squatting in the lab: while a guarded port's own service is down, `nobody` binds it
— the draft node's RPC port, llama-server's internal port behind the front, the draft's tunnel port on
main. The services around it keep talking to that port (the tunnel, the front's health check and a
client's request with its API key, llama-server's launcher and the draft watch), and the squatter
receives no byte: its SYN-ACKs are turned into resets by the listen guards (facts/nft.py). `status`
names the port and who holds it, `deploy` refuses in its first, read-only play (nothing touched),
naming host, port, user and command; once the
squatter is gone a deploy serves with the draft again.

Every step ends with the lab deployed and serving with the draft, as it found it: the squatter is a
transient unit stopped by name, the stopped service is started again, a deploy converges."""

from __future__ import annotations


import pytest

from support import polling
from support.cli import failed_report, tunnelspec
from support.labdeploy import completion_on_main, converge, deploy, failures, sh

pytestmark = pytest.mark.lab

RPC_PORT = 50052
INTERNAL_PORT = 18080
DRAFT_NODE = "rpc-a"
DRAFT_TUNNEL_PORT = 15052
FRONT_PORT = 8080

# A squatter that answers 200 to everything and writes down each connection and what it received.
SQUATTER = r"""
import socket, sys
log = open(sys.argv[2], "a", buffering=1)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
log.write("listening\n")
while True:
    c, a = s.accept()
    log.write("accepted %r\n" % (a,))
    c.settimeout(2)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    log.write("data %r\n" % data)
    try:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    except OSError:
        pass
    c.close()
"""

CLIENT = r"""
import sys, urllib.request
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1], data=b'{"prompt": "secret", "max_tokens": 4}',
                             headers={"Content-Type": "application/json", "Authorization": "Bearer sk-squat-test-key"})
try:
    print(urllib.request.urlopen(req, timeout=float(sys.argv[2])).status)
except Exception as e:
    print("client:", type(e).__name__, e)
"""


poll = polling.poller(60.0, 0.5)


def serving_with_draft(lab) -> bool:
    body = completion_on_main(lab)
    return bool(body) and body["timings"].get("draft_n", 0) > 0


class Squatter:
    """`nobody` listening on 127.0.0.1:port of host, as a transient unit (stopped by its name)."""

    def __init__(self, lab, host: str, port: int):
        self.lab, self.host, self.port = lab, host, port
        self.unit = f"tunnelspec-test-squat-{port}"
        self.log = f"/tmp/tunnelspec-test-squat-{port}.log"

    def start(self) -> None:
        sh(self.lab, self.host, "rm", "-f", self.log)
        sh(self.lab, self.host, "systemd-run", f"--unit={self.unit}", "--collect", "--quiet", "-p", "User=nobody",
           "-p", "Group=nogroup", "python3", "-c", SQUATTER, str(self.port), self.log)
        assert poll(lambda: "listening" in self.text(), 30), f"the squatter never listened on {self.host}:{self.port}"

    def text(self) -> str:
        return sh(self.lab, self.host, "sh", "-c", f"cat {self.log} 2>/dev/null || :")

    def stop(self) -> None:
        sh(self.lab, self.host, "systemctl", "stop", self.unit)
        sh(self.lab, self.host, "systemctl", "reset-failed", self.unit)
        sh(self.lab, self.host, "rm", "-f", self.log)


@pytest.fixture
def deployed(lab):
    converge(lab.inventory)
    return lab


def _refused_naming(r, host: str, port: int) -> None:
    assert r.rc != 0, "deploy went through a squatted port"
    text = " ".join(str(f) for f in failures(r))
    for word in (host, f"port {port}", "user nobody", "python3"):
        assert word in text, (word, text[-3000:])
    # Refused by the first, read-only play: nothing was touched on any host.
    assert r.results("changed") == [], [(e["host"], e["task"]) for e in r.results("changed")]


def test_squatter_on_the_draft_nodes_rpc_port_gets_nothing_and_is_named(lab, deployed):
    sq = Squatter(lab, DRAFT_NODE, RPC_PORT)
    sh(lab, DRAFT_NODE, "systemctl", "stop", "tunnelspec-rpc.service")
    try:
        sq.start()
        # The rpc-server restarts (and cannot bind), llama-server restarts: its launcher, the tunnel
        # (sshd on the node, as the tunnel user) and the draft watch all knock on the squatted port.
        sh(lab, DRAFT_NODE, "systemctl", "start", "--no-block", "tunnelspec-rpc.service")
        sh(lab, "main", "systemctl", "restart", "--no-block", "tunnelspec-llama-server.service")
        poll(lambda: sh(lab, "main", "systemctl", "is-active", "tunnelspec-llama-server.service").strip() == "active"
             and completion_on_main(lab) is not None, 90)
        # Knock once more, through the tunnel, as llama-server's user would.
        sh(lab, "main", "setpriv", "--reuid=tunnelspec-llama", "--regid=tunnelspec-llama", "--clear-groups",
           "python3", "-c", "import socket\ntry:\n socket.create_connection(('127.0.0.1', %d), 5).sendall(b'x')\n"
           "except OSError as e:\n print(e)" % DRAFT_TUNNEL_PORT)
        assert sq.text().strip() == "listening", sq.text()

        st = tunnelspec("status", str(lab.inventory), timeout=300)
        assert f"port {RPC_PORT}" in st.stdout and "user nobody" in st.stdout, st.stdout
        r = deploy(lab.inventory)
        _refused_naming(r, DRAFT_NODE, RPC_PORT)
        assert sq.text().strip() == "listening", sq.text()
    finally:
        sq.stop()
        sh(lab, DRAFT_NODE, "systemctl", "start", "tunnelspec-rpc.service")
    r = deploy(lab.inventory)
    assert r.rc == 0, failures(r)
    assert poll(lambda: serving_with_draft(lab), 120), "not serving with the draft after the squatter left"


def test_squatter_on_llama_servers_internal_port_never_sees_a_client_request(lab, deployed):
    sq = Squatter(lab, "main", INTERNAL_PORT)
    sh(lab, "main", "systemctl", "stop", "tunnelspec-llama-server.service")
    try:
        sq.start()
        # The front's health checks and a client's request with its API key go to llama-server's port.
        out = sh(lab, "main", "python3", "-c", CLIENT, str(FRONT_PORT), "15", timeout=60)
        assert "200" not in out.split(), out
        assert sq.text().strip() == "listening", sq.text()
        st = tunnelspec("status", str(lab.inventory), timeout=300)
        assert f"port {INTERNAL_PORT}" in st.stdout and "user nobody" in st.stdout, st.stdout
        _refused_naming(deploy(lab.inventory), "main", INTERNAL_PORT)
        assert "sk-squat-test-key" not in sq.text() and sq.text().strip() == "listening", sq.text()
    finally:
        sq.stop()
        sh(lab, "main", "systemctl", "start", "tunnelspec-llama-server.service")
    converge(lab.inventory)
    assert poll(lambda: serving_with_draft(lab), 120)


def test_squatter_on_the_draft_tunnel_port_gets_nothing(lab, deployed):
    sq = Squatter(lab, "main", DRAFT_TUNNEL_PORT)
    unit = f"tunnelspec-tunnel-{DRAFT_NODE}.service"
    sh(lab, "main", "systemctl", "stop", unit)
    try:
        sq.start()
        sh(lab, "main", "systemctl", "start", "--no-block", unit)
        sh(lab, "main", "systemctl", "restart", "--no-block", "tunnelspec-llama-server.service")
        poll(lambda: completion_on_main(lab) is not None, 90)
        assert sq.text().strip() == "listening", sq.text()
        _refused_naming(deploy(lab.inventory), "main", DRAFT_TUNNEL_PORT)
        assert sq.text().strip() == "listening", sq.text()
    finally:
        sq.stop()
        sh(lab, "main", "systemctl", "start", unit)
    r = deploy(lab.inventory)
    assert r.rc == 0, failed_report(r)
    assert poll(lambda: serving_with_draft(lab), 120)
