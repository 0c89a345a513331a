"""The loopback isolation rules (tunnelspec/facts/nft.py) loaded by the real nft into a private
network namespace of this machine (`unshare -n`: its own loopback, nothing of the machine's network):
the file loads and reloads, the parser reads back exactly the rules it wrote and notices a foreign
one, and the kernel refuses exactly the users the rules name — over 127.0.0.1, ::1 and
::ffff:127.0.0.1 — while root and the allowed uid connect."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunnelspec.facts import nft

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="needs root on Linux (a private network namespace)")

PORT = 50052
ALLOWED = 4242

SCENARIO = r"""
set -e
ip link set lo up
nft -f "$1"
nft -f "$1"           # a reload replaces the table (no duplicate rules)
echo "== json"; nft -j list table inet tunnelspec
"$4" - "$2" <<'PY' &
import socket, sys, time
a = socket.socket(); a.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); a.bind(("127.0.0.1", int(sys.argv[1]))); a.listen(16)
b = socket.socket(socket.AF_INET6); b.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1); b.bind(("::1", int(sys.argv[1]))); b.listen(16)
time.sleep(20)
PY
listener=$!
i=0; while ! ss -Hltn | grep -q "\[::1\]:$2"; do i=$((i+1)); [ $i -lt 100 ] || exit 9; sleep 0.1; done
echo "== connect"
for uid in 0 65534 "$3"; do
  setpriv --reuid="$uid" --regid="$uid" --clear-groups "$4" -c '
import errno, os, socket, sys
for a in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
    s = socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET); s.settimeout(5)
    rc = s.connect_ex((a, int(sys.argv[1])))
    print(os.getuid(), a, "ok" if rc == 0 else errno.errorcode.get(rc, rc))
' "$2"
done
echo "== foreign"
nft add rule inet tunnelspec output tcp dport 1 accept
nft -j list table inet tunnelspec
kill "$listener" 2>/dev/null || :
"""


def _sections(text: str) -> dict[str, str]:
    out, cur = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            cur = line[3:]
            out[cur] = ""
        elif cur:
            out[cur] += line + "\n"
    return out


def test_rules_load_parse_back_and_refuse_exactly_the_others(tmp_path):
    assert shutil.which("nft"), "nftables is installed by scripts/setup.sh"
    rules = nft.rules_for([PORT], [ALLOWED], "rpc port: tunnel user only")
    path = tmp_path / "isolation.nft"
    path.write_text(nft.ruleset_text(rules, "test"))
    # The system python: the other uids may not be able to read a virtualenv under /root.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
    res = subprocess.run(["unshare", "-n", "sh", "-c", SCENARIO, "sh", str(path), str(PORT), str(ALLOWED), python],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    s = _sections(res.stdout)
    live = nft.parse_live(s["json"])
    assert live.present and live.chain_ok and live.foreign == 0
    assert live.rules == rules and nft.matches(live, rules)
    got = {tuple(l.split()[:2]): l.split()[2] for l in s["connect"].splitlines()}
    for addr in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert got[("0", addr)] == "ok"
        assert got[(str(ALLOWED), addr)] == "ok"
        assert got[("65534", addr)] == "ECONNREFUSED"
    changed = nft.parse_live(s["foreign"])
    assert changed.foreign == 1 and not nft.matches(changed, rules)
    assert changed.rejected == 3     # nobody's three refused SYNs, counted


def test_parser_rejects_what_is_not_our_table():
    assert not nft.parse_live("").present
    assert not nft.parse_live('{"nftables": [{"metainfo": {}}]}').present
    other = nft.rules_for([PORT], [ALLOWED + 1], "x")
    mine = nft.rules_for([PORT], [ALLOWED], "x")
    assert other != mine and nft.describe(mine) == f"tcp/{PORT} uids 0,{ALLOWED}"


@pytest.mark.parametrize("capture", sorted((Path(__file__).parent / "data").glob("nft-*.json")),
                         ids=lambda p: p.stem)
def test_live_tables_of_every_release_parse_back(capture):
    """`nft -j list table inet tunnelspec` as Debian 11, 12 and 13 print the same loaded rules (captured
    from lab hosts): nftables 1.0.x writes the flags mask as a list, 0.9.x and 1.1.x as {"|": [...]}."""
    live = nft.parse_live(capture.read_text())
    assert live.present and live.chain_ok and live.foreign == 0, live
    assert len(live.rules) >= 1 and all(r.uids[0] == 0 and len(r.uids) == 2 for r in live.rules), live
