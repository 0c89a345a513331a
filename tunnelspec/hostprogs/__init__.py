"""The programs tunnelspec installs on the hosts and that run there, not on the controller.

Each module here is one whole program: the deploy copies the file as it is (through the `template`
task, which finds these by the name the playbooks give them) to /usr/local/lib/tunnelspec/ on main,
where systemd or llama-server's launcher runs it with the host's own python3. So each file:
- imports the standard library only, never tunnelspec (the package is not on the hosts);
- runs on every python3 a supported host has: Debian bullseye's 3.9 up to trixie's 3.13 (ruff
  checks these files with a py39 target, see pyproject.toml);
- stays one self-contained file, even past the package's 400-line limit for a module (see
  tests/test_layout.py): splitting one would need a bundler on the way to the host.
The only link between them is on the host: the draft watch loads the rpc-wait helper installed
next to it (one HELLO probe implementation).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# The name each program has in the playbooks (`template: src: ...`) and on the host (without .py),
# and the module that holds it.
PROGRAMS = {
    "tunnelspec-draftwatch.py": "draftwatch.py",
    "tunnelspec-metrics.py": "metrics.py",
    "tunnelspec-rpc-wait.py": "rpc_wait.py",
}


def program_path(name: str) -> Path | None:
    """The source of host program `name` (its playbook name), or None when `name` is not one."""
    module = PROGRAMS.get(name)
    return HERE / module if module else None
