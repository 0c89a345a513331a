"""The declaration table (cluster/schema.py) against the variables tunnelspec reads
(cluster/fields.py KNOWN_VARS, derived from it): every name is declared with a type and a doc; and
the types read values as `check` and the connection layer do."""

from __future__ import annotations

import pytest

from tunnelspec.cluster import schema
from tunnelspec.cluster.fields import KNOWN_VARS
from tunnelspec.core import vartypes
from tunnelspec.core.vartypes import VarValueError
from tunnelspec.inventory.addresses import ssh_address


def test_known_variables_are_the_declared_ones():
    """KNOWN_VARS is derived from the declarations: a variable cannot be read without one."""
    assert set(KNOWN_VARS) == {n for n in schema.DECLARED if not n.startswith("ansible_")}


def test_every_variable_the_code_reads_is_declared():
    """A name the model reads (`hv.get`, `hv.raw`) or a playbook renders is declared."""
    import re
    from pathlib import Path

    root = Path(schema.__file__).parents[1]
    read = set()
    for path in (root / "cluster").glob("*.py"):
        read |= set(re.findall(r"\bhv\.(?:get|raw|has)\(\"([a-z_]+)\"", path.read_text()))
    assert read and sorted(read - set(schema.DECLARED)) == []


@pytest.mark.parametrize("name", sorted(schema.DECLARED))
def test_each_declaration_has_a_type_and_a_doc(name):
    var = schema.DECLARED[name]
    assert var.name == name
    assert var.type in schema.TYPES
    assert var.doc.strip() and "\n" not in var.doc
    assert var.hosts in ("all", "main", "rpc")
    if var.type == "choice":
        assert var.choices
    if var.derived:
        assert var.default is None, "a derived default is settled by the model, not written here"
    if var.minimum is not None and var.maximum is not None:
        assert var.minimum <= var.maximum
    if var.type == "refused":
        assert var.reason, "a refusal says why and what to write instead"
    if var.name.endswith(("_password", "_pass")):
        assert var.secret


def test_declared_tunnelspec_variables_are_known():
    ours = {n for n in schema.DECLARED if not n.startswith("ansible_")}
    assert ours <= KNOWN_VARS


@pytest.mark.parametrize("value", ["nine", 99999, -1, 0, "", 22.5, True, "22.0", [22]])
def test_bad_ports(value):
    with pytest.raises(VarValueError, match="port number 1..65535"):
        vartypes.port(value)


@pytest.mark.parametrize("value,want", [(22, 22), ("2222", 2222), (" 22 ", 22), (65535, 65535)])
def test_good_ports(value, want):
    assert vartypes.port(value) == want


def test_the_connection_reads_the_port_by_its_type():
    """Was int(): 22.5 silently 22, `nine` a ValueError that ended as an internal error (exit 70)."""
    assert ssh_address("h", {"ansible_host": "192.0.2.1", "ansible_port": "2222"}) == ("192.0.2.1", 2222)
    for bad in (22.5, "nine", 99999):
        with pytest.raises(VarValueError, match="host h: variable ansible_port") as err:
            ssh_address("h", {"ansible_port": bad})
        assert err.value.exit_code == 2


@pytest.mark.parametrize("value", [
    "https://github.com/ggml-org/llama.cpp", "http://mirror.example/llama.cpp.git", "ssh://git@host/x.git",
    "git://host/x", "git@github.com:ggml-org/llama.cpp.git", "mirror:/srv/llama.cpp", "/srv/git/llama.cpp",
    "controller:../llama.cpp", "controller:/home/me/llama.cpp", "file:///srv/git/llama.cpp",
])
def test_repo_addresses(value):
    assert vartypes.repo(value) == value


@pytest.mark.parametrize("value", ["notaurl", "llama.cpp", "./llama.cpp", "~/llama.cpp", "https://", "controller:",
                                   "ftp://host/x", "-uhttps://x", ""])
def test_not_repo_addresses(value):
    with pytest.raises(VarValueError):
        vartypes.repo(value)


@pytest.mark.parametrize("word,want", [("yes", True), ("False", False), ("on", True), ("0", False), (True, True)])
def test_booleans_in_ansibles_spellings(word, want):
    assert schema.parse(schema.DECLARED["rpc_local_isolation"], word) is want


def test_a_directory_is_not_a_file(tmp_path):
    var = schema.DECLARED["tunnelspec_known_hosts"]
    with pytest.raises(VarValueError, match="is a directory"):
        schema.parse(var, ".", tmp_path)
    assert schema.parse(var, "known_hosts", tmp_path) == str(tmp_path / "known_hosts")  # need not exist yet


def test_a_secret_is_never_in_the_reason():
    for name in ("ansible_become_password", "ansible_password"):
        with pytest.raises(VarValueError) as err:
            schema.parse(schema.DECLARED[name], ["hunter2"] if name.startswith("ansible_become") else "hunter2")
        assert "hunter2" not in str(err.value)


def test_ansible_typos_and_ansibles_own_names():
    assert schema.ansible_typo("ansible_hots") == "ansible_host"
    assert schema.ansible_typo("ansible_becom") == "ansible_become"
    for name in ("ansible_host", "ansible_ssh_pipelining", "ansible_become_exe", "ansible_facts_x_unrelated"):
        assert schema.ansible_typo(name) is None


def test_refused_and_choices():
    become = schema.DECLARED["ansible_become_method"]
    assert schema.parse(become, "sudo") == "sudo"
    with pytest.raises(VarValueError, match="only sudo"):
        schema.parse(become, "su")
    with pytest.raises(VarValueError, match="keys only"):
        schema.parse(schema.DECLARED["ansible_ssh_pass"], "x")
    assert schema.parse(schema.DECLARED["ansible_ssh_timeout"], "30") == 30.0
    with pytest.raises(VarValueError):
        schema.parse(schema.DECLARED["ansible_ssh_timeout"], "0")


def test_one_rule_for_a_full_sha():
    """A pinned commit is judged in one place (core/vartypes.py full_sha, is_full_sha, FULL_SHA): no
    other module writes its own 40-hex pattern (generation records name git objects, sha1 or sha256)."""
    from pathlib import Path

    root = Path(schema.__file__).parents[1]
    own = [str(p.relative_to(root)) for p in root.rglob("*.py")
           if "{40}" in p.read_text() and p.name != "vartypes.py" and "{64}" not in p.read_text()]
    assert own == []
    for value, why in (("0123456", "short SHA"), ("v1.2", "tags and branches move"), (True, "not a full")):
        with pytest.raises(VarValueError, match=why):
            vartypes.full_sha(value)
    assert vartypes.full_sha(" " + "AB" * 20 + " ") == "ab" * 20
