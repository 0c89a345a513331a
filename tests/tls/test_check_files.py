"""The TLS files are read offline, by `tunnelspec check` and so first in a deploy: a CA key others may
read, or a file of your own that is not what its variable says, is exit 2 naming the variable, before
any host is contacted (nothing listens on the inventory's port 9: a connection would be exit 4)."""

from __future__ import annotations

import os
from pathlib import Path

from tunnelspec.components.tls import ca as C

from support.cli import tunnelspec
from support.offline import unreachable_inventory

PUBLIC = ("llama_server_public_bind=true llama_server_host=10.77.0.9 "
          "llama_server_api_key_file=/etc/tunnelspec/llama-api-key")


def inventory(tmp_path: Path, main_vars: str) -> Path:
    return unreachable_inventory(tmp_path, f"{PUBLIC} {main_vars}")


def run(*args: str, cwd: Path):
    return tunnelspec(*args, env={"XDG_CACHE_HOME": str(cwd / "cache")}, cwd=cwd, timeout=60)


def test_a_ca_key_others_may_read_stops_check_and_deploy(tmp_path):
    inv = inventory(tmp_path, "")
    assert run("check", str(inv), cwd=tmp_path).rc == 0  # no CA yet: deploy makes one
    C.ensure_ca(C.ca_dir_for(inv))
    os.chmod(C.ca_dir_for(inv) / C.CA_KEY, 0o644)
    for command in ("check", "deploy"):
        res = run(command, str(inv), cwd=tmp_path)
        assert res.rc == 2, res.stdout + res.stderr
        said = res.stdout + res.stderr  # both report their ERROR lines on stderr
        assert f"{inv}:2: " in said and "llama_server_public_bind" in said and "too open" in said, said
        assert "unreachable" not in said.lower()
    os.chmod(C.ca_dir_for(inv) / C.CA_KEY, 0o600)
    assert run("check", str(inv), cwd=tmp_path).rc == 0


def test_own_files_that_are_not_a_key_stop_check_naming_the_variable(tmp_path):
    ca = C.ensure_ca(tmp_path / "pki")[0]
    issued = C.issue_server_cert(ca, ["10.77.0.9"])
    (tmp_path / "server.crt").write_text(issued.cert_pem)
    (tmp_path / "server.key").write_text("not a key\n")
    (tmp_path / "ca.crt").write_bytes((tmp_path / "pki" / C.CA_CERT).read_bytes())
    inv = inventory(tmp_path, "llama_server_tls_cert_file=server.crt llama_server_tls_key_file=server.key "
                              "llama_server_tls_ca_file=ca.crt")
    res = run("check", str(inv), cwd=tmp_path)
    assert res.rc == 2, res.stdout + res.stderr
    assert f"{inv}:2: host main: variable llama_server_tls_key_file" in res.stderr, res.stderr
