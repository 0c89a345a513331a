"""`tunnelspec logs` on the deployed lab: the bundle holds each node's rpc-server banner,
llama-server's placement line for the draft on RPC<n>, and the unit files; an inventory secret
(also planted in a unit drop-in on a host, so the bundle really meets it) appears nowhere; with one
host's link cut the command still collects the others and names the unreachable one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.labdeploy import converge, inventory_copy

pytestmark = pytest.mark.lab

SECRET = "bundle-s3cr3t-4a7c1e"
DROPIN_DIR = "/etc/systemd/system/tunnelspec-rpc.service.d"


def files_of(bundle: Path) -> dict[str, str]:
    return {p.relative_to(bundle).as_posix(): p.read_text() for p in bundle.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    inv = inventory_copy(lab, tmp_path_factory.mktemp("logs"), extra=(f"bundle_api_token={SECRET}",))
    converge(inv)
    return inv


def test_bundle_holds_banners_placement_units_and_no_secret(lab, deployed, tmp_path):
    lab.exec("rpc-a", ["sh", "-c", f"mkdir -p {DROPIN_DIR} && printf '# token {SECRET}\\n' > "
                       f"{DROPIN_DIR}/zz-bundle-test.conf && systemctl daemon-reload"], timeout=60)
    try:
        bundle = tmp_path / "bundle"
        r = tunnelspec("logs", str(deployed), "--output", str(bundle), timeout=600)
    finally:
        lab.exec("rpc-a", ["sh", "-c", f"rm -rf {DROPIN_DIR} && systemctl daemon-reload"], timeout=60)
    assert r.rc == 0, r.stdout + r.stderr
    files = files_of(bundle)
    for node in ("rpc-a", "rpc-b"):
        assert re.search(r"Starting RPC server v\d+\.\d+\.\d+", files[f"{node}/journal/tunnelspec-rpc.service.log"])
        assert "ExecStart=" in files[f"{node}/units/tunnelspec-rpc.service"]
    # The planted drop-in was collected, with the secret masked.
    assert "# token ***" in files["rpc-a/units/tunnelspec-rpc.service"]
    placement = files["main/placement/tunnelspec-llama-server.service.log"]
    assert re.search(r"RPC0\[127\.0\.0\.1:15052\] model buffer size", placement), placement[-2000:]
    assert "tunnelspec-draftwatch launch" in files["main/units/tunnelspec-llama-server.service"]
    assert "--spec-type" in files["main/llama-server.json"] and '"mode": "speculative"' in files["main/mode.json"]
    assert "server llama 127.0.0.1:18080" in files["main/front.cfg"]
    assert any(n.startswith("main/journal/tunnelspec-front") for n in files), sorted(files)
    assert any(n.startswith("main/units/tunnelspec-tunnel-rpc-a") for n in files), sorted(files)
    assert "version:" in files["main/llama-server.txt"]
    assert '"rpc-a"' in files["status.json"]
    leaked = [name for name, text in files.items() if SECRET in text]
    assert not leaked and SECRET not in r.stdout + r.stderr, leaked
    # The one-screen summary: every host with its units, the load time and the draft acceptance.
    assert all(h in r.stdout for h in ("main", "rpc-a", "rpc-b")) and "UNREACHABLE" not in r.stdout
    assert re.search(r"model load [0-9.]+ s, \d+/\d+ draft tokens accepted", r.stdout), r.stdout


def test_bundle_with_a_host_cut_off(lab, deployed, tmp_path):
    lab.link("rpc-b", up=False)
    try:
        bundle = tmp_path / "bundle.tar.gz"
        r = tunnelspec("logs", str(deployed), "--output", str(bundle), timeout=900)
    finally:
        lab.link("rpc-b", up=True)
    assert r.rc == 4 and "unreachable: rpc-b" in r.stderr, r.stdout + r.stderr  # written, one host missing
    assert re.search(r"^rpc-b\s+UNREACHABLE", r.stdout, re.M), r.stdout
    import tarfile

    with tarfile.open(bundle) as tar:
        names = set(tar.getnames())
    assert "bundle/rpc-b/UNREACHABLE.txt" in names
    assert "bundle/rpc-a/journal/tunnelspec-rpc.service.log" in names
    assert "bundle/main/journal/tunnelspec-llama-server.service.log" in names
