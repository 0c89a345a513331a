"""Cluster.from_inventory: typed values from a valid inventory, and one helpful error per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster

SHA = "0123456789abcdef0123456789abcdef01234567"
PR_SHA = "1a6fee5" + "0" * 33  # patch SHAs are full, like llama_commit


def write(tmp_path: Path, main="m1 ansible_host=10.77.0.10", rpc=("r1 ansible_host=10.77.0.11 rpc_role=draft",
          "r2 ansible_host=10.77.0.12 rpc_role=target"), all_vars=(), main_vars=(), extra="") -> Path:
    lines = ["[main]", *([main] if main else []), "", "[rpc]", *rpc, "", "[all:vars]",
             "llama_repo=/srv/llama.cpp", f'llama_commit="{SHA}"', *all_vars, "", "[main:vars]",
             *main_vars, "", extra]
    path = tmp_path / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def cluster(path: Path) -> Cluster:
    return Cluster.from_inventory(load_inventory(path))


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def error(path: Path) -> ClusterError:
    with pytest.raises(ClusterError) as info:
        cluster(path)
    assert info.value.exit_code == 2
    return info.value


# ---- valid -----------------------------------------------------------------------------------
def test_defaults(tmp_path):
    c = cluster(write(tmp_path))
    assert c.main.name == "m1" and c.hosts == ["m1", "r1", "r2"]
    r1, r2 = c.rpc
    assert (r1.index, r1.rpc_port, r1.tunnel_port, r1.role, r1.bind, r1.cache) == (0, 50052, 15052, "draft", "127.0.0.1", True)
    assert (r2.index, r2.tunnel_port, r2.role, r2.devices, r2.threads) == (1, 15053, "target", (), None)
    assert c.draft_node is r1
    assert c.rpc_endpoints == ["127.0.0.1:15052", "127.0.0.1:15053"]
    assert c.main.server_host == "127.0.0.1" and c.main.server_port == 8080
    # spec_draft_n_max unset: the pinned build's own default.
    assert (c.main.target_devices, c.main.spec_draft_n_max, c.main.spec_draft_ngl) == ("none", None, "all")
    assert c.main.extra_args == () and c.main.api_key_file is None and c.main.public_bind is False
    assert c.source.repo == "/srv/llama.cpp" and c.source.commit == SHA and c.source.patches == ()
    assert r1.build.backend == "cpu" and r1.build.cmake_args == () and r1.build.force_clean is False
    assert r1.root == "/opt/tunnelspec"
    assert (r1.users.rpc, r1.users.tunnel, r1.users.llama) == ("tunnelspec-rpc", "tunnelspec-tunnel", "tunnelspec-llama")


def test_explicit_values(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "fix.patch").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    path = write(
        tmp_path,
        rpc=("r1 rpc_role=draft rpc_port=50100 tunnel_port=16000 rpc_devices=CUDA0,CUDA1 rpc_threads=8 rpc_cache=no",
             "r2 rpc_role=target rpc_bind=127.0.0.1"),
        all_vars=('llama_patches=[{"pr": 26636, "commit": "' + PR_SHA.upper() + '"}, '
                  '{"remote": "https://example.com/fork.git", "ref": "topic", "commit": "' + SHA + '"}, '
                  '{"file": "patches/fix.patch"}, {"pr": 26636, "head": "' + SHA + '"}]',
                  "llama_build_number=8841", "llama_force_clean=yes", "llama_backend=cuda",
                  'llama_cmake_args="-DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release"', "llama_build_jobs=2",
                  "tunnelspec_root=/srv/ts/", "rpc_user=rpcsvc"),
        main_vars=("llama_model=/m/t.gguf", "llama_draft_model=/m/d.gguf", "llama_server_port=9090",
                   'llama_server_extra_args="--ctx-size 4096 --metrics"', "llama_target_devices=CUDA0",
                   "spec_draft_n_max=8", "spec_draft_ngl=12"),
    )
    c = cluster(path)
    r1, r2 = c.rpc
    assert (r1.rpc_port, r1.tunnel_port, r1.devices, r1.threads, r1.cache) == (50100, 16000, ("CUDA0", "CUDA1"), 8, False)
    assert r2.tunnel_port == 15053  # default follows the node's index, whatever the others chose
    kinds = [p.kind for p in c.source.patches]
    assert kinds == ["pr", "remote", "file", "pr"]
    assert c.source.patches[0].pr == 26636 and c.source.patches[0].commit == PR_SHA
    assert c.source.patches[3].head == SHA and c.source.patches[3].commit is None  # the whole PR
    assert c.source.patches[1].remote == "https://example.com/fork.git" and c.source.patches[1].ref == "topic"
    assert c.source.patches[2].file == (tmp_path / "patches" / "fix.patch").resolve()
    assert c.source.build_number == 8841
    assert r1.build == c.main.build
    assert (r1.build.backend, r1.build.jobs, r1.build.force_clean) == ("cuda", 2, True)
    assert r1.build.cmake_args == ("-DGGML_NATIVE=OFF", "-DCMAKE_BUILD_TYPE=Release")
    assert r1.root == "/srv/ts" and r1.users.rpc == "rpcsvc"
    assert (c.main.model, c.main.draft_model, c.main.server_port) == ("/m/t.gguf", "/m/d.gguf", 9090)
    assert c.main.extra_args == ("--ctx-size", "4096", "--metrics")
    assert (c.main.target_devices, c.main.spec_draft_n_max, c.main.spec_draft_ngl) == ("CUDA0", 8, "12")
    c.require_models()


def test_public_bind_opt_out_needs_both_flags(tmp_path):
    path = write(tmp_path, main_vars=("llama_server_host=10.77.0.10", "llama_server_public_bind=true",
                                      "llama_server_api_key_file=/etc/tunnelspec/key"))
    c = cluster(path)
    assert (c.main.server_host, c.main.public_bind, c.main.api_key_file) == ("10.77.0.10", True, "/etc/tunnelspec/key")


def test_children_groups_and_example_file():
    example = Path(__file__).resolve().parents[2] / "inventory.example.ini"
    c = cluster(example)
    assert c.main.name == "gpu-box" and [n.name for n in c.rpc] == ["node-a", "node-b"]


def test_require_models(tmp_path):
    # The draft node (rpc_role defaults to draft) needs a draft model: named at the node, with the
    # way out (a split with no draft: rpc_role=target everywhere).
    path = write(tmp_path, main_vars=("llama_model=/m/t.gguf",))
    c = cluster(path)
    with pytest.raises(ClusterError) as info:
        c.require_models()
    assert info.value.host == c.draft_node.name and info.value.var == "rpc_role"
    assert "llama_draft_model is not set" in str(info.value) and "rpc_role=target" in str(info.value)


# ---- topology errors -------------------------------------------------------------------------
def test_missing_main(tmp_path):
    path = tmp_path / "i.ini"
    path.write_text(f"[rpc]\nr1\n[all:vars]\nllama_repo=x\nllama_commit=\"{SHA}\"\n")
    assert "no [main] group" in str(error(path))
    # seed 000's "keep the Mac by hand": refused, saying why (docs/first-cluster.md)
    assert "rpc nodes only is not supported" in str(error(path)) and "Keeping main by hand" in str(error(path))


def test_empty_main(tmp_path):
    err = error(write(tmp_path, main=""))
    assert "exactly one host, found 0" in str(err)


def test_two_mains(tmp_path):
    err = error(write(tmp_path, main="m1\nm2"))
    assert "exactly one host, found 2 (m1, m2)" in str(err)


def test_no_rpc(tmp_path):
    assert "no host in group [rpc]" in str(error(write(tmp_path, rpc=())))


def test_host_in_main_and_rpc(tmp_path):
    err = error(write(tmp_path, rpc=("m1", "r2 rpc_role=target")))
    assert err.host == "m1" and "both [main] and [rpc]" in str(err)


def test_two_draft_nodes_listed(tmp_path):
    path = write(tmp_path, rpc=("r1", "r2", "r3 rpc_role=target"))  # rpc_role defaults to draft
    err = error(path)
    assert err.var == "rpc_role" and "(r1, r2)" in str(err) and "rpc_role=target" in str(err)


# ---- variable errors -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rpc_line, var, needle",
    [
        ("r2 rpc_role=target rpc_bind=0.0.0.0", "rpc_bind", "unauthenticated remote code execution"),
        ("r2 rpc_role=target rpc_bind=localhost", "rpc_bind", "only listens on 127.0.0.1"),
        ("r2 rpc_role=target rpc_port=70000", "rpc_port", "out of range"),
        ("r2 rpc_role=target rpc_port=0", "rpc_port", "out of range"),
        ("r2 rpc_role=target tunnel_port=80", "tunnel_port", "privileged"),
        ("r2 rpc_role=target rpc_port=http", "rpc_port", "must be a whole number"),
        ("r2 rpc_role=target tunnel_port=15052", "tunnel_port", "already used by tunnel_port of r1"),
        ("r2 rpc_role=target tunnel_port=8080", "tunnel_port", "already used by llama_server_port of m1"),
        ("r2 rpc_role=helper", "rpc_role", "one of draft, target"),
        ("r2 rpc_role=target rpc_devices='CUDA0;rm'", "rpc_devices", "not a device name"),
        ("r2 rpc_role=target rpc_threads=0", "rpc_threads", "at least 1"),
        ("r2 rpc_role=target rpc_cache=maybe", "rpc_cache", "true or false"),
        ("r2 rpc_role=target rpc_prot=50053", "rpc_prot", "did you mean 'rpc_port'"),
        ("r2 rpc_role=target rpc_user=root", "rpc_user", "unprivileged"),
        ("r2 ansible_host=10.77.0.11 rpc_role=target", "rpc_port", "same address 10.77.0.11"),
    ],
)
def test_rpc_node_errors(tmp_path, rpc_line, var, needle):
    path = write(tmp_path, rpc=("r1 ansible_host=10.77.0.11 rpc_role=draft", rpc_line))
    err = error(path)
    assert err.host == "r2" and err.var == var
    assert needle in str(err)
    if f"{var}=" in rpc_line:
        # The error points at the line where the value was written.
        assert str(err).startswith(f"{path}:{line_of(path, rpc_line)}: host r2: variable {var}: ")
    else:
        # A value not written (a default) is cited at the line of its host.
        assert str(err).startswith(f"{path}:{line_of(path, rpc_line)}: host r2: variable {var}: ")


@pytest.mark.parametrize(
    "main_var, var, needle",
    [
        ("llama_server_host=0.0.0.0", "llama_server_host", "llama_server_public_bind=true"),
        ("llama_server_host=localhost", "llama_server_host", "refused"),
        ("llama_server_port=99999", "llama_server_port", "out of range"),
        ('llama_server_extra_args="--rpc 10.0.0.5:50052"', "llama_server_extra_args", "--rpc is set by tunnelspec"),
        ('llama_server_extra_args="--spec-draft-n-max=3"', "llama_server_extra_args", "--spec-draft-n-max is set"),
        ('llama_server_extra_args="-md /x.gguf"', "llama_server_extra_args", "-md is set"),
        ('llama_server_extra_args="--host 0.0.0.0"', "llama_server_extra_args", "--host is set"),
        ('llama_server_extra_args="-devd RPC0"', "llama_server_extra_args", "-devd is set"),
        ('llama_server_extra_args="--api-key s3cret"', "llama_server_extra_args", "--api-key is set"),
        ('llama_server_extra_args="--ctx-size \'4096"', "llama_server_extra_args", "check the quotes"),
        ("spec_draft_ngl=lots", "spec_draft_ngl", "'all' or a number"),
        ("spec_draft_n_max=0", "spec_draft_n_max", "at least 1"),
        ("llama_modle=/m/t.gguf", "llama_modle", "did you mean 'llama_model'"),
    ],
)
def test_main_host_errors(tmp_path, main_var, var, needle):
    path = write(tmp_path, main_vars=(main_var,))
    err = error(path)
    assert err.host == "m1" and err.var == var
    assert needle in str(err)
    assert str(err).startswith(f"{path}:{line_of(path, main_var)}: host m1: variable {var}: ")


def test_public_bind_without_key_file_is_refused(tmp_path):
    err = error(write(tmp_path, main_vars=("llama_server_host=10.77.0.10", "llama_server_public_bind=true")))
    assert err.var == "llama_server_host" and "llama_server_api_key_file" in str(err)


@pytest.mark.parametrize(
    "all_var, var, needle",
    [
        ('llama_commit="v1.2.3"', "llama_commit", "pin the full SHA"),
        ("llama_commit=master", "llama_commit", "not a full 40-hex commit SHA"),
        ('llama_commit="0123456"', "llama_commit", "short SHA"),
        ("llama_patches=fix.patch", "llama_patches", "must be a list literal"),
        ('llama_patches=[{"pr": 1}]', "llama_patches", "use one of {pr, commit}"),
        ('llama_patches=[{"pr": "abc", "commit": "%s"}]' % PR_SHA, "llama_patches", "positive PR number"),
        ('llama_patches=[{"pr": 5, "commit": "zzz"}]', "llama_patches", "is not a full 40-hex commit SHA"),
        ('llama_patches=[{"pr": 5, "commit": "1a6fee5"}]', "llama_patches", "a short SHA"),
        ('llama_patches=[{"pr": 5, "head": "1a6fee5"}]', "llama_patches", "a short SHA"),
        ('llama_patches=[{"pr": 5, "head": "%s", "commit": "%s"}]' % (PR_SHA, PR_SHA), "llama_patches", "{pr, head}"),
        ('llama_patches=[{"file": "missing.patch"}]', "llama_patches", "does not exist"),
        ('llama_patches=[{"remote": "--upload-pack=x", "ref": "b", "commit": "%s"}]' % PR_SHA, "llama_patches", "not starting with '-'"),
        ("llama_backend=opencl", "llama_backend", "cpu, cuda, hip, vulkan, metal"),
        ('llama_cmake_args="-DGGML_NATIVE=OFF --fresh"', "llama_cmake_args", "not a -D cache entry"),
        ('llama_cmake_args="-DGGML_RPC=OFF"', "llama_cmake_args", "set by tunnelspec"),
        ('llama_cmake_args="-DGGML_CUDA=ON"', "llama_cmake_args", "use llama_backend"),
        ("llama_build_jobs=0", "llama_build_jobs", "at least 1"),
        ("llama_build_number=abc", "llama_build_number", "must be a whole number"),
        ("llama_force_clean=perhaps", "llama_force_clean", "true or false"),
        ("tunnelspec_root=relative/dir", "tunnelspec_root", "absolute"),
        ("llama_rpeo=/x", "llama_rpeo", "did you mean 'llama_repo'"),
    ],
)
def test_source_and_build_errors(tmp_path, all_var, var, needle):
    path = write(tmp_path, all_vars=(all_var,))
    err = error(path)
    assert err.var == var and err.host == "m1"
    assert needle in str(err)
    assert str(err).startswith(f"{path}:{line_of(path, all_var)}: host m1: variable {var}: ")


def test_missing_commit_is_required(tmp_path):
    path = tmp_path / "i.ini"
    path.write_text("[main]\nm1\n[rpc]\nr1\n[all:vars]\nllama_repo=/x\n")
    err = error(path)
    assert err.var == "llama_commit" and "is required" in str(err)


def test_source_must_be_the_same_on_every_host(tmp_path):
    other = "f" * 40
    path = write(tmp_path, rpc=("r1 rpc_role=draft", f'r2 rpc_role=target llama_commit="{other}"'))
    err = error(path)
    assert err.host == "r2" and err.var == "llama_commit" and "[all:vars]" in str(err)
    assert str(err).startswith(f"{path}:{line_of(path, other)}:")


def test_ansible_vars_and_unrelated_names_are_not_typos(tmp_path):
    path = write(tmp_path, all_vars=("ansible_ssh_pipelining=true", "ansible_python_interpreter=/usr/bin/python3",
                                     "my_app_setting=1", "ntp_server=x"))
    assert cluster(path).main.name == "m1"


def test_ansible_ssh_common_args_it_cannot_carry_out_are_refused_not_ignored(tmp_path):
    """Was accepted and ignored: a ProxyJump the user relied on silently did nothing. A jump host is
    carried out now (core/ssh_args.py); an option that is not is refused with the reason."""
    assert cluster(write(tmp_path, all_vars=("ansible_ssh_common_args='-o ProxyJump=bastion'",))).main.name == "m1"
    path = write(tmp_path, all_vars=("ansible_ssh_common_args='-o ProxyJump=bastion -o ForwardAgent=yes'",))
    with pytest.raises(ClusterError, match="ansible_ssh_common_args: -o ForwardAgent=yes: not an option") as err:
        cluster(path)
    assert err.value.var == "ansible_ssh_common_args"
