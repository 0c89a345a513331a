"""`tunnelspec check`: every mistake of a broken inventory in one run, each with its `file:line`,
exit 2, with no connection; the shipped inventories pass and show their plan. (How fast it answers is
measured by benchmarks/check_latency.py, not here: a run's time only bounds a hang, 5 s.)

The corpus (corpus/*.ini, *.yml) holds one mistake per file, a few files several. Each file ends
with `# expect: LINE TEXT` lines: some line of the output must name `FILE:LINE:` and hold TEXT, and
every ERROR line must be one of them (no error that only follows from another).

"Nothing connects" is proved, not assumed: every run here has a guard (a sitecustomize on
PYTHONPATH) that makes any socket connect record itself in a file and fail; the positive control
shows the guard catching a real connect attempt.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
CORPUS = HERE / "corpus"
CASES = sorted([*CORPUS.glob("*.ini"), *CORPUS.glob("*.yml")])
SHIPPED = [*sorted((ROOT / "examples").glob("*.ini")), ROOT / "inventory.example.ini", ROOT / "inventory.example.yml"]
TEST_NET = ipaddress.ip_network("192.0.2.0/24")

GUARD = """
import os, socket
def _refuse(self, *a, **k):
    with open(os.environ["CHECK_CONNECT_LOG"], "a") as f:
        f.write(repr(a) + "\\n")
    raise OSError("connection attempted during an offline check")
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
"""


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    (d / "sitecustomize.py").write_text(GUARD)
    log = d / "connects.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(d), str(ROOT)]), CHECK_CONNECT_LOG=str(log), XDG_CACHE_HOME=str(d / "cache")
    )  # no record of an earlier deploy: the planned spelling
    return env, log


def run(env, *args, cwd=CORPUS, timeout=60):
    start = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "tunnelspec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return p, time.monotonic() - start


def expectations(path: Path) -> list[tuple[int, str]]:
    return [
        (int(m.group(1)), m.group(2).strip()) for m in re.finditer(r"^# expect: (\d+) (.+)$", path.read_text(), re.M)
    ]


def test_corpus_is_big_and_varied():
    assert len(CASES) >= 60
    assert len([c for c in CASES if c.suffix == ".yml"]) >= 5
    several = [c for c in CASES if len(expectations(c)) >= 2]
    assert len(several) >= 10, "at least ten files hold several mistakes"
    assert any("header" in c.name for c in several), "a broken header among the files with several mistakes"
    assert all(expectations(c) for c in CASES), [c.name for c in CASES if not expectations(c)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_mistake_named_with_its_line(case, guard):
    env, log = guard
    for address in re.findall(r"ansible_host[=:]\s*([0-9.]+)", case.read_text()):
        assert ipaddress.ip_address(address) in TEST_NET, f"{case.name}: {address} is not TEST-NET-1"
    p, took = run(env, "check", case.name)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "Traceback" not in out, out
    assert took < 5, f"check took {took:.1f}s"
    lines = out.splitlines()
    expected = expectations(case)
    for line, text in expected:
        assert any(f"{case.name}:{line}:" in ln and text in ln for ln in lines), f"line {line}: {text!r} in\n{out}"
    # Exactly the file's mistakes: an ERROR no expectation names (a consequence of another) fails.
    extra = [
        ln
        for ln in lines
        if ln.startswith("ERROR:") and not any(f"{case.name}:{line}:" in ln and text in ln for line, text in expected)
    ]
    assert not extra, "\n".join(extra)
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    assert len(errors) <= len(expected), "one mistake named twice:\n" + "\n".join(errors)
    assert not log.exists(), log.read_text()


def test_the_guard_sees_a_connect(guard, tmp_path):
    """Positive control: under the same guard a real connect attempt is recorded (and fails)."""
    env, log = guard
    env = dict(env, CHECK_CONNECT_LOG=str(tmp_path / "control.log"))
    code = (
        "import socket\ntry:\n    socket.create_connection(('192.0.2.10', 22), timeout=1)\nexcept OSError:\n    pass\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, timeout=30, check=True)
    assert "192.0.2.10" in (tmp_path / "control.log").read_text()


def test_json_format_lists_every_error_and_warning(guard):
    env, _ = guard
    p, _ = run(env, "check", "44_yaml_several.yml", "--format", "json")
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["ok"] is False and doc["schema"] == 1
    assert sorted((e["line"], e["var"]) for e in doc["errors"]) == [(11, "rpc_bind"), (15, "llama_commit")]
    assert {(w["line"], w["var"]) for w in doc["warnings"]} == {(7, "context_size"), (8, "llama_server_extra_args")}
    assert all(e["file"] == "44_yaml_several.yml" for e in doc["errors"])
    # The plan as it stands with those lines left out: main and the node, each with its commands.
    assert set(doc["plan"]["hosts"]) == {"main-host", "node-a"}


def test_deploy_stops_on_the_same_errors_before_any_connection(guard):
    env, log = guard
    case = CORPUS / "29_several_parse_and_model.ini"
    p, took = run(env, "deploy", case.name)
    assert p.returncode == 2, p.stdout + p.stderr
    for line, text in expectations(case):
        assert f"{case.name}:{line}:" in p.stderr and text in p.stderr
    assert "no host was contacted" in p.stderr
    assert not log.exists(), log.read_text()


def _plan(doc, host, what):
    return next(c["argv"] for c in doc["plan"]["hosts"][host] if c["what"] == what)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_inventories_check_and_show_their_plan(path, guard):
    env, log = guard
    p, took = run(env, "check", str(path), "--format", "json", cwd=ROOT)
    doc = json.loads(p.stdout)
    assert p.returncode == 0, doc["errors"]
    # Three rpc nodes on the pinned build: the one warning is llama.cpp issue 28487's (llama/known_issues.py).
    expected = ["28487"] if path.name == "seed003-layers-on-three-nodes.ini" else []
    named = [re.search(r"llama\.cpp issue (\d+)", w["message"]) for w in doc["warnings"]]
    assert [m.group(1) if m else w["message"] for m, w in zip(named, doc["warnings"])] == expected, doc["warnings"]
    assert took < 5
    assert not log.exists()
    assert "flags as planned" in doc["plan"]["spelling"]
    text = path.read_text()
    main = next(h for h, cmds in doc["plan"]["hosts"].items() if any(c["what"] == "llama-server" for c in cmds))
    server = _plan(doc, main, "llama-server")
    assert server[0].endswith("/current/bin/llama-server") and "--rpc" in server
    if "llama_draft_model" in re.sub(r"^#.*$", "", text, flags=re.M):
        assert server[server.index("--spec-draft-device") + 1].startswith("RPC")
    nodes = [h for h in doc["plan"]["hosts"] if h != main]
    assert nodes
    for node in nodes:
        rpc = _plan(doc, node, "rpc-server")
        assert rpc[rpc.index("-H") + 1] == "127.0.0.1"
        tunnel = _plan(doc, main, f"tunnel to {node}")
        assert tunnel[0] == "/usr/bin/ssh" and tunnel[tunnel.index("-L") + 1].startswith("127.0.0.1:")
    human, _ = run(env, "check", str(path), cwd=ROOT)
    for host in doc["plan"]["hosts"]:
        assert f"  {host}:" in human.stdout
    assert "flags as planned; the build's spelling is checked on deploy" in human.stdout


# ---- seed 000's JSON argument: the quoting that works, and the one check warns about ----------
SEED000_JSON = {"preserve_thinking": True}
BASE = """[main]
main-host ansible_host=192.0.2.10{host_extra}

