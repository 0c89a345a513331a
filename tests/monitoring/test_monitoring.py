"""The alert rules, their unit tests and the dashboard shipped in monitoring/ (docs/metrics.md):
`promtool check rules` and `promtool test rules` (Debian's prometheus package, scripts/setup.sh),
and every metric the rules and the dashboard name is one the exporter documents or one llama-server
b11434 serves."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MON = REPO / "monitoring"
RULES = MON / "tunnelspec.rules.yml"
RULES_TEST = MON / "tunnelspec.rules.test.yml"
DASHBOARD = MON / "tunnelspec.dashboard.json"
DOC = REPO / "docs" / "metrics.md"

# llama-server's own /metrics (b11434, tools/server/server-task.cpp to_metrics(); the exporter passes
# them through). Read from the lab's tree when it is on this machine (test below).
LLAMA_METRICS = {
    "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total",
    "llamacpp:n_tokens_max", "llamacpp:spec_decode_num_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_drafts_total",
    "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing",
    "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode",
    "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
}
# Prometheus' own series for a scrape target.
PROMETHEUS_SERIES = {"up"}


def exporter():
    loader = importlib.machinery.SourceFileLoader("tunnelspec_metrics", str(REPO / "tunnelspec" / "hostprogs" / "metrics.py"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian's prometheus package: scripts/setup.sh installs it)")
    return path


def test_promtool_check_rules():
    res = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_test_rules():
    res = subprocess.run([promtool(), "test", "rules", RULES_TEST.name], capture_output=True, text=True,
                         timeout=120, cwd=MON)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_a_unit_test():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    tested = {t["alertname"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for t in case.get("alert_rule_test", [])}
    assert alerts == tested
    # ...with at least one case where it fires.
    firing = {t["alertname"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert alerts == firing


_TOKEN = re.compile(r"(?<![A-Za-z0-9_:$])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The series names in a PromQL expression: ours, llama-server's, and Prometheus' `up`."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    names = set(_TOKEN.findall(expr))
    return {n for n in names if n.startswith(("tunnelspec_", "llamacpp:"))} | (
        {"up"} if re.search(r"(?<![A-Za-z0-9_:])up\s*\{", expr) else set())


def rule_exprs():
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dash["templating"]["list"] if v.get("type") == "query"]
    return exprs


def test_metric_names_parser():
    assert metric_names('rate(llamacpp:spec_decode_num_draft_tokens_total{instance=~"$instance"}[5m]) '
                        '/ tunnelspec_tunnel_up') == {"llamacpp:spec_decode_num_draft_tokens_total",
                                                     "tunnelspec_tunnel_up"}


def test_rules_and_dashboard_name_only_documented_metrics():
    known = set(exporter().METRICS) | LLAMA_METRICS | PROMETHEUS_SERIES
    for where, exprs in (("rules", rule_exprs()), ("dashboard", dashboard_exprs())):
        assert exprs, where
        for expr in exprs:
            names = metric_names(expr)
            assert names, (where, expr)
            unknown = names - known
            assert not unknown, f"{where}: {expr!r} names {sorted(unknown)}, not in the exporter's documented set"


def test_dashboard_is_grafana_json():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "tunnelspec" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["type"] == "prometheus" and p["targets"], p["title"]


def test_llama_metrics_are_b11434s():
    """The llamacpp:* names above are the ones the pinned tree's server prints (when the lab's tree is here)."""
    trees = sorted(Path("/var/lib/tunnelspec-lab").glob("*/main/root/opt/tunnelspec/src/llama.cpp/tools/server/server-task.cpp"))
    if not trees:
        pytest.skip("no llama.cpp tree of the lab on this machine")
    text = trees[0].read_text()
    body = text[text.index("server_task_result_metrics::to_metrics"):]
    body = body[:body.index("return prometheus.str()")]
    names = {"llamacpp:" + n for n in re.findall(r'^\s*"([a-z_]+)",\s*$', body, re.M)}
    names |= {"llamacpp:" + n for n in re.findall(r'llamacpp:([a-z_]+)', body)}
    assert LLAMA_METRICS == names


def test_docs_name_every_metric_and_alert():
    doc = DOC.read_text()
    for name in exporter().METRICS:
        assert f"`{name}`" in doc, name
    for g in yaml.safe_load(RULES.read_text())["groups"]:
        for r in g["rules"]:
            assert f"`{r['alert']}`" in doc, r["alert"]


def test_monitoring_files_are_packaged():
    link = REPO / "tunnelspec" / "data" / "monitoring"
    assert link.resolve() == MON.resolve()
    for f in (RULES, RULES_TEST, DASHBOARD):
        assert (link / f.name).is_file()


def test_the_docs_scrape_config_is_valid_prometheus(tmp_path):
    """docs/metrics.md's scrape configuration, as written (its files stood in by empty ones here)."""
    block = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)[0]
    cfg = yaml.safe_load(block)
    job = cfg["scrape_configs"][0]
    assert job["job_name"] == "tunnelspec" and job["scheme"] == "https"
    assert job["authorization"]["type"] == "Bearer" and "credentials_file" in job["authorization"]
    job["tls_config"]["ca_file"] = str(tmp_path / "ca.crt")
    job["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "token").write_text("x\n")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    res = subprocess.run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
