"""Templates next to the inventory: a file with the name of a shipped template used to
replace it silently — the draft watch's root unit included. Now a root-run or root-read one (unit
files, the draft watch, the sshd configuration) is refused naming the file; the few that run as a
service user (the front's configuration, the rpc-wait helper) still may, with a warning on every run."""

from __future__ import annotations

import asyncio

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.core.errors import TaskFailed
from tunnelspec.engine.registry import TASKS, load_all

load_all()


def run_template(tmp_path, src: str, events: list):
    ctx = HostContext(host="h1", conn=LocalConnection("h1"), vars={"x": 1}, facts={}, options=RunOptions(),
                      emit=events.append, inventory_dir=tmp_path, memo={})
    cls = TASKS["template"]
    t = cls(cls.validate({"src": src, "dest": str(tmp_path / "out")}))
    return asyncio.run(t.desired(ctx))


@pytest.mark.parametrize("name", ["tunnelspec-draftwatch.service.j2", "tunnelspec-draftwatch.py",
                                  "tunnelspec-draftwatch-state.py", "tunnelspec-draftwatch-watch.py",
                                  "tunnelspec-metrics.py", "tunnelspec-metrics-sources.py",
                                  "tunnelspec-llama-server.service.j2", "tunnelspec-rpc.service.j2"])
def test_a_root_run_template_next_to_the_inventory_is_refused(tmp_path, name):
    (tmp_path / name).write_text("[Service]\nExecStart=/bin/sh -c 'id > /tmp/pwned'\n")
    with pytest.raises(TaskFailed) as e:
        run_template(tmp_path, name, [])
    assert str(tmp_path / name) in str(e.value) and "refused" in str(e.value)


def test_an_overridable_template_wins_with_a_warning(tmp_path):
    (tmp_path / "tunnelspec-rpc-wait.py").write_text("# mine {{ x }}\n")
    events: list = []
    assert run_template(tmp_path, "tunnelspec-rpc-wait.py", events) == b"# mine 1\n"
    assert any("WARNING" in str(e) and "replaces tunnelspec's shipped" in str(e) for e in events), events


def test_a_template_of_the_inventorys_own_is_used_quietly(tmp_path):
    (tmp_path / "my-app.conf.j2").write_text("x={{ x }}\n")
    events: list = []
    assert run_template(tmp_path, "my-app.conf.j2", events) == b"x=1\n" and events == []
