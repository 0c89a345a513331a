"""The docs agree with the tool, checked offline:

- inventory.example.ini documents every variable tunnelspec reads (fields.KNOWN_VARS), and names no
  variable the code does not read: the two lists cannot drift;
- the one spelling the docs give for a JSON argument in `llama_server_extra_args` (seed 000's
  `--chat-template-kwargs "{\\"preserve_thinking\\": true}"`) reaches llama-server's argv as the single
  element `{"preserve_thinking": true}`, in inventory.example.ini, the seed 000 example and
  docs/first-cluster.md alike;
- a message never shows doubled braces (`'<tag>^{{commit}}'`): a plain string literal glued to an
  f-string is not formatted, so its `{{` stays two characters;
- `llama_backend=rocm` points to `hip`;
- the sleeping draft laptop and the Mac are described the same way everywhere.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.cluster.declared import DECLARED
from tunnelspec.cluster.fields import KNOWN_VARS
from tunnelspec.llama import flags
from tunnelspec.components.server.args import build_server_argv

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_INI = REPO / "inventory.example.ini"
HELP = REPO / "tests/server/data/llama-server-help.txt"
JSON_ARG = ["--chat-template-kwargs", '{"preserve_thinking": true}']

# Variables only tunnelspec's own commands set (with -e): not for an inventory to hold.
SET_BY_COMMANDS = {name for name, var in DECLARED.items() if var.by_command}


def documented_vars(text: str) -> set[str]:
    """Every variable inventory.example.ini shows: as a setting (`name=…`, commented or not, on a
    host line too) or as the head of its explanation (`# name   meaning…`)."""
    names: set[str] = set()
    for line in text.splitlines():
        s = line.strip()
        head = (re.match(r"^#?\s*([a-z][a-z0-9_]*)=", s)
                or re.match(r"^#?\s*([a-z][a-z0-9]*_[a-z0-9_]+)(\s{2,}|\s+(?=true|false|cpu|draft))", s))
        if head:
            names.add(head.group(1))
        if s and not s.startswith(("#", ";", "[")):
            names.update(tok.split("=", 1)[0] for tok in s.split() if "=" in tok)
    # ansible_*: Ansible's connection variables; my_*: the user's own (tunnelspec check leaves them be)
    return {n for n in names if not n.startswith(("ansible_", "my_"))}


def test_inventory_example_documents_exactly_the_variables_the_code_reads():
    documented = documented_vars(EXAMPLE_INI.read_text())
    readable = set(KNOWN_VARS) - SET_BY_COMMANDS
    assert sorted(readable - documented) == [], "read by the code, missing from inventory.example.ini"
    assert sorted(documented - set(KNOWN_VARS)) == [], "in inventory.example.ini, read by no code"


def test_the_documented_variable_reader_sees_both_forms():
    text = "# rpc_port      port of the server\nnode-a ansible_host=x rpc_role=draft\n# llama_build_jobs=2\n"
    assert documented_vars(text) == {"rpc_port", "rpc_role", "llama_build_jobs"}


# ---- one spelling for a JSON argument ------------------------------------------------------------
def _spelling_in_example_ini() -> str:
    lines = [l.lstrip("# ").strip() for l in EXAMPLE_INI.read_text().splitlines()
             if "preserve_thinking" in l and "llama_server_extra_args=" in l]
    assert len(lines) == 1, lines
    return lines[0]


def _spelling_in_seed000() -> str:
    lines = [l for l in (REPO / "examples/seed000-mtp-laptop-gpu.ini").read_text().splitlines()
             if l.startswith("llama_server_extra_args=")]
    assert len(lines) == 1, lines
    return lines[0]


def _spelling_in_first_cluster() -> str:
    text = (REPO / "docs/first-cluster.md").read_text()
    m = re.search(r"<!-- doctest: first-cluster extra-args -->\n```ini\n(.*?)```", text, re.S)
    assert m, "docs/first-cluster.md: no extra-args block"
    (line,) = [l for l in m.group(1).splitlines() if l.startswith("llama_server_extra_args=")]
    return line


def _server_argv(tmp_path: Path, main_vars_line: str) -> list[str]:
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"""[main]
srv ansible_host=192.0.2.20

[main:vars]
{main_vars_line}

[rpc]
laptop ansible_host=192.0.2.30 rpc_role=draft

