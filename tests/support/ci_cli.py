"""Run the CLI the way CI does: no tty (own session, stdin /dev/null), no ssh-agent, an empty
HOME (so no ~/.ssh key or known_hosts can help), credentials only from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.cli import CliResult


class Run(CliResult):
    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    @property
    def recap(self) -> dict:
        return self.of("recap")[-1]["hosts"]


def ci_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNNELSPEC_", "SSH_")) and k not in ("HOME", "DISPLAY")}
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), NO_COLOR="1", **extra)
    return env


def cli(*args: str, env: dict, timeout: float = 300) -> Run:
    p = subprocess.run([sys.executable, "-c", "from tunnelspec.cli.main import main; main(prog_name='tunnelspec')",
                        *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                       start_new_session=True, timeout=timeout)
    return Run(p.returncode, p.stdout, p.stderr)
