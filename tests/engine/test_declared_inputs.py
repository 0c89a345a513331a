"""A task reads its declared arguments and, only when its class says `reads_cluster`, the typed cluster
view: the executor gives no cluster to a task that does not declare it (a real run, local
connections), and every registered module's declaration matches its source."""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
from pathlib import Path

import pytest

from tunnelspec.cluster.model import Cluster
from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import load_playbook
from tunnelspec.engine.registry import load_all
from tunnelspec.inventory import load_inventory
from tunnelspec.modules import TASKS, Arg, Task, ok, register_task

load_all()


class _Declares(Task):
    """Test-only module: reports the main host's name from the cluster it declares."""

    module = "test_declares_cluster"
    reads_cluster = True

    async def check(self, ctx):
        return ok(f"main is {ctx.require_cluster().main.name}")


class _Undeclared(Task):
    """Test-only module: reads the cluster without declaring it."""

    module = "test_undeclared_cluster"
    args = {"how": Arg(str, default="require", choices=("require", "attribute"), help="How it reads.")}

    async def check(self, ctx):
        if self.p["how"] == "attribute":
            return ok(f"cluster: {ctx.cluster}")
        return ok(f"main is {ctx.require_cluster().main.name}")


INVENTORY = """[main]
main-host ansible_connection=local

[rpc]
node-a ansible_connection=local rpc_role=draft

[all:vars]
llama_repo=https://github.com/ggml-org/llama.cpp
llama_commit="0123456789abcdef0123456789abcdef01234567"
llama_model=/srv/models/target.gguf
llama_draft_model=/srv/models/draft.gguf
"""


def run(tmp_path: Path, tasks: str) -> list[dict]:
    for cls in (_Declares, _Undeclared):
        register_task(cls)
    try:
        (tmp_path / "inv.ini").write_text(INVENTORY)
        (tmp_path / "play.yml").write_text(f"- hosts: main\n  tasks:\n{tasks}")
        inv = load_inventory(tmp_path / "inv.ini")
        events: list[dict] = []
        r = Run(inv, RunOptions(), events.append, cluster=Cluster.from_inventory(inv))
        asyncio.run(r.run_playbook(load_playbook(tmp_path / "play.yml")))
        return [e for e in events if e["event"] == "task_result"]
    finally:
        for cls in (_Declares, _Undeclared):
            TASKS.pop(cls.module, None)


def test_a_declaring_task_reads_the_cluster_and_another_gets_none(tmp_path):
    res = run(tmp_path, "    - name: declares\n      test_declares_cluster: {}\n"
                        "    - name: looks at the attribute\n      test_undeclared_cluster: {how: attribute}\n")
    assert [(r["status"], r["msg"]) for r in res] == [("ok", "main is main-host"), ("ok", "cluster: None")]
    res = run(tmp_path, "    - name: reads anyway\n      test_undeclared_cluster: {}\n")
    assert res[0]["status"] == "failed"
    assert "reads the cluster, and its module does not declare reads_cluster" in res[0]["msg"]


# ---- every module's declaration matches what its source reads -------------------------------------
def _reads_cluster(node: ast.AST, readers: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in ("cluster", "require_cluster") and \
                isinstance(n.value, ast.Name) and n.value.id == "ctx":
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in readers:
            return True
    return False


def _module_readers(tree: ast.Module) -> set[str]:
    """The module-level functions of a file that read the cluster from a ctx, directly or through
    another such function of the same file."""
    funcs = {f.name: f for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    readers: set[str] = set()
    while True:
        more = {name for name, f in funcs.items() if name not in readers and _reads_cluster(f, readers)}
        if not more:
            return readers
        readers |= more


@pytest.mark.parametrize("module", sorted(load_all()))
def test_reads_cluster_is_declared_exactly_where_the_source_reads_it(module):
    cls = TASKS[module]
    tree = ast.parse(Path(inspect.getsourcefile(cls)).read_text())
    body = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    reads = _reads_cluster(body, _module_readers(tree))
    assert reads == cls.reads_cluster, (
        f"{module} ({cls.__name__}) {'reads' if reads else 'does not read'} the cluster; "
        f"reads_cluster is {cls.reads_cluster}")
