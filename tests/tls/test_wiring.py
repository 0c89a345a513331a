"""The pure parts of the TLS wiring: the inventory's TLS variables (errors name file:line), the
build option read from the tree, the argv flags, the binary's TLS evidence, bench's baseline."""

from __future__ import annotations

import shlex

import pytest

from tunnelspec.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.inventory.cluster import Cluster
from tunnelspec.llama import build_plan as bp
from tunnelspec.tls import build as tls_build

SHA = "0123456789abcdef0123456789abcdef01234567"


def cluster(tmp_path, main_vars: str = "llama_server_public_bind=true", name: str = "prod.ini") -> Cluster:
    inv = tmp_path / name
    inv.write_text(f"""[main]
gpu ansible_host=192.168.1.20 {main_vars}

[rpc]
laptop ansible_host=192.168.1.30

[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit={SHA}
""")
    return Cluster.from_inventory(load_inventory(str(inv)))


def test_public_bind_means_tls_with_default_names(tmp_path):
    tls = cluster(tmp_path).main.tls
    assert tls.names == ("192.168.1.20", "gpu") and tls.server_name == "192.168.1.20"
    assert tls.ca_file == str(tmp_path / "prod.ini.tls" / "ca.crt") and not tls.own
    assert tls.key_path == "/etc/tunnelspec/tls/llama-server.key"
    assert cluster(tmp_path, "").main.tls is None


def test_names_dir_and_own_files(tmp_path):
    c = cluster(tmp_path, "llama_server_public_bind=true llama_server_tls_names=LLM.example.org,[::1] "
                "tunnelspec_tls_dir=secrets/ca")
    assert c.main.tls.names == ("llm.example.org", "::1")
    assert c.main.tls.ca_dir == tmp_path / "secrets" / "ca"
    own = cluster(tmp_path, "llama_server_public_bind=true llama_server_tls_cert_file=a.crt "
                  "llama_server_tls_key_file=a.key llama_server_tls_ca_file=/pki/ca.crt").main.tls
    assert own.own and own.ca_file == "/pki/ca.crt" and own.own_key == tmp_path / "a.key"


@pytest.mark.parametrize("main_vars,var,words", [
    ("llama_server_tls_names=*.example.org", "llama_server_tls_names", "wildcards"),
    ("llama_server_tls_cert_file=a.crt", "llama_server_tls_cert_file", "missing: llama_server_tls_key_file"),
    ("llama_cmake_args=-DLLAMA_OPENSSL=OFF", "llama_cmake_args", "without TLS"),
])
def test_refusals_name_the_variable_and_line(tmp_path, main_vars, var, words):
    with pytest.raises(ClusterError) as e:
        cluster(tmp_path, "llama_server_public_bind=true " + main_vars)
    assert e.value.var == var and words in str(e.value) and "prod.ini:2:" in str(e.value)


def test_tree_option_for_tls():
    assert bp.tls_options({"LLAMA_OPENSSL", "GGML_RPC"}, "t") == ["-DLLAMA_OPENSSL=ON"]
    assert bp.tls_options({"LLAMA_SERVER_SSL"}, "t") == ["-DLLAMA_SERVER_SSL=ON"]
    with pytest.raises(ValueError, match="declares neither LLAMA_OPENSSL nor LLAMA_SERVER_SSL"):
        bp.tls_options({"GGML_RPC"}, "t")


def test_binary_evidence(tmp_path):
    import subprocess

    def probe(text: bytes):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        exe = d / "llama-server"
        exe.write_bytes(b"\x7fELF" + text)
        exe.chmod(0o755)
        return tls_build.parse(subprocess.run(tls_build.probe_argv(str(exe)), capture_output=True, text=True).stdout)

    assert probe(b"...Running with SSL: key = %s...") == "yes"
    assert probe(b"...the server is built without SSL support\n...") == "no"
    assert probe(b"nothing") == "unknown"
    assert tls_build.parse(subprocess.run(tls_build.probe_argv(str(tmp_path / "none")), capture_output=True,
                                          text=True).stdout) == "missing"


def test_argv_has_the_tls_flags_and_extra_args_may_not(tmp_path):
    from tunnelspec.llama.speculative import owned_variable

    assert "llama_server_public_bind" in owned_variable(None, "--ssl-key-file")
    with pytest.raises(ClusterError, match="--ssl-cert-file is set by tunnelspec"):
        cluster(tmp_path, "llama_server_public_bind=true llama_server_extra_args='--ssl-cert-file /x'")


def test_bench_baseline_listens_on_loopback():
    from tunnelspec.bench import baseline_argv

    argv = shlex.split("/b/llama-server -m /t --spec-draft-model /d --host 10.0.0.5 --port 8080 "
                       "--ssl-key-file /k --ssl-cert-file /c")
    assert baseline_argv(argv, "none", 8081) == shlex.split(
        "/b/llama-server -m /t --host 127.0.0.1 --ssl-key-file /k --ssl-cert-file /c -dev none --port 8081")