[main:vars]
{main_var}

[rpc]
node-a ansible_host=192.0.2.11

[all:vars]
ansible_user=root
llama_repo=https://github.com/ggml-org/llama.cpp
llama_commit="0123456789abcdef0123456789abcdef01234567"
llama_model=/srv/models/target.gguf
llama_draft_model=/srv/models/draft.gguf
"""


def _inventory(tmp_path, main_var="", host_extra=""):
    path = tmp_path / "inventory.ini"
    path.write_text(BASE.format(main_var=main_var, host_extra=host_extra))
    return path


@pytest.mark.parametrize(
    "main_var,host_extra",
    [
        # inventory.example.ini's rule: a list literal, one element per argument, the JSON in single quotes
        ("""llama_server_extra_args=["--chat-template-kwargs", '{"preserve_thinking": true}']""", ""),
        # the seed's own line, as written, in a [main:vars] section (split like a shell line)
        (r'''llama_server_extra_args=--chat-template-kwargs "{\"preserve_thinking\": true}"''', ""),
        # on the host's line: the whole value in single quotes
        ("", r""" llama_server_extra_args='--chat-template-kwargs "{\"preserve_thinking\": true}"' """.rstrip()),
    ],
    ids=["list-literal", "group-vars-as-the-seed-writes-it", "host-line-single-quoted"],
)
def test_seed000_json_argument_is_one_valid_json_element(tmp_path, guard, main_var, host_extra):
    env, _ = guard
    p, _ = run(env, "check", str(_inventory(tmp_path, main_var, host_extra)), "--format", "json", cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["warnings"] == [], doc
    argv = _plan(doc, "main-host", "llama-server")
    assert json.loads(argv[argv.index("--chat-template-kwargs") + 1]) == SEED000_JSON
    assert argv[-2:] == ["--chat-template-kwargs", '{"preserve_thinking": true}']


@pytest.mark.parametrize(
    "main_var",
    [
        'llama_server_extra_args=--chat-template-kwargs {"preserve_thinking": true}',  # no quotes: split at the space
        # Python's quotes around the seed's shell quoting: the backslashes go, the inner quotes split it
        r"""llama_server_extra_args='--chat-template-kwargs "{\"preserve_thinking\": true}"'""",
    ],
    ids=["unquoted", "python-quoted-shell-escapes"],
)
def test_seed000_json_argument_mis_quoted_is_a_warning_with_its_line(tmp_path, guard, main_var):
    env, _ = guard
    p, _ = run(env, "check", str(_inventory(tmp_path, main_var)), cwd=tmp_path)
    assert p.returncode == 0, p.stdout  # a warning, not an error
    (warning,) = [ln for ln in p.stderr.splitlines() if ln.startswith("WARNING:")]
    assert "inventory.ini:5:" in warning and "llama_server_extra_args" in warning and "not valid JSON" in warning


# ---- variables ----------------------------------------------------------------------------------
def test_own_and_ansible_variables_are_not_unknown(tmp_path, guard):
    env, _ = guard
    path = _inventory(
        tmp_path, "my_context_size=195000\nansible_python_interpreter=/usr/bin/python3", " context_size=195000"
    )
    p, _ = run(env, "check", str(path), cwd=tmp_path)
    assert p.returncode == 0, p.stdout  # warnings alone
    warnings = [ln for ln in p.stderr.splitlines() if ln.startswith("WARNING:")]
    assert len(warnings) == 1 and "inventory.ini:2:" in warnings[0] and "my_context_size" in warnings[0]


# ---- patch files against the controller's own tree ------------------------------------------------
def _git(cwd, *args):
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("applies", [True, False])
def test_patch_file_checked_against_the_controller_tree(tmp_path, guard, applies):
    env, _ = guard
    repo = tmp_path / "llama.cpp"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README.md").write_text("one\ntwo\n")
    (repo / "tools" / "rpc").mkdir(parents=True)  # a tree from before the rename to ggml-rpc-server
    (repo / "tools" / "rpc" / "CMakeLists.txt").write_text("set(TARGET rpc-server)\n")
    _git(repo, "add", "README.md", "tools")
    _git(repo, "commit", "-q", "-m", "base")
    commit = _git(repo, "rev-parse", "HEAD")
    old = "two" if applies else "three"
    (tmp_path / "fix.patch").write_text(f"--- a/README.md\n+++ b/README.md\n@@ -1,2 +1,2 @@\n one\n-{old}\n+2\n")
    text = (
        BASE.format(main_var="", host_extra="")
        .replace("llama_repo=https://github.com/ggml-org/llama.cpp", f"llama_repo=controller:{repo}")
        .replace("0123456789abcdef0123456789abcdef01234567", commit)
        + 'llama_patches=[{"file": "fix.patch"}]\n'
    )
    (tmp_path / "inventory.ini").write_text(text)
    p, _ = run(env, "check", "inventory.ini", cwd=tmp_path)
    if applies:
        assert p.returncode == 0, p.stdout
        doc = json.loads(run(env, "check", "inventory.ini", "--format", "json", cwd=tmp_path)[0].stdout)
        assert _plan(doc, "node-a", "rpc-server")[0] == "/opt/tunnelspec/current/bin/rpc-server"
    else:
        assert p.returncode == 2 and "inventory.ini:16:" in p.stderr and "does not apply to the pinned tree" in p.stderr
    assert _git(repo, "status", "--porcelain") == "" and _git(repo, "rev-parse", "HEAD") == commit


@pytest.mark.parametrize("hook_vars", ["index", "dir-index-work-tree"])
def test_check_run_from_a_git_hook_leaves_the_hooks_repository_alone(tmp_path, guard, hook_vars):
    """A pre-commit hook runs `tunnelspec check` with GIT_DIR, GIT_INDEX_FILE and GIT_WORK_TREE of the
    repository being committed: the patch check still reads the controller's llama.cpp tree, and its
    scratch `read-tree` writes no index of the hook's repository."""
    env, _ = guard
    repo = tmp_path / "llama.cpp"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README.md").write_text("one\ntwo\n")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-q", "-m", "base")
    commit = _git(repo, "rev-parse", "HEAD")
    (tmp_path / "fix.patch").write_text("--- a/README.md\n+++ b/README.md\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n")
    text = (
        BASE.format(main_var="", host_extra="")
        .replace("llama_repo=https://github.com/ggml-org/llama.cpp", f"llama_repo=controller:{repo}")
        .replace("0123456789abcdef0123456789abcdef01234567", commit)
        + 'llama_patches=[{"file": "fix.patch"}]\n'
    )
    (tmp_path / "inventory.ini").write_text(text)
    hooked = tmp_path / "ops"  # the user's repository, mid-commit: one file staged
    hooked.mkdir()
    _git(hooked, "init", "-q")
    (hooked / "notes.txt").write_text("staged\n")
    _git(hooked, "add", "notes.txt")
    index = hooked / ".git" / "index"
    before = index.read_bytes()
    hook_env = {**env, "GIT_INDEX_FILE": str(index)}
    if hook_vars != "index":
        hook_env.update(GIT_DIR=str(hooked / ".git"), GIT_WORK_TREE=str(hooked), GIT_PREFIX="")
    p, _ = run(hook_env, "check", "inventory.ini", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert index.read_bytes() == before
    assert _git(hooked, "diff", "--cached", "--name-only") == "notes.txt"
    assert _git(repo, "status", "--porcelain") == "" and _git(repo, "rev-parse", "HEAD") == commit


# ---- values by their declared type (cluster/schema.py), and Ansible's connection variables ---------
SECRETS = {
    "62_ansible_password.ini": "correct-horse-battery",
    "68_several_connection.ini": "hunter2-secret",
    "70_yaml_ansible_password_and_typo.yml": "s3cret-value",
}


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_a_refused_password_is_never_printed(name, guard):
    env, _ = guard
    for fmt in ("text", "json"):
        p, _ = run(env, "check", name, "--format", fmt)
        assert p.returncode == 2
        assert SECRETS[name] not in p.stdout + p.stderr


def test_deploy_refuses_the_connection_variables_before_any_connection(guard):
    """The refusals live in the cluster model, so deploy stops on them too, every one with its line."""
    env, log = guard
    case = CORPUS / "68_several_connection.ini"
    p, _ = run(env, "deploy", case.name)
    assert p.returncode == 2, p.stdout + p.stderr
    for line, text in expectations(case):
        assert any(f"{case.name}:{line}:" in ln and text in ln for ln in p.stderr.splitlines()), (line, text, p.stderr)
    assert not log.exists(), log.read_text()


def test_json_names_each_bad_value_with_host_and_variable(guard):
    env, _ = guard
    p, _ = run(env, "check", "67_several_values.ini", "--format", "json")
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    got = {(e["line"], e["host"], e["var"]) for e in doc["errors"]}
    assert {
        (2, "main-host", "ansible_port"),
        (5, "node-a", "rpc_local_isolation"),
        (5, "node-a", "ansible_hots"),
        (9, "main-host", "llama_keep_builds"),
        (10, "main-host", "tunnelspec_install_packages"),
        (12, "main-host", "llama_repo"),
    } <= got


def test_ansibles_other_variables_are_a_warning_not_silence(tmp_path, guard):
    env, _ = guard
    path = _inventory(tmp_path, "ansible_ssh_pipelining=true\nansible_python_interpreter=/usr/bin/python3")
    p, _ = run(env, "check", str(path), cwd=tmp_path)
    assert p.returncode == 0, p.stdout
    (warning,) = [ln for ln in p.stderr.splitlines() if ln.startswith("WARNING:")]
    assert "inventory.ini:5:" in warning and "ansible_ssh_pipelining" in warning and "no effect" in warning


@pytest.mark.parametrize("value", ["-1", "nine", "22.5", "70000"])
def test_a_bad_ansible_port_given_with_e_is_named_as_e(tmp_path, guard, value):
    env, _ = guard
    p, _ = run(env, "check", str(_inventory(tmp_path)), "-e", f"ansible_port={value}", cwd=tmp_path)
    assert p.returncode == 2
    assert "-e ansible_port:" in p.stdout + p.stderr and "port number 1..65535" in p.stdout + p.stderr


# ---- where the output goes: every ERROR and WARNING on stderr, the plan and the summary on stdout;
# ---- --format json: one object on stdout whatever went wrong --------------------------------------
def test_errors_on_stderr_plan_and_summary_on_stdout(guard):
    env, _ = guard
    case = CORPUS / "29_several_parse_and_model.ini"
    p, _ = run(env, "check", case.name)
    assert p.returncode == 2
    assert all(ln.startswith(("ERROR: ", "WARNING: ")) for ln in p.stderr.splitlines()), p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.startswith("ERROR: ")]) == len(expectations(case))
    assert "ERROR" not in p.stdout and "WARNING" not in p.stdout
    assert p.stdout.startswith("Plan (") and p.stdout.splitlines()[-1] == f"6 error(s), 0 warning(s) in {case.name}"


