"""Run the real CLI in a subprocess and parse its JSON events."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict]:
        return [json.loads(l) for l in self.stdout.splitlines() if l.startswith("{")]

    def results(self, status: str | None = None) -> list[dict]:
        return [e for e in self.events if e.get("event") == "task_result" and (status is None or e["status"] == status)]

    @property
    def recap(self) -> dict:
        return next(e for e in self.events if e.get("event") == "recap")["hosts"]


# Set by tests/conftest.py for each test: True in the unit tier, whose CLI runs go through the fork
# server (support/zygote.py: the same CLI code without an interpreter start per run).
FORK = False
# Read by tunnelspec when its modules are imported: a run that sets one needs a fresh interpreter.
_IMPORT_TIME_ENV = ("TUNNELSPEC_TEST_KILL_AT", "TUNNELSPEC_LAB_CCACHE")


def _clean_env() -> dict:
    """This process's environment without the caller's TUNNELSPEC_* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}


def tunnelspec(*args: str, env: dict | None = None, timeout: float = 300, cwd=None) -> CliResult:
    e = _clean_env()
    e.update(env or {})
    if FORK and not any(k in e for k in _IMPORT_TIME_ENV):
        return _forked([str(a) for a in args], e, timeout, cwd)
    p = subprocess.run([sys.executable, "-m", "tunnelspec", *args], capture_output=True, text=True, env=e,
                       timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
    return CliResult(p.returncode, p.stdout, p.stderr)


_server: dict = {}


def _zygote_socket() -> str:
    """The fork server of this test process, started at its first use; it ends when this process does
    (its stdin closes), and atexit stops it by PID first."""
    if "path" not in _server:
        import atexit
        import tempfile

        d = tempfile.mkdtemp(prefix="tunnelspec-zygote-")
        path = os.path.join(d, "sock")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = _clean_env()
        env["PYTHONPATH"] = os.pathsep.join([here, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        proc = subprocess.Popen([sys.executable, "-m", "support.zygote", path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=here)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready", "the fork server did not start"

        def stop() -> None:
            proc.kill()
            proc.wait(timeout=10)
            import shutil

            shutil.rmtree(d, ignore_errors=True)

        atexit.register(stop)
        _server.update(path=path, proc=proc, dir=d)
    return _server["path"]


def _forked(argv: list[str], env: dict, timeout: float, cwd) -> CliResult:
    import socket
    import tempfile

    path = _zygote_socket()
    with tempfile.TemporaryDirectory(dir=_server["dir"]) as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        req = {"argv": argv, "env": env, "cwd": str(cwd) if cwd is not None else os.getcwd(), "out": out,
               "err": err, "timeout": timeout}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout + 30)
            s.connect(path)
            s.sendall((json.dumps(req) + "\n").encode())
            reply = json.loads(s.makefile("rb").readline())
        if reply.get("timeout"):
            raise subprocess.TimeoutExpired([sys.executable, "-m", "tunnelspec", *argv], timeout)
        with open(out, encoding="utf-8", errors="replace") as f_out, open(err, encoding="utf-8",
                                                                          errors="replace") as f_err:
            return CliResult(reply["rc"], f_out.read(), f_err.read())


def make_repo(path) -> str:
    """A local git repo with one commit; returns the commit SHA."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    subprocess.run(["git", "init", "-q", str(path)], check=True, env=env)
    (path / "README").write_text("hello\n")
    subprocess.run(["git", "-C", str(path), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-qm", "one"], check=True, env=env)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def generic8_inventory(cluster, tmp_path, monkeypatch):
    """An inventory for data/generic8.yml on an sshd_cluster (a local repo, its pinned commit, the
    template beside it), with no TUNNELSPEC_* variables of the caller's environment."""
    import shutil
    from pathlib import Path

    repo = tmp_path / "repo"
    commit = make_repo(repo)
    shutil.copy(Path(__file__).resolve().parents[1] / "engine" / "data" / "app.conf.j2", cluster.base / "app.conf.j2")
    for name in [k for k in os.environ if k.startswith("TUNNELSPEC_")]:
        monkeypatch.delenv(name)
    return cluster.inventory(all_vars={"repo": str(repo), "commit": commit})


def failed_report(res, stderr_tail: int = 2000) -> str:
    """An assertion message for a run that should have passed: each failed or unreachable result
    (host, task, module and the whole message), a failed gate or an error, the recap, and the end
    of stderr. A run without JSON events (no --format json) shows the end of its stdout instead."""
    events = res.events
    lines = [f"exit code {res.rc}"]
    for e in events:
        kind = e.get("event")
        if kind == "task_result" and e.get("status") in ("failed", "unreachable"):
            lines.append(f"{e['status'].upper()} {e.get('host')} | {e.get('task')} [{e.get('module', '-')}]:\n"
                         f"{e.get('msg')}")
        elif kind == "unreachable":
            lines.append(f"UNREACHABLE {e.get('host')} | {e.get('task', '-')}:\n{e.get('msg')}")
        elif kind == "gate" and e.get("status") == "failed":
            lines.append(f"GATE FAILED {e.get('play')}:\n{e.get('msg')}")
        elif kind == "error":
            lines.append(f"ERROR (exit {e.get('exit_code')}):\n{e.get('msg')}")
    recaps = [e for e in events if e.get("event") == "recap"]
    if recaps:
        lines.append("recap: " + "; ".join(f"{h} " + " ".join(f"{k}={v}" for k, v in c.items())
                                           for h, c in recaps[-1]["hosts"].items()))
    if not events:
        lines.append("stdout (end):\n" + res.stdout[-stderr_tail:])
    lines.append("stderr (end):\n" + res.stderr[-stderr_tail:])
    return "\n".join(lines)


# The deploy's preflight play (playbooks/hosts.yml): what may run before a refusal stops the deploy
# (its tasks, and its gate, which reports the hosts it stops).
HOSTS_PLAY_TASKS = {"host facts", "llama-server settings against the pinned build", "prerequisites can be met",
                    "every host can be served"}


def tasks_run(human_stdout: str) -> list[tuple[str, str, str]]:
    """(status, host, task) of every task result in a deploy's human output."""
    return re.findall(r"^(ok|changed|failed|would change): \[([^\]]+)\] (.+?)(?: — .*)?$", human_stdout, re.M)
