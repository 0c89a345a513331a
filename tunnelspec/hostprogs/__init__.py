"""The programs tunnelspec installs on the hosts and that run there, not on the controller.

The deploy copies each file here as it is (through the `template` task, which finds them by the name
the playbooks give them, see PROGRAMS) to /usr/local/lib/tunnelspec/ on main, where systemd or
llama-server's launcher runs it with the host's own python3. So every file:
- imports the standard library only, never tunnelspec (the package is not on the hosts);
- runs on every python3 a supported host has: Debian bullseye's 3.9 up to trixie's 3.13 (ruff
  checks these files with a py39 target, see pyproject.toml);
- stays under the package's 400-line limit for a module (tests/test_layout.py), like any other.

A program too long for one file is a main file plus parts (PARTS), each installed next to it by a
task of its own, same directory and mode. Parts are found the one way the rpc-wait helper already
was: by path next to the running file (`__file__`), under the installed name (no .py) and, where that
is absent (tests run the source tree), the module's name here; loaded with a SourceFileLoader, never
through sys.path. The program's file loads its parts afresh at each load and registers each one in
sys.modules under a fixed name (tunnelspec_<program>_<part>), so that a part needing another finds
the one its program loaded just before (a part never runs on its own, so it loads nothing itself). The main file then binds what it uses from the parts as names of its own: a test
that replaces `mod.unit_state` changes what the main file's own functions call (the parts call their
own names), so the functions tests drive through patched names stay in the main file (the launcher,
the exporter's serving).

- tunnelspec-draftwatch: the launcher (llama-server's ExecStart) and the main file; its parts are
  -state (the modes, the mode file, the watcher's files, systemd and HELLO queries) and -watch (the
  watchers). The state part loads the rpc-wait helper the same way (one HELLO probe
  implementation).
- tunnelspec-metrics: serving /metrics; its part -sources reads and renders one scrape.
- tunnelspec-rpc-wait: one file.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# The name each host file has in the playbooks (`template: src: ...`) and on the host (without .py),
# and the module that holds it: the programs and their parts alike.
PROGRAMS = {
    "tunnelspec-draftwatch.py": "draftwatch.py",
    "tunnelspec-draftwatch-state.py": "draftwatch_state.py",
    "tunnelspec-draftwatch-watch.py": "draftwatch_watch.py",
    "tunnelspec-metrics.py": "metrics.py",
    "tunnelspec-metrics-sources.py": "metrics_sources.py",
    "tunnelspec-rpc-wait.py": "rpc_wait.py",
}

# Each program that has parts: its parts' names, in the order it loads them.
PARTS = {
    "tunnelspec-draftwatch.py": ("tunnelspec-draftwatch-state.py", "tunnelspec-draftwatch-watch.py"),
    "tunnelspec-metrics.py": ("tunnelspec-metrics-sources.py",),
}


def program_path(name: str) -> Path | None:
    """The source of host file `name` (its playbook name), or None when `name` is not one."""
    module = PROGRAMS.get(name)
    return HERE / module if module else None


def program_source(name: str) -> str:
    """Program `name`'s whole source: its main file, then its parts' (for reading it as one)."""
    paths = [program_path(n) for n in (name, *PARTS.get(name, ()))]
    return "\n\n".join(p.read_text() for p in paths if p is not None)
