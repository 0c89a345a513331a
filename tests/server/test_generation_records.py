"""Records are data, not instructions (docs/generations.md, "What a host checks before it acts"): a
generation is kept on main and each host acts on it as root, so a record that asks a host for what
the deploy never writes there — a digest that is a path, a setuid mode, a build outside
`<root>/build`, a file tunnelspec does not manage, another role or root than the inventory's — is
refused before anything changes; a serving file that is a link is never followed; `tunnelspec
rollback` applies the deploy's known-vulnerable gate to the build it brings back."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import subprocess
from types import SimpleNamespace

import pytest

from tunnelspec.commands import rollback as rb
from tunnelspec.components.generation import record as gen
from tunnelspec.components.generation import state as gen_state
from tunnelspec.components.generation import tasks as tg
from tunnelspec.components.generation import live as glive
from tunnelspec.components.generation import restore as grestore
from tunnelspec.components.generation import store as gstore
from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import TaskFailed
from tunnelspec.core.templating import render_value
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.engine.playbook import builtin_playbook, load_playbook
from tunnelspec.llama import advisories
from tunnelspec.modules.base import change
from tunnelspec.reporting.summary import Summary

ROOT = "/opt/t"
KEY = "0123456789abcdef"
SHA = "a" * 64
LLAMA_UNIT = f"{gen.UNIT_DIR}/{gen.LLAMA_UNIT}"
DRAFTWATCH = "/usr/local/lib/tunnelspec/tunnelspec-draftwatch"
STACK = f"{ROOT}/{gen.STACK_FILE}"


def _main(**over) -> dict:
    """Main's part of a generation as generation_record writes it: every managed path, 0644 but the
    draft watch's program (0755), one absent."""
    files = {p: {"sha256": SHA, "mode": "755" if p == DRAFTWATCH else "644"} for p in gen.managed_files("main", ROOT)}
    files[gen.FRONT_CONFIG] = None
    return {"role": "main", "root": ROOT, "build": f"{ROOT}/build/{KEY}", "files": files, **over}


def _refusal(want: dict, role: str = "main", root: str = ROOT) -> str:
    with pytest.raises(gen.RecordRefused) as e:
        gen.validate_host_record(want, role, root, "rpc-b", 7)
    return str(e.value)


def _with_file(path: str, **entry) -> dict:
    want = _main()
    want["files"][path] = {"sha256": SHA, "mode": "644", **entry}
    return want


# ---- the validator: pure -----------------------------------------------------------------------------
def test_the_records_the_deploy_writes_are_accepted():
    gen.validate_host_record(_main(), "main", ROOT, "main", 3)
    node = {"role": "rpc", "root": ROOT, "build": f"{ROOT}/build/{KEY}",
            "files": {f"{gen.UNIT_DIR}/{gen.RPC_UNIT}": {"sha256": SHA, "mode": "644"},
                      STACK: {"sha256": SHA, "mode": "644"}}}
    gen.validate_host_record(node, "rpc", ROOT, "rpc-a", 3)
    # A narrower mode grants nothing more; a record from before modes were kept ("") is written 0644.
    gen.validate_host_record(_with_file(LLAMA_UNIT, mode="600"), "main", ROOT, "main", 3)
    gen.validate_host_record(_with_file(LLAMA_UNIT, mode=""), "main", ROOT, "main", 3)


@pytest.mark.parametrize("digest", ["/etc/shadow", "../../../etc/shadow", "A" * 64, "a" * 63, "g" * 64,
                                    SHA + "\n", "", None, 7])
def test_a_digest_that_is_not_a_sha256_is_refused(digest):
    msg = _refusal(_with_file(LLAMA_UNIT, sha256=digest))
    assert msg.startswith("rpc-b: generation 7 is refused: its sha256 of " + LLAMA_UNIT + f" {digest!r} ")
    assert msg.endswith("(nothing was changed)")


@pytest.mark.parametrize("path,mode", [(LLAMA_UNIT, "4777"), (LLAMA_UNIT, "777"), (DRAFTWATCH, "2755"),
                                       (DRAFTWATCH, "4755"), (DRAFTWATCH, "1755"), (LLAMA_UNIT, "755"),
                                       (LLAMA_UNIT, "666"), (LLAMA_UNIT, "664"), (LLAMA_UNIT, "u+s"),
                                       (LLAMA_UNIT, "0644 "), (LLAMA_UNIT, 420)])
