"""SECURITY.md, invariant A, in the units the deploy installs: no line root runs — any Exec*= of a unit
without User= (or User=root), and an Exec*= with the `+` or `!` prefix in any unit — names a path in a
service-writable place (core/writable.py) or a file a service user owns (the API key, the scrape
token, the TLS key, the tunnel key); and systemd (root) opens no LoadCredential=/EnvironmentFile= path
inside a service-writable directory. Every unit template is rendered by the deploy's own tasks for
realistic inventories (tests/support/deploy_render.py). The metrics unit's old
`ExecStartPre=+-/bin/chmod 0644 /run/tunnelspec-llama/mode.json` is the planted case."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.deploy_render import ROOT
from support.invariants import protected_paths, root_exec_lines, root_path_findings

TEMPLATES = ROOT / "templates"


def findings(deploy) -> list[str]:
    protected = protected_paths(deploy.cluster)
    return [f"{f.host}:{f.dest}: {x}" for f in deploy.files if f.unit for x in root_path_findings(f.text, protected)]


@pytest.mark.parametrize("variant", ["lab", "lab-public", "lab-split", "example"])
def test_no_root_line_touches_a_service_writable_path(deploys, variant):
    assert findings(deploys[variant]) == []


def test_every_unit_template_is_rendered(deploys):
    """The check above is not vacuous: every unit template in templates/ is rendered by some variant,
    with the metrics, the draft watch, TLS and the scrape token each present in one."""
    rendered = {f.src for d in deploys.values() for f in d.files if f.unit}
    assert {p.name for p in TEMPLATES.glob("*.service.j2")} <= rendered
    units = {f.dest.rsplit("/", 1)[-1] for d in deploys.values() for f in d.files if f.unit}
    assert {"tunnelspec-metrics.service", "tunnelspec-draftwatch.service", "tunnelspec-isolation.service",
            "tunnelspec-rpc.service", "tunnelspec-tunnel-rpc-a.service"} <= units
    public = deploys["lab-public"].cluster.main
    assert public.tls is not None and public.front.metrics.token_file and public.api_key_file
    paths = {p.path for p in protected_paths(deploys["lab-public"].cluster)}
    assert {public.api_key_file, public.front.metrics.token_file, public.tls.key_path} <= paths


def test_root_lines_are_found(deploys):
    """Which lines root runs, in the real units: the watcher and the isolation unit (no User=) only."""
    d = deploys["lab"]
    root = {f.dest.rsplit("/", 1)[-1]: [x.key for x, _ in root_exec_lines(f.text)] for f in d.files if f.unit}
    assert {u: keys for u, keys in root.items() if keys} == {
        "tunnelspec-isolation.service": ["ExecStart", "ExecReload"],
        "tunnelspec-draftwatch.service": ["ExecStart"]}


# ---- planted cases: the same checker on units that break the invariant ------------------------------
def _metrics_unit(deploys) -> str:
    return deploys["lab"].file("main", "/etc/systemd/system/tunnelspec-metrics.service").text


def test_planted_the_old_chmod_through_llama_server_s_directory(deploys):
    text = _metrics_unit(deploys).replace(
        "ExecStart=", "ExecStartPre=+-/bin/chmod 0644 /run/tunnelspec-llama/mode.json\nExecStart=", 1)
    found = root_path_findings(text, protected_paths(deploys["lab"].cluster))
    assert len(found) == 1 and "ExecStartPre=+-/bin/chmod 0644 /run/tunnelspec-llama/mode.json: root runs chmod " \
        "/run/tunnelspec-llama/mode.json — inside /run/tunnelspec-llama, llama's RuntimeDirectory" in found[0], found


@pytest.mark.parametrize("line, words", [
    # A unit without User= runs everything as root.
    ("ExecStartPost=/bin/cat %t/tunnelspec-front/stats.sock", "root runs cat /run/tunnelspec-front/stats.sock"),
    # `!`: User= not applied.
    ("ExecStop=!/usr/bin/python3 -c 'open(\"/var/cache/tunnelspec-rpc/x\")'", "root runs python3 "),
    # The API key's file is its user's.
    ("ExecStartPre=+/bin/chown root /etc/tunnelspec/llama-api-key", "root runs chown /etc/tunnelspec/llama-api-key"),
    # systemd reads a credential as root.
    ("LoadCredential=mode:/run/tunnelspec-llama/mode.json", "systemd (root) opens /run/tunnelspec-llama/mode.json"),
])
def test_planted_root_lines_are_flagged(deploys, line, words):
    text = _metrics_unit(deploys)
    if not line.startswith("ExecStartPre=+") and not line.startswith("LoadCredential") and "!" not in line:
        text = text.replace("User=tunnelspec-front\n", "")
    text = text.replace("ExecStart=", line + "\nExecStart=", 1)
    found = root_path_findings(text, protected_paths(deploys["lab"].cluster))
    assert len(found) == 1 and words in found[0], found


def test_planted_a_path_that_only_starts_like_a_place_is_not_flagged(deploys):
    text = _metrics_unit(deploys).replace("ExecStart=", "ExecStartPre=+/bin/true /run/tunnelspec-llama-bench/x\nExecStart=", 1)
    assert root_path_findings(text, protected_paths(deploys["lab"].cluster)) == []


def test_the_templates_dir_is_the_shipped_one():
    assert (Path(__file__).resolve().parents[2] / "tunnelspec" / "data" / "templates").resolve() == TEMPLATES.resolve()
