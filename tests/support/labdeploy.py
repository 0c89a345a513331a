"""What the lab tests share: the lab's inventory with changes, deploys that must converge, one
task's event, and the proofs that llama-server on main serves with the remote draft."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from support.cli import tunnelspec

UNIT = "tunnelspec-llama-server.service"
MODELS_DIR = "/var/lib/tunnelspec/models"
DEPLOY_TIMEOUT = 3600  # a purged lab rebuilds (ccache makes it minutes, a cold cache ≈ 8 min)


def sh(lab, host: str, *argv: str, timeout: float = 90, input: str | None = None) -> str:
    return lab.exec(host, list(argv), input=input, timeout=timeout).stdout or ""


def main_pid(lab) -> int:
    return int(sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", UNIT).strip() or 0)


def inventory_copy(lab, tmp_path: Path, name: str = "inventory.ini", *, main_vars: dict | None = None,
                   host_vars: dict | None = None, drop: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> Path:
    """The lab's inventory with changes: `host_vars` = {host: "k=v ..."} appended to a host's line,
    `main_vars` in a [main:vars] section, `drop` removes lines starting with these prefixes."""
    lines = [l for l in lab.inventory.read_text().splitlines() if not l.startswith(drop)]
    for host, more in (host_vars or {}).items():
        lines = [f"{l} {more}" if l.split(" ", 1)[0] == host else l for l in lines]
    lines += list(extra)
    if main_vars:
        lines += ["", "[main:vars]", *(f"{k}={v}" for k, v in main_vars.items())]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def deploy(inventory, *args: str):
    return tunnelspec("deploy", str(inventory), "--format", "json", *args, timeout=DEPLOY_TIMEOUT)


def failures(r) -> list:
    """What to show when a run failed: failed/unreachable events and the tail of stderr."""
    return [e for e in r.events if e.get("status") in ("failed", "unreachable") or e.get("event") in
            ("unreachable", "error", "gate_failed")] + [r.stderr[-2000:]]


def converge(inventory) -> None:
    r = deploy(inventory)
    assert r.rc == 0, failures(r)


def wait_serving(inventory, mode: str, timeout: float) -> tuple[dict, float]:
    """`status`'s serving section once its mode is `mode` (polled every 2 s, failing after
    `timeout`), and how long that took."""
    t0 = time.monotonic()
    while True:
        r = tunnelspec("status", str(inventory), "--format", "json", timeout=180)
        sv = json.loads(r.stdout).get("serving") or {}
        if sv.get("mode") == mode:
            return sv, time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"not {mode} within {timeout}s: {sv}"
        time.sleep(2)  # poll interval of the deadline loop


def second_deploy_changes_nothing(lab, inventory) -> None:
    """Deploy again: exit 0, changed=0 on every host, llama-server's process the same."""
    pid = main_pid(lab)
    r = deploy(inventory)
    assert r.rc == 0, failures(r)
    changed = {h: c["changed"] for h, c in r.recap.items()}
    assert all(v == 0 for v in changed.values()), (changed, [e["task"] for e in r.results("changed")])
    assert main_pid(lab) == pid


def task(result, name: str, host: str = "main") -> dict:
    evs = [e for e in result.results() if e.get("task") == name and e.get("host") == host]
    assert len(evs) == 1, (name, host, [(e.get("task"), e.get("host")) for e in result.results()])
    return evs[0]


def completion_on_main(lab, port: int = 8080) -> dict | None:
    """One completion made on main itself (llama-server listens on its 127.0.0.1 only)."""
    script = (
        "import json,sys,urllib.request\n"
        "req=urllib.request.Request('http://127.0.0.1:%d/completion',data=json.dumps({'prompt':'Once upon a time',"
        "'n_predict':32,'temperature':0,'top_k':1,'cache_prompt':False}).encode(),"
        "headers={'Content-Type':'application/json'})\n"
        "try:\n print(urllib.request.urlopen(req,timeout=20).read().decode())\n"
        "except Exception as e:\n print(json.dumps({'error':str(e)}))\n" % port)
    out = sh(lab, "main", "python3", "-c", script).strip()
    try:
        body = json.loads(out.splitlines()[-1]) if out else None
    except ValueError:
        return None
    return body if body and "timings" in body else None


def verify_stats(result) -> tuple[int, int]:
    ev = next(e for e in result.results() if e.get("module") == "llama_verify")
    assert ev["status"] == "ok", ev
    m = re.search(r"draft_n=(\d+) draft_n_accepted=(\d+)", ev["msg"])
    assert m, ev["msg"]
    return int(m.group(1)), int(m.group(2))


def example_in_lab(example: Path, lab, model: Path | None = None) -> Path:
    """An example inventory on the lab: its own groups, placement and speculative settings kept as
    written, the hosts' addresses and the [all:vars] (keys, source) the lab's; the lab's draft model
    only when the example has one; `model` (a controller path, uploaded) as the target when given."""
    lab_text = Path(lab.inventory).read_text()
    lab_all = lab_text[lab_text.index("[all:vars]"):]
    ips = dict(re.findall(r"^(\S+) ansible_host=(\S+)", lab_text, re.M))
    text = example.read_text()
    if "llama_draft_model" not in text:
        lab_all = re.sub(r"^llama_draft_model=.*\n", "", lab_all, flags=re.M)
    if model is not None:
        lab_all = re.sub(r"^llama_model=.*$", f"llama_model={model}", lab_all, flags=re.M)
    text = re.sub(r"^llama_(draft_)?model=.*\n", "", text[:text.index("[all:vars]")], flags=re.M) + lab_all
    for host, ip in ips.items():
        text = re.sub(rf"^{re.escape(host)} ansible_host=\S+", f"{host} ansible_host={ip}", text, flags=re.M)
    out = Path(lab.dir) / f"example-{example.stem}.ini"
    out.write_text(text)
    return out


def running_argv(lab, unit: str = UNIT) -> list[str]:
    """The command line the unit's main process runs now (its /proc cmdline: whatever launched it)."""
    pid = int(sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", unit).strip() or 0)
    assert pid, f"{unit} has no main process"
    return [a for a in sh(lab, "main", "cat", f"/proc/{pid}/cmdline").split("\0") if a]


MODES = "/etc/tunnelspec/llama-server.json"
FRONT_CONFIG = "/etc/tunnelspec/front.cfg"


def configured_cmdline(lab, mode: str = "speculative") -> str:
    """llama-server's command line as the deploy configured it (the launcher's modes file; the unit
    runs the launcher), joined with spaces; '' when not deployed."""
    import shlex

    raw = lab.exec("main", ["cat", MODES], timeout=30).stdout or ""
    if not raw.strip():
        return ""
    argv = (json.loads(raw)["modes"].get(mode)) or []
    return shlex.join(argv)