def test_a_mode_beyond_the_one_the_deploy_writes_is_refused(path, mode):
    msg = _refusal(_with_file(path, mode=mode))
    assert f"its mode of {path} {mode!r} is not within the mode tunnelspec writes it with" in msg
    assert "rpc-b" in msg and "generation 7" in msg and msg.endswith("(nothing was changed)")


@pytest.mark.parametrize("build", ["/tmp/x", f"{ROOT}/build/../x", f"{ROOT}/build/..", f"{ROOT}/build/.",
                                   f"{ROOT}/build/", f"{ROOT}/build", f"{ROOT}/build/{KEY}/../../etc",
                                   f"{ROOT}/build/a/b", f"{ROOT}/build/.hidden", f"/opt/tx/build/{KEY}",
                                   f"{ROOT}/build/{KEY}\n", "", None, [f"{ROOT}/build/{KEY}"]])
def test_a_build_that_is_not_directly_under_root_build_is_refused(build):
    msg = _refusal(_main(build=build))
    assert f"its build {build!r} is not a build directory directly under {ROOT}/build/" in msg
    assert msg.endswith("(nothing was changed)")


@pytest.mark.parametrize("path", ["/etc/shadow", "/root/.ssh/authorized_keys", f"{ROOT}/current",
                                  f"{gen.UNIT_DIR}/{gen.RPC_UNIT}", f"/opt/other/{gen.STACK_FILE}"])
def test_a_path_tunnelspec_does_not_manage_is_refused(path):
    msg = _refusal(_with_file(path))
    assert f"its file path {path!r} is not a file tunnelspec manages on a main host" in msg


def test_a_role_or_root_other_than_the_inventorys_is_refused():
    # The record says rpc (or another root); the inventory decides, and the record is refused.
    assert "its role 'main' is not the inventory's role of rpc-b (rpc)" in _refusal(_main(), role="rpc")
    assert "its role 'rpc' is not the inventory's role of rpc-b (main)" in _refusal(_main(role="rpc"))
    msg = _refusal(_main(), root="/srv/ts")
    assert "its root '/opt/t' is not the inventory's tunnelspec_root of rpc-b (/srv/ts)" in msg
    # A record whose root names another tree cannot move the build there either.
    assert "its root '/srv/ts'" in _refusal(_main(root="/srv/ts", build=f"/srv/ts/build/{KEY}"))


def test_a_record_of_the_wrong_shape_is_refused():
    assert "its record None is not a mapping" in _refusal(None)
    assert "its files ['x'] are not a mapping" in _refusal(_main(files=["x"]))
    assert f"its file {LLAMA_UNIT} 'x' is not a" in _refusal(_main(files={LLAMA_UNIT: "x"}))


