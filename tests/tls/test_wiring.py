"""The pure parts of the TLS wiring: the inventory's TLS variables (errors name file:line), where the
front's certificate and key go on main, the front's TLS bind in its configuration, and that
llama-server's own command line never serves TLS (it stays plain HTTP on loopback behind the front)."""

from __future__ import annotations

import shlex

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster

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
    # HAProxy's `crt <file>` reads the key from <file>.key: the front finds it beside the certificate.
    assert tls.cert_path == "/etc/tunnelspec/tls/front.crt" and tls.key_path == tls.cert_path + ".key"
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
])
def test_refusals_name_the_variable_and_line(tmp_path, main_vars, var, words):
    with pytest.raises(ClusterError) as e:
        cluster(tmp_path, "llama_server_public_bind=true " + main_vars)
    assert e.value.var == var and words in str(e.value) and "prod.ini:2:" in str(e.value)


def test_llama_servers_own_tls_flags_stay_refused_in_extra_args(tmp_path):
    """The front speaks plain HTTP to llama-server: --ssl-* in the extra args would break it."""
    from tunnelspec.llama.speculative import owned_variable

    assert "llama_server_public_bind" in owned_variable(None, "--ssl-key-file")
    with pytest.raises(ClusterError, match="--ssl-cert-file is set by tunnelspec"):
        cluster(tmp_path, "llama_server_public_bind=true llama_server_extra_args='--ssl-cert-file /x'")
    # A cmake option that builds llama-server without OpenSSL no longer matters: TLS is the front's.
    assert cluster(tmp_path, "llama_server_public_bind=true llama_cmake_args=-DLLAMA_OPENSSL=OFF").main.tls


def test_front_terminates_tls_and_llama_server_stays_plain(tmp_path):
    """The front's variables bind TLS where users talk with the installed pair; llama-server's argv
    (from a real --help) has no --ssl-* and listens on loopback's internal port."""
    from pathlib import Path

    from tunnelspec.core.templating import render_file
    from tunnelspec.components.front.model import front_vars
    from tunnelspec.llama import flags
    from tunnelspec.components.server.args import build_server_argv

    c = cluster(tmp_path, "llama_server_public_bind=true llama_server_host=192.168.1.20 "
                "llama_server_api_key_file=/etc/tunnelspec/key")
    v = front_vars(c.main)
    assert v["public_bind"] and v["tls_pem"] == "/etc/tunnelspec/tls/front.crt"
    root = Path(__file__).resolve().parents[2]
    cfg = render_file((root / "templates" / "tunnelspec-front.cfg.j2").read_text(), v)
    assert "bind 192.168.1.20:8080 ssl crt /etc/tunnelspec/tls/front.crt ssl-min-ver TLSv1.2" in cfg, cfg
    assert f"server llama 127.0.0.1:{c.main.front.internal_port} check" in cfg and " ssl " not in cfg.split(
        "backend ")[1], cfg  # plain HTTP to llama-server
    plain = render_file((root / "templates" / "tunnelspec-front.cfg.j2").read_text(),
                        front_vars(cluster(tmp_path, "", name="plain.ini").main))
    assert "ssl" not in plain.replace("ssl-", "")

    help_ = flags.parse_help((root / "tests" / "server" / "data" / "llama-server-help-b11434.txt").read_text(),
                             build="b11434")
    argv = build_server_argv(c, help_, {15052: ["RPC0"]}, "/opt/bin/llama-server", "/m/t.gguf", "/m/d.gguf").argv
    assert not [a for a in argv if a.startswith("--ssl")], argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1", argv
    assert argv[argv.index("--port") + 1] == str(c.main.front.internal_port), argv