@pytest.mark.parametrize("kind", ["directory", "missing", "no-inventory", "twice", "extra-vars-file", "broken"])
def test_json_is_always_one_object_on_stdout(tmp_path, guard, kind):
    env, _ = guard
    (tmp_path / "inv.d").mkdir()
    args = {
        "directory": ["inv.d"],
        "missing": ["nope.ini"],
        "no-inventory": [],
        "twice": ["a.ini", "-i", "b.ini"],
        "extra-vars-file": [str(CORPUS / "02_group_rpcs.ini"), "-e", "@nope.yml"],
        "broken": [str(CORPUS / "29_several_parse_and_model.ini")],
    }[kind]
    p, _ = run(env, "check", *args, "--format", "json", cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    doc = json.loads(p.stdout)  # the whole of stdout is one object: no usage text, no ERROR line
    assert doc["schema"] == 1 and doc["ok"] is False and doc["errors"]
    stderr = p.stderr.splitlines()
    assert stderr and all(ln.startswith("ERROR: ") for ln in stderr), p.stderr
    assert [f"ERROR: {e['message']}" for e in doc["errors"]] == stderr


def test_a_broken_header_hides_nothing_and_deploy_still_refuses(guard):
    """The unclosed [rpc is named and its section read (its nodes' mistakes come in the same run);
    the loader of every other command stops at the header, exit 2, before any connection."""
    env, log = guard
    case = CORPUS / "71_unclosed_header_hides_nothing.ini"
    p, _ = run(env, "check", case.name)
    assert p.returncode == 2 and len(expectations(case)) >= 3
    for command in (["deploy"], ["status"], ["verify"], ["inventory", "list"]):
        q, _ = run(env, *command, case.name)
        assert q.returncode == 2, (command, q.stdout + q.stderr)
        assert f"{case.name}:4: section header '[rpc' is not closed" in q.stderr, (command, q.stderr)
    assert not log.exists(), log.read_text()


def test_docs_cli_check_example_is_what_check_prints(tmp_path, guard):
    """docs/cli.md's `tunnelspec check` example, run: the file it names as inventory.ini gives those
    ERROR lines on stderr (a `(…)` ends a line the page shortens) and that summary line on stdout."""
    env, _ = guard
    doc = (ROOT / "docs" / "cli.md").read_text()
    example = doc.split("$ tunnelspec check inventory.ini\n", 1)[1].split("```", 1)[0].splitlines()
    (tmp_path / "inventory.ini").write_text((CORPUS / "71_unclosed_header_hides_nothing.ini").read_text())
    p, _ = run(env, "check", "inventory.ini", cwd=tmp_path)
    assert p.returncode == 2
    errors = [ln for ln in example if ln.startswith(("ERROR:", "WARNING:"))]
    got = p.stderr.splitlines()
    assert len(errors) == len(got) and errors
    for want, line in zip(errors, got, strict=True):
        assert line.startswith(want.removesuffix("(…)")), (want, line)
    assert p.stdout.splitlines()[-1] == example[-1]
    assert p.stdout.splitlines()[0] == next(ln for ln in example if ln.startswith("Plan ("))


def test_the_plan_shows_the_whole_change_per_host(tmp_path, guard):
    """Source with each patch and its kind, build, users, where clients reach the API, the guarded
    ports: per host, offline, in both formats."""
    env, log = guard
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[main]\nm ansible_host=192.0.2.10\n\n[rpc]\nr1 ansible_host=192.0.2.11 rpc_port=50070\n\n[all:vars]\n"
        'llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit="0123456789abcdef0123456789abcdef01234567"\n'
        f'llama_patches=[{{"file": "{patch}"}}]\nllama_backend=vulkan\n'
        "llama_model=/srv/t.gguf\nllama_draft_model=/srv/d.gguf\n"
    )
    p, _ = run(env, "check", str(inv), "--format", "json", cwd=tmp_path)
    doc = json.loads(p.stdout)
    setup = doc["plan"]["setup"]
    assert set(setup) == {"m", "r1"}, doc["errors"]
    main, node = "\n".join(setup["m"]), "\n".join(setup["r1"])
    assert not doc["errors"], doc["errors"]
    assert "at 0123456789abcdef0123456789abcdef01234567" in main and f"patch (file): file {patch}" in node
    assert "build: vulkan, target llama-server" in main and "build: vulkan" in node
    assert "tunnelspec-llama (llama-server)" in main and "tunnelspec-tunnel (main's tunnel login)" in node
    assert "serves: http://127.0.0.1:8080/" in main
    assert "guarded ports: 127.0.0.1:50070 rpc-server (root, tunnelspec-tunnel)" in node
    human, _ = run(env, "check", str(inv), cwd=tmp_path)
    assert "    guarded ports: 127.0.0.1:50070" in human.stdout
    assert not log.exists()


