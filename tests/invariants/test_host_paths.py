"""SECURITY.md, invariant A, in the code: every place in tunnelspec/ that spells a service-writable
directory (core/writable.py) — a string, an f-string, a join — or uses a constant that holds one
(FRONT_STATS, STATE_PATH, …, found by following module-level constants) is in the reviewed list
below with its reason; so is every playbook line that names one. New code that reaches into such a
directory fails here until someone reviews it and adds it with a reason (shown on a planted module).

And the programs root runs on main (tunnelspec/hostprogs/): the modes their header says root runs reach the
service-writable paths of their configuration (the keys whose value lies in such a place, read from
the configurations the deploy renders) only where listed: llama-server's mode file only through
`read_state`, which opens it with O_NOFOLLOW and never with open(). A program with parts (PARTS) is
read as one source, its main file then its parts: every host file is checked, the parts through the
program that loads them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from support.deploy_render import ROOT
from tunnelspec.hostprogs import PARTS, PROGRAMS, program_path, program_source
from support.invariants import (Ref, config_keys, holding_names, opens_only_without_following, path_refs,
                                program_modes, reachable, root_key_uses, yaml_refs)

# (module, scope) -> why it may name a service-writable place. `scope`: the function (dotted), or the
# module-level constant, "*" for the whole module. `via`: a word its source must contain (the safe
# reader it goes through), checked below.
CODE_REFS: dict[tuple[str, str], tuple[str, str]] = {
    ("tunnelspec/core/writable.py", "*"): ("the declaration itself", ""),
    **{("tunnelspec/components/front/model.py", name): ("a constant derived from the declaration", "")
       for name in ("FRONT_RUN_DIR", "FRONT_STATS", "METRICS_SOCKET", "STATE_DIR_NAME", "STATE_PATH")},
    ("tunnelspec/components/front/model.py", "front_vars"): (
        "HAProxy's configuration and unit (RuntimeDirectory=, its stats and metrics sockets): used by the front's "
        "user, whose directory it is", ""),
    ("tunnelspec/components/front/model.py", "metrics_document"): (
        "the exporter's configuration: read by the exporter as the front's user (its `show` mode: see "
        "PROGRAM_KNOWN)", ""),
    ("tunnelspec/components/front/model.py", "modes_document"): (
        "the launcher's configuration: it writes the mode file as llama-server's user; the watcher (root) reads "
        "it only through read_state (test_root_modes_…) and connects to the front's stats socket (PROGRAM_KNOWN)", ""),
    ("tunnelspec/components/front/model.py", "add_serving"): ("llama-server's unit: RuntimeDirectory= (state_dir)", ""),
    ("tunnelspec/components/front/serving.py", "serving_state"): (
        "status reads the mode file through facts/safe_read.py (O_NOFOLLOW walk, one name, a cap)", "safe_read.read("),
    ("tunnelspec/components/front/serving.py", "state_probes"): (
        "names serving_state's read of the mode file for the play's batch: the same reader, facts/safe_read.py",
        "safe_read.file_text("),
    ("tunnelspec/commands/logs.py", "_collect_server"): (
        "logs reads the mode file through facts/safe_read.py", "safe_read.file_text("),
}
PLAYBOOK_REFS: dict[tuple[str, str], str] = {
    ("teardown.yml", "tunnelspec files on main removed"): (
        "rm -rf by root after the units are stopped and llama-server's user is removed; rm never follows a "
        "link inside what it removes"),
    ("teardown.yml", "sources, builds, caches, models removed"): (
        "--purge: rm -rf by root after the rpc unit is stopped and its user removed"),
}


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "tunnelspec").rglob("*.py"))}


def references(srcs: dict[str, str], names: frozenset[str]) -> list[Ref]:
    return [r for m, s in srcs.items() for r in path_refs(m, s, names)]


def unreviewed(refs: list[Ref]) -> list[str]:
    """Each reference to a service-writable place that CODE_REFS does not list."""
    return [f"{r.module}:{r.line} in {r.scope}: {r.what}" for r in refs
            if (r.module, r.scope) not in CODE_REFS and (r.module, "*") not in CODE_REFS]


@pytest.fixture(scope="module")
def tree():
    srcs = sources()
    names = holding_names(srcs)
    return srcs, names, references(srcs, names)


def test_every_reference_to_a_service_writable_place_is_reviewed(tree):
    assert unreviewed(tree[2]) == []


def test_the_reviewed_list_has_no_stale_entry(tree):
    used = {(r.module, r.scope) for r in tree[2]}
    used |= {(m, "*") for m, _ in used}
    assert sorted(set(CODE_REFS) - used) == []


def test_a_safe_reader_s_reference_goes_through_it():
    for (module, scope), (_, via) in CODE_REFS.items():
        if not via:
            continue
        tree = ast.parse((ROOT / module).read_text())
        fn = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == scope)
        assert via in ast.unparse(fn), (module, scope, via)


def test_every_playbook_line_naming_a_service_writable_place_is_reviewed():
    refs = [r for p in sorted((ROOT / "playbooks").glob("*.yml")) for r in yaml_refs(p.name, p.read_text())]
    assert [f"{r.module}:{r.line} ({r.scope}): {r.what}" for r in refs if (r.module, r.scope) not in PLAYBOOK_REFS] == []
    assert sorted(set(PLAYBOOK_REFS) - {(r.module, r.scope) for r in refs}) == []


# ---- the programs root runs on main --------------------------------------------------------------------
# Each program's modes (from its header): the functions root enters by them. A mode whose header line
# names a service user ("(llama-server's user)") is that user's; every other mode may be run by root.
ROOT_ENTRIES = {
    "tunnelspec-draftwatch.py": {"watch": ["watch"], "state": ["load_config", "read_state"]},
    "tunnelspec-metrics.py": {"show": ["load_config", "scrape"]},
    "tunnelspec-rpc-wait.py": {},  # no mode: HELLO probes over TCP, no path; also loaded by the watcher
}
# The host files that are parts of a program (read with it, no mode of their own), and the programs.
PART_FILES = {part for parts in PARTS.values() for part in parts}
MAINS = sorted(set(PROGRAMS) - PART_FILES)
# (program, function, key): a root mode reaches a service-writable path through this function, safely.
PROGRAM_SAFE = {("tunnelspec-draftwatch.py", "read_state", "state"):
                "os.open with O_NOFOLLOW|O_NONBLOCK, a regular file of one name, its directory's owner, a cap",
                ("tunnelspec-draftwatch.py", "front_busy", "stats"):
                "connects through connect_unix_nofollow: an O_PATH|O_NOFOLLOW descriptor of a socket the "
                "directory's owner owns, reached as /proc/self/fd/N",
                ("tunnelspec-metrics.py", "front_metrics", "socket"):
                "connects through connect_unix_nofollow (O_PATH|O_NOFOLLOW, a socket)",
                ("tunnelspec-metrics.py", "scrape", "state"):
                "reads through _read_json: os.open with O_NOFOLLOW|O_NONBLOCK, a regular file of one name, a cap"}
# Each safe entry's function really goes through its helper, and the helpers do not follow a link.
SAFE_HELPERS = {("tunnelspec-draftwatch.py", "front_busy"): "connect_unix_nofollow(",
                ("tunnelspec-metrics.py", "front_metrics"): "connect_unix_nofollow(",
                ("tunnelspec-metrics.py", "scrape"): "_read_json(cfg[\"state\"])"}
# Known breaks of invariant A, reported (not fixed here): each one fails this test once it is gone, so
# that the entry goes too.
PROGRAM_KNOWN: dict = {
}


@pytest.fixture(scope="module")
def keys(deploys) -> set[str]:
    """The configuration keys whose value lies in a service-writable place, in what the deploy renders."""
    out: set[str] = set()
    for d in deploys.values():
        for f in d.files:
            if f.dest.endswith(".json"):
                out |= config_keys(json.loads(f.text))
    assert {"state", "stats"} <= out  # the mode file and the front's stats socket, at least
    return out


def program_findings(name: str, source: str, keys: set[str]) -> set[tuple[str, str, str]]:
    """(program, function, key) for each service-writable path a root mode of the program reaches,
    other than through PROGRAM_SAFE."""
    entries = [f for fns in ROOT_ENTRIES[name].values() for f in fns]
    return {(name, f, k) for f, k in root_key_uses(source, entries, keys)} - set(PROGRAM_SAFE)


def test_the_safe_entries_go_through_helpers_that_do_not_follow():
    import ast
    for (name, fn), call in SAFE_HELPERS.items():
        source = program_source(name)
        tree = ast.parse(source)
        body = next(ast.get_source_segment(source, n) for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef) and n.name == fn)
        assert call in body, (name, fn, call)
        assert "connect_unix_nofollow" not in call or "os.O_PATH | os.O_NOFOLLOW" in next(
            ast.get_source_segment(source, n) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name == "connect_unix_nofollow")
    metrics = program_source("tunnelspec-metrics.py")
    assert opens_only_without_following(metrics, "_read_json") == (True, "")


def test_the_programs_modes_are_classified():
    assert set(ROOT_ENTRIES) == set(MAINS) and PART_FILES <= set(PROGRAMS)
    for name in MAINS:
        modes = program_modes(program_path(name).read_text())
        root_modes = {m for m, words in modes.items() if "user)" not in words}
        assert root_modes == set(ROOT_ENTRIES[name]), (name, modes)
    for name in sorted(PART_FILES):  # a part runs only as its program's mode says
        assert program_modes(program_path(name).read_text()) == {}, name


def test_root_modes_reach_service_writable_paths_only_where_listed(keys):
    found = set()
    for name in MAINS:  # each with its parts: every host file
        found |= program_findings(name, program_source(name), keys)
    assert found == set(PROGRAM_KNOWN), found


def test_the_mode_file_is_read_by_root_only_through_read_state_without_following():
    source = program_source("tunnelspec-draftwatch.py")
    assert opens_only_without_following(source, "read_state") == (True, "")
    # The writer is the launcher's (llama-server's user): no root mode reaches it.
    reach = reachable(source, [f for fns in ROOT_ENTRIES["tunnelspec-draftwatch.py"].values() for f in fns])
    assert "read_state" in reach and "write_state" not in reach and "launch" not in reach


# ---- planted cases -----------------------------------------------------------------------------------
PLANTED_MODULE = '''
import subprocess
from tunnelspec.components.front import model as front

async def peek(conn):
    return await conn.run(["cat", "/run/tunnelspec-llama/x"])

async def mode(conn):
    return await conn.run(["cat", front.STATE_PATH])

def sock(base):
    return f"/run/{'tunnelspec-front'}/{base}"

CACHE = "/var/cache/" + "tunnelspec-rpc"
'''


def test_planted_module_reaching_into_service_writable_directories_fails(tree):
    srcs, _, refs = tree
    planted = {"tunnelspec/commands/peek.py": PLANTED_MODULE}
    names = holding_names({**srcs, **planted})
    assert "CACHE" in names  # the planted module's own constant holds a place: a use of it is found too
    found = unreviewed(refs + references(planted, names))
    assert found == [
        "tunnelspec/commands/peek.py:6 in peek: '/run/tunnelspec-llama' in '/run/tunnelspec-llama/x'",
        "tunnelspec/commands/peek.py:9 in mode: name STATE_PATH",
        "tunnelspec/commands/peek.py:12 in sock: '/run/tunnelspec-front' in '/run/tunnelspec-front/{}'",
        "tunnelspec/commands/peek.py:14 in CACHE: '/var/cache/tunnelspec-rpc' in '/var/cache/tunnelspec-rpc'",
    ], found


def test_planted_watcher_that_reads_the_mode_file_with_open_fails(keys):
    source = program_source("tunnelspec-draftwatch.py")
    planted = source.replace("def front_busy(cfg):", "def peek_mode(cfg):\n    with open(cfg[\"state\"]) as f:\n"
                             "        return f.read()\n\n\ndef front_busy(cfg):\n    peek_mode(cfg)", 1)
    assert program_findings("tunnelspec-draftwatch.py", planted, keys) - set(PROGRAM_KNOWN) == {
        ("tunnelspec-draftwatch.py", "peek_mode", "state")}
    # read_state itself following a link:
    planted = source.replace("os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK", "os.O_RDONLY | os.O_NONBLOCK", 1)
    ok, why = opens_only_without_following(planted, "read_state")
    assert not ok and "os.open without O_NOFOLLOW" in why, why
    planted = source.replace("        fd = os.open(cfg[\"state\"]", "        open(cfg[\"state\"]).close()\n"
                             "        fd = os.open(cfg[\"state\"]", 1)
    assert opens_only_without_following(planted, "read_state")[0] is False


def test_planted_watcher_that_writes_the_mode_file_fails(keys):
    source = program_source("tunnelspec-draftwatch.py")
    planted = source.replace("def front_busy(cfg):\n", "def front_busy(cfg):\n    write_state(cfg, {})\n", 1)
    assert ("tunnelspec-draftwatch.py", "write_state", "state") in program_findings(
        "tunnelspec-draftwatch.py", planted, keys)


def test_planted_new_root_mode_must_be_classified():
    source = program_source("tunnelspec-metrics.py")
    planted = source.replace("#   tunnelspec-metrics show CONFIG",
                             "#   tunnelspec-metrics fix CONFIG    chmods the state (root)\n#   tunnelspec-metrics show CONFIG", 1)
    assert set(program_modes(planted)) == {"serve", "show", "fix"}


def test_the_programs_are_the_ones_the_deploy_installs(deploys):
    installed = {f.src for f in deploys["lab"].files}
    assert set(PROGRAMS) <= installed
    assert {p.name for p in program_path("tunnelspec-metrics.py").parent.glob("*.py")} - {"__init__.py"} == set(
        PROGRAMS.values())
    assert Path(ROOT / "playbooks").is_dir()
