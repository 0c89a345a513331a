"""client_config: a pure function of inventory-derived values; never the key, only where it is."""

from __future__ import annotations

import json

import pytest

from tunnelspec.commands.client_config import client_config, render


def test_public_bind_gives_https_ca_and_key_location(tmp_path):
    cfg = client_config(main="main", port=8443, public_bind=True, tls_names=["10.0.0.5", "main.lan"],
                        ca_file=tmp_path / "inv.ini.tls" / "ca.crt", ca_fingerprint="SHA256:AB",
                        api_key_file="/etc/tunnelspec/llama-api-key")
    assert cfg["base_url"] == "https://10.0.0.5:8443/v1" and cfg["server_url"] == "https://10.0.0.5:8443"
    assert cfg["ca_file"] == str(tmp_path / "inv.ini.tls" / "ca.crt") and cfg["ca_sha256"] == "SHA256:AB"
    assert cfg["api_key"]["path"] == "/etc/tunnelspec/llama-api-key" and cfg["api_key"]["host"] == "main"
    assert json.loads(json.dumps(cfg)) == cfg
    text = render(cfg)
    assert "https://10.0.0.5:8443/v1" in text and f"--cacert {cfg['ca_file']}" in text
    assert "/etc/tunnelspec/llama-api-key on main (not shown" in text and "$LLAMA_API_KEY" in text
    assert f"cafile={cfg['ca_file']!r}" in text


@pytest.mark.parametrize("name,host", [("Main.Example.", "main.example"), ("fe80::1", "[fe80::1]"),
                                       ("[2001:db8::2]", "[2001:db8::2]")])
def test_url_hosts(name, host):
    cfg = client_config(main="m", port=443, public_bind=True, tls_names=[name], ca_file="/c/ca.crt")
    assert cfg["base_url"] == f"https://{host}:443/v1"


def test_loopback_only():
    cfg = client_config(main="gpu1", port=8080, public_bind=False)
    assert cfg["base_url"] == "http://127.0.0.1:8080/v1" and cfg["ca_file"] is None and cfg["api_key"] is None
    assert "ssh -N -L 8080:127.0.0.1:8080 gpu1" in render(cfg) and "--cacert" not in render(cfg)


def test_refusals():
    with pytest.raises(ValueError, match="TLS name"):
        client_config(main="m", port=1, public_bind=True, tls_names=[], ca_file="/c")
    with pytest.raises(ValueError, match="CA file"):
        client_config(main="m", port=1, public_bind=True, tls_names=["m"])
    with pytest.raises(ValueError, match="port"):
        client_config(main="m", port=70000, public_bind=False)


def test_the_key_itself_never_appears(tmp_path):
    key = tmp_path / "k"
    key.write_text("sk-very-secret\n")
    cfg = client_config(main="m", port=1, public_bind=True, tls_names=["m"], ca_file="/c", api_key_file=str(key))
    assert "sk-very-secret" not in json.dumps(cfg) + render(cfg)