def test_a_plan_with_errors_says_what_is_unknown(tmp_path, guard):
    env, _ = guard
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[main]\nm ansible_host=192.0.2.10\n\n[rpc]\nr1 ansible_host=192.0.2.11 rpc_port=nine\n\n"
        "[all:vars]\nllama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit=abc123\n"
        "llama_draft_model=/srv/d.gguf\n"
    )
    p, _ = run(env, "check", str(inv), cwd=tmp_path)
    assert p.returncode == 2
    assert "set-aside" not in p.stdout and "example.invalid" not in p.stdout and "0" * 40 not in p.stdout
    for var in ("llama_model", "llama_commit", "rpc_port"):
        assert f"<{var}: unknown>" in p.stdout, (var, p.stdout)


def test_deploy_check_prints_the_plan_before_the_hosts_are_asked(tmp_path, guard):
    env, _ = guard
    env = {**env, "PYTHONPATH": str(ROOT)}  # no guard: the hosts are asked, and refuse (a closed port)
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[main]\nm ansible_host=127.0.0.1 ansible_port=1\n\n[rpc]\nr1 ansible_host=127.0.0.1 ansible_port=1\n\n"
        "[all:vars]\n"
        "llama_repo=https://github.com/ggml-org/llama.cpp\n"
        'llama_commit="0123456789abcdef0123456789abcdef01234567"\n'
        f"llama_model=/srv/t.gguf\nllama_draft_model=/srv/d.gguf\ntunnelspec_known_hosts={tmp_path}/kh\n"
        f"tunnelspec_lock_dir={tmp_path}/lock\n"
    )
    p, _ = run(env, "deploy", "--check", str(inv), cwd=tmp_path)
    assert p.returncode == 4, p.stdout + p.stderr
    out = p.stdout
    assert out.startswith("Plan (") and "guarded ports:" in out
    assert out.index("Plan (") < out.index("unreachable")