[all:vars]
llama_repo=https://github.com/ggml-org/llama.cpp
llama_commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f"
llama_model=/srv/models/target.gguf
llama_draft_model=/srv/models/draft.gguf
""")
    c = Cluster.from_inventory(load_inventory(inv))
    return build_server_argv(c, flags.parse_help(HELP.read_text(), "fixture"), {c.rpc[0].tunnel_port: ["RPC0"]},
                             "llama-server", c.main.model, c.main.draft_model).argv


@pytest.mark.parametrize("where", [_spelling_in_example_ini, _spelling_in_seed000, _spelling_in_first_cluster],
                         ids=["inventory.example.ini", "seed000", "first-cluster.md"])
def test_the_documented_json_argument_reaches_llama_server_as_one_element(tmp_path, where):
    line = where()
    argv = _server_argv(tmp_path, line)
    i = argv.index("--chat-template-kwargs")
    assert argv[i:i + 2] == JSON_ARG, line


def test_the_three_documents_give_the_same_spelling():
    spellings = {_spelling_in_example_ini(), _spelling_in_seed000(), _spelling_in_first_cluster()}
    assert len(spellings) == 1, spellings


def test_the_spellings_the_docs_warn_against_do_lose_the_quotes(tmp_path):
    """What docs/first-cluster.md says not to write really goes wrong (so the warning is earned)."""
    argv = _server_argv(tmp_path, """llama_server_extra_args='--chat-template-kwargs "{\\"preserve_thinking\\": true}"'""")
    assert argv[argv.index("--chat-template-kwargs") + 1] == "{preserve_thinking: true}"


# ---- messages -----------------------------------------------------------------------------------
def _glued_plain_strings(source: str):
    """(line, text) of each plain string literal implicitly concatenated with an f-string."""
    group: list[tokenize.TokenInfo] = []
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}

    def flush():
        if any(re.match(r"^[a-zA-Z]*[fF]", t.string) for t in group):
            for t in group:
                if not re.match(r"^[a-zA-Z]*[fF]", t.string):
                    yield t.start[0], t.string
        group.clear()

    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            group.append(tok)
        elif tok.type not in skip:
            yield from flush()
    yield from flush()


def test_no_message_shows_doubled_braces():
    found = []
    for path in sorted((REPO / "tunnelspec").rglob("*.py")):
        for line, text in _glued_plain_strings(path.read_text()):
            if "{{" in text or "}}" in text:
                found.append(f"{path.relative_to(REPO)}:{line}: {text[:80]}")
    assert found == [], "a plain string glued to an f-string keeps its {{ }}: write single braces there"


def test_the_glued_string_finder_finds_one():
    src = 'x = (f"{a} is not a SHA: "\n     "git rev-parse \'<tag>^{{commit}}\'")\n'
    assert [line for line, _ in _glued_plain_strings(src)] == [2]


def test_llama_commit_hint_reads_as_a_command(tmp_path):
    inv = tmp_path / "i.ini"
    inv.write_text("[main]\nm ansible_host=192.0.2.1\n[rpc]\nr ansible_host=192.0.2.2\n[all:vars]\n"
                   "llama_repo=https://example.invalid/llama.cpp\nllama_commit=v1.0\nllama_model=/a\nllama_draft_model=/b\n")
    with pytest.raises(ClusterError) as e:
        Cluster.from_inventory(load_inventory(inv))
    assert "git rev-parse '<tag>^{commit}'" in str(e.value)


def test_rocm_is_pointed_to_hip(tmp_path):
    inv = tmp_path / "i.ini"
    inv.write_text("[main]\nm ansible_host=192.0.2.1 llama_backend=rocm\n[rpc]\nr ansible_host=192.0.2.2\n"
                   "[all:vars]\nllama_repo=https://example.invalid/llama.cpp\nllama_commit=\"0123456789abcdef0123456789abcdef01234567\"\n"
                   "llama_model=/a\nllama_draft_model=/b\n")
    with pytest.raises(ClusterError, match=r"llama_backend: 'rocm' .*did you mean hip\? ROCm is llama.cpp's HIP backend"):
        Cluster.from_inventory(load_inventory(inv))


# ---- the same story everywhere --------------------------------------------------------------------
def _flat(path: str) -> str:
    return " ".join((REPO / path).read_text().split())


def test_a_sleeping_draft_laptop_is_served_around_everywhere():
    for page in ("README.md", "docs/first-cluster.md", "docs/degraded.md"):
        text = _flat(page)
        assert "llama-server stops on a lost RPC connection" not in text, page
        assert "serves the target alone" in text or "serving the target alone" in text, page


def test_the_mac_is_stated_plainly_where_a_topology_names_it():
    readme = _flat("README.md")
    topologies = readme[readme.index("## Example topologies"):]
    assert "does not deploy to macOS" in topologies
    assert "does not deploy to macOS" in _flat("docs/first-cluster.md")
    assert "does not deploy to macOS" in _flat("examples/seed000-mtp-laptop-gpu.ini")


# A reference to an issue of tunnelspec's own tracker (which is not in the repository) says nothing
# to a reader of the repository: the text says what the issue was about instead. Upstream's issues
# (llama.cpp's, named as such) are references a reader can follow.
_OWN_ISSUE = re.compile(r"(?<![\w.])[Ii]ssues? #?\d{1,3}\b")  # ours are 1-3 digits; upstream's 5
_UPSTREAM = re.compile(r"(llama\.cpp|upstream|ggml)('s)?\s*$", re.I)
_SCANNED = ("tunnelspec", "tests", "docs", "benchmarks", "scripts", "monitoring", "examples")


def own_issue_references(text: str) -> list[str]:
    return [m.group(0) for m in _OWN_ISSUE.finditer(text)
            if not _UPSTREAM.search(text[max(0, m.start() - 24):m.start()])]


def test_no_text_cites_an_issue_of_our_own_tracker():
    found = []
    for top in _SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".md", ".c", ".sh", ".yml", ".yaml", ".ini", ".j2"}:
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    found += [f"{path.relative_to(REPO)}:{n}: {ref}" for ref in own_issue_references(line)]
    found += [f"README.md: {ref}" for ref in own_issue_references((REPO / "README.md").read_text())]
    assert not found, "\n".join(found)


def test_the_issue_reference_finder_tells_ours_from_upstreams():
    word = "ssue"  # not written whole here, or this test would find itself
    assert own_issue_references(f"the watcher (i{word} 22) and I{word}s 38 item 5") == [f"i{word} 22", f"I{word}s 38"]
    assert own_issue_references(f"llama.cpp i{word} 257; upstream i{word} 232; ggml's i{word} 12; i{word} 23242") == []