# ---- the state script: a link is reported, never followed ------------------------------------------
def _state(root, *paths) -> dict:
    out = subprocess.run(["sh", "-c", gen_state.STATE_SCRIPT, "sh", str(root), *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout
    return gen_state.parse_state(out)


def test_a_serving_file_that_is_a_link_or_no_regular_file_is_reported_as_such(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0\n")
    secret.chmod(0o600)
    link, dangling, directory = tmp_path / "unit", tmp_path / "cfg", tmp_path / "dir"
    link.symlink_to(secret)
    dangling.symlink_to(tmp_path / "nowhere")
    directory.mkdir()
    files = _state(tmp_path, link, dangling, directory, secret)["files"]
    # Not the sum of what it points to, nor the link's own 777.
    assert files[str(link)] == {"kind": "link"} and files[str(dangling)] == {"kind": "link"}
    assert files[str(directory)] == {"kind": "other"}
    assert files[str(secret)] == {"sha256": hashlib.sha256(b"root:x:0:0\n").hexdigest(), "mode": "600"}
    # Never equal to a recorded file: a return replaces the link with the file (host_diff names it).
    recorded = {"build": "", "files": {str(link): {"sha256": files[str(secret)]["sha256"], "mode": "600"}}}
    assert gen.host_diff(recorded, {"build": "", "files": {str(link): files[str(link)]}}) == ["unit"]


def test_a_link_at_a_serving_path_is_not_recorded():
    state = {**_main(), "files": {**_main()["files"], gen.FRONT_CONFIG: {"kind": "link"}}}
    with pytest.raises(TaskFailed, match=r"main: /etc/tunnelspec/front.cfg is a symbolic link; .*nothing was recorded"):
        glive.recordable("main", state)
    with pytest.raises(TaskFailed, match=r"front.cfg is not a regular file"):
        glive.recordable("main", {**state, "files": {gen.FRONT_CONFIG: {"kind": "other"}}})
    # What a return would refuse is not recorded either (here a mode the deploy never writes).
    with pytest.raises(TaskFailed, match=r"main: its mode of .*'666' .*nothing was recorded"):
        glive.recordable("main", _with_file(LLAMA_UNIT, mode="666"))
    glive.recordable("main", _main())


def _store(store, *pairs) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", gstore.STORE_SCRIPT, "sh", str(store), *map(str, pairs)], capture_output=True, text=True)


def test_the_copies_are_never_taken_through_a_link(tmp_path):
    store, secret, unit = tmp_path / "files", tmp_path / "secret", tmp_path / "unit"
    secret.write_text("private\n")
    sha = hashlib.sha256(b"private\n").hexdigest()
    unit.symlink_to(secret)
    res = _store(store, sha, unit)
    assert res.returncode == 4 and f"{unit} is not a regular file" in res.stderr
    assert list(store.iterdir()) == []
    # A file is copied 0600 under its sum; one that changed since its sum was taken is refused, no copy left.
    unit.unlink()
    unit.write_text("private\n")
    assert _store(store, sha, unit).returncode == 0
    assert (store / sha).read_text() == "private\n" and stat.S_IMODE((store / sha).stat().st_mode) == 0o600
    other = tmp_path / "other"
    other.write_text("changed\n")
    res = _store(store, "b" * 64, other)
    assert res.returncode == 4 and "changed while it was recorded" in res.stderr
    assert sorted(p.name for p in store.iterdir()) == [sha]


# ---- generation_restore on a real local host: refused, nothing changed on disk --------------------------
class Node:
    """An rpc node in a temp dir: its root with a build and `current`, its stack record written as the
    source play writes it, the unit path and the file copies under the temp dir too (never this machine's)."""

    def __init__(self, tmp_path, monkeypatch):
        self.root = tmp_path / "root"
        self.build = self.root / "build" / KEY
        self.build.mkdir(parents=True)
        (self.build / ".tunnelspec-stamp").write_text("{}\n")
        (self.root / "current").symlink_to(self.build)
        self.unit = tmp_path / "etc" / gen.RPC_UNIT
        monkeypatch.setattr(gen, "RPC_FILES", {str(self.unit): ("restart", gen.RPC_UNIT)})
        self.store = tmp_path / "store"
        self.store.mkdir()
        monkeypatch.setattr(gen, "FILES_DIR", str(self.store))
        self.stack = self.root / gen.STACK_FILE
        self.stack.parent.mkdir(parents=True)
        self.text = json.dumps({"head": "c" * 40}) + "\n"
        conn = LocalConnection("rpc-a")
        asyncio.run(conn.put(self.text, str(self.stack), mode=0o644))      # as checkout.py writes it
        self.live = asyncio.run(glive.host_state(conn, "rpc", str(self.root)))
        # A copy in the store under its sum (what generation_record keeps), and a file elsewhere.
        self.sha = hashlib.sha256(self.text.encode()).hexdigest()
        (self.store / self.sha).write_text(self.text)
        self.evil = tmp_path / "evil"
        self.evil.write_text(json.dumps({"head": "d" * 40}) + "\n")
        cluster = SimpleNamespace(main=SimpleNamespace(name="main", root="/opt/tunnelspec"),
                                  rpc=[SimpleNamespace(name="rpc-a", root=str(self.root))])
        self.ctx = HostContext(host="rpc-a", conn=conn, vars={}, facts={}, options=RunOptions(),
                               emit=lambda e: None, task_name="node at the generation", cluster=cluster)

    def record(self, stack_entry: dict) -> dict:
        files = {**self.live["files"], str(self.stack): stack_entry}
        return {"n": 2, "hosts": {"rpc-a": {**self.live, "files": files}}}

    def on_disk(self) -> tuple:
        return (self.stack.read_bytes(), stat.S_IMODE(os.lstat(self.stack).st_mode),
                os.readlink(self.root / "current"), sorted(os.listdir(self.stack.parent)), self.unit.exists())


def test_the_live_state_of_a_node_is_a_record_it_accepts(tmp_path, monkeypatch):
    node = Node(tmp_path, monkeypatch)
    assert node.live["files"][str(node.stack)] == {"sha256": node.sha, "mode": "644"}
    gen.validate_host_record(node.live, "rpc", str(node.root), "rpc-a", 1)


@pytest.mark.parametrize("edit", ["absolute digest", "../ digest", "setuid mode"])
def test_an_edited_record_is_refused_by_the_node_with_nothing_changed(tmp_path, monkeypatch, edit):
    node = Node(tmp_path, monkeypatch)
    entry = {"absolute digest": {"sha256": str(node.evil), "mode": "644"},
             "../ digest": {"sha256": "../evil", "mode": "644"},
             "setuid mode": {"sha256": node.sha, "mode": "4777"}}[edit]
    # The node's stack record differs too, so an unchecked restore would write it.
    node.stack.write_text(json.dumps({"head": "e" * 40}) + "\n")
    before = node.on_disk()
    task = grestore.GenerationRestore.build({"record": node.record(entry)})
    with pytest.raises(TaskFailed) as e:
        asyncio.run(task.check(node.ctx))
    assert str(e.value).startswith("rpc-a: generation 2 is refused: its ")
    assert repr(entry["sha256"] if "digest" in edit else "4777") in str(e.value)
    assert str(e.value).endswith("(nothing was changed)")
    # apply checks again, before anything changes (the record is the task's argument: data from main).
    task._live = node.live
    with pytest.raises(TaskFailed, match=r"nothing was changed"):
        asyncio.run(task.apply(node.ctx, change("back to generation 2")))
    assert node.on_disk() == before


def test_a_record_naming_another_root_for_the_node_is_refused(tmp_path, monkeypatch):
    node = Node(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "build" / KEY).mkdir(parents=True)
    record = {"n": 2, "hosts": {"rpc-a": {**node.live, "root": str(elsewhere), "build": str(elsewhere / "build" / KEY)}}}
    before = node.on_disk()
    with pytest.raises(TaskFailed, match=r"rpc-a: generation 2 is refused: its root .* is not the inventory's "
                                         r"tunnelspec_root of rpc-a"):
        asyncio.run(grestore.GenerationRestore.build({"record": record}).check(node.ctx))
    assert node.on_disk() == before


def test_a_return_needs_the_build_and_the_copies_themselves_never_links(tmp_path, monkeypatch):
    """The checks made before anything changes (generation_restore's preconditions), called alone: they
    only read."""
    node = Node(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".tunnelspec-stamp").write_text("{}\n")
    (node.root / "build" / "fedcba9876543210").symlink_to(elsewhere)
    task = grestore.GenerationRestore.build({"record": node.record(node.live["files"][str(node.stack)])})
    files = gen.managed_files("rpc", str(node.root))

    def preconditions(want: dict) -> None:
        asyncio.run(task._preconditions(node.ctx, want, {**node.live, "files": {}}, files))

    preconditions({**node.live, "build": str(node.build)})
    with pytest.raises(TaskFailed, match=r"the build of generation 2 .*fedcba9876543210\) is gone"):
        preconditions({**node.live, "build": str(node.root / "build" / "fedcba9876543210")})
    # A copy in the store that is a link (to a file of the same sum, elsewhere): not a copy.
    (node.store / node.sha).unlink()
    (node.store / node.sha).symlink_to(node.evil.with_name("same"))
    node.evil.with_name("same").write_text(node.text)
    with pytest.raises(TaskFailed, match=r"the copy of .*tunnelspec-stack for generation 2 .* is missing"):
        preconditions(node.live)
    # A stack record whose HEAD is no commit's hash is never checked out (an option, a ref's name).
    for head in ("--orphan=x", "main", None):
        text = json.dumps({"head": head}) + "\n"
        sha = hashlib.sha256(text.encode()).hexdigest()
        (node.store / sha).write_text(text)
        with pytest.raises(TaskFailed, match=r"names no commit hash as its HEAD \(nothing was changed\)"):
            preconditions({**node.live, "files": {str(node.stack): {"sha256": sha, "mode": "644"}}})


# ---- generation_pick on main: every host's part, and the known-vulnerable gate -------------------------
def _pick(tmp_path, monkeypatch, build_number, vulnerable="refuse", accepted=(), node_over=None):
    root = tmp_path / "root"
    build = root / "build" / KEY
    build.mkdir(parents=True)
    (build / ".tunnelspec-stamp").write_text(json.dumps({"key": KEY, "build_number": build_number}))
    main = {"role": "main", "root": str(root), "build": str(build), "files": {}}
    node = {"role": "rpc", "root": "/opt/tunnelspec", "build": f"/opt/tunnelspec/build/{KEY}", "files": {},
            **(node_over or {})}
    record = {"n": 4, "tree": "f" * 40, "patches": [], "hosts": {"main": main, "rpc-a": node}}

    async def records(_conn):
        return {4: record}, 5

    monkeypatch.setattr(tg, "read_records", records)
    cluster = SimpleNamespace(main=SimpleNamespace(name="main", root=str(root), server_host="127.0.0.1",
                                                server_port=8080, tls=None),
                              rpc=[SimpleNamespace(name="rpc-a", root="/opt/tunnelspec")])
    ctx = HostContext(host="main", conn=LocalConnection("main"), vars={}, facts={},
                      options=RunOptions(accepted=frozenset(accepted)), emit=lambda e: None,
                      task_name="generation picked", cluster=cluster)
    task = tg.GenerationPick.build({"to": 4, "vulnerable": vulnerable})
    return asyncio.run(task.check(ctx)), ctx


def test_pick_refuses_a_node_part_edited_before_any_host_is_touched(tmp_path, monkeypatch):
    with pytest.raises(TaskFailed, match=r"rpc-a: generation 4 is refused: its build '/tmp/x' is not a build "
                                         r"directory directly under /opt/tunnelspec/build/ \(nothing was changed\)"):
        _pick(tmp_path, monkeypatch, 13000, node_over={"build": "/tmp/x"})


def test_rollback_refuses_a_known_vulnerable_build_unless_allowed(tmp_path, monkeypatch):
    # b8000: before the fix of GHSA-j8rj-fmpv-wcxw (b8492).
    with pytest.raises(TaskFailed) as e:
        _pick(tmp_path / "a", monkeypatch, 8000)
    assert str(e.value).startswith("refusing to return to generation 4: its build is a known-vulnerable llama.cpp "
                                   "build: b8000: GHSA-j8rj-fmpv-wcxw")
    assert "(nothing was changed)" in str(e.value) and "--allow-vulnerable-llama" in str(e.value)
    ch, ctx = _pick(tmp_path / "b", monkeypatch, 8000, accepted={advisories.ACCEPT_VULNERABLE})
    assert "WARNING known-vulnerable build allowed by --allow-vulnerable-llama: b8000" in ch.msg
    assert ctx.facts["generation"]["n"] == 4
    # A failed deploy's own return goes back to what served until it started: a warning.
    ch, _ = _pick(tmp_path / "c", monkeypatch, 8000, vulnerable="warn")
    assert "WARNING returning to the known-vulnerable build that served before the deploy: b8000" in ch.msg
    ch, _ = _pick(tmp_path / "d", monkeypatch, 13000)
    assert ch.msg.startswith("generation 4: ") and "WARNING" not in ch.msg
    ch, _ = _pick(tmp_path / "e", monkeypatch, None)
    assert "WARNING build number unknown" in ch.msg


def test_the_playbook_warns_only_in_a_failed_deploys_own_return():
    pick = next(t for t in load_playbook(builtin_playbook("rollback.yml")).plays[0].tasks
                if t.module == "generation_pick")
    # The engine gives both their settled value (cluster/schema.py settled): false and 0 when unset.
    assert render_value(pick.args, {"rollback_to": 2, "rollback_after_failed_deploy": False})["vulnerable"] == "refuse"
    assert render_value(pick.args, {"rollback_to": 0, "rollback_after_failed_deploy": True})["vulnerable"] == "warn"


def test_a_failed_deploys_return_says_so_to_the_playbook(monkeypatch):
    seen = []

    def run(_inv, _cluster, options, emit, _conn, _to, event=None):
        seen.append(options.extra_vars)
        return Summary(check=options.check)

    monkeypatch.setattr(rb, "_run", run)
    rb.after_failed_deploy("inv.ini", RunOptions(extra_vars={"x": "1"}), lambda e: None, None, None, [])
    assert seen and all(v == {"x": "1", "rollback_after_failed_deploy": True} for v in seen)


def test_rollback_passes_allow_vulnerable_llama_to_the_run(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from support.offline import unreachable_inventory
    from tunnelspec.cli.main import main as cli

    seen = []

    def rollback(_inv, _cluster, options, _emit, _conn, to=0):
        seen.append((options.accepted, to))
        return 0

    monkeypatch.setattr(rb, "rollback", rollback)
    inv = str(unreachable_inventory(tmp_path))
    for argv in (["rollback", inv, "--to", "2"], ["rollback", inv, "--to", "2", "--allow-vulnerable-llama"]):
        res = CliRunner().invoke(cli, argv)
        assert res.exit_code == 0, res.output
    assert seen == [(frozenset(), 2), (frozenset({advisories.ACCEPT_VULNERABLE}), 2)]
