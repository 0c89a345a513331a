"""Ansible Vault, read side (core/vault.py, inventory/vaulted.py): the committed fixtures were made by
ansible-vault (tests/inventory/vault/README.md), so the decryptor is tested without it; where
ansible-vault is installed, fresh vaults of every shape are made at test time too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunnelspec.core import vault, vault_password
from tunnelspec.core.errors import InventoryError, UsageError
from tunnelspec.core.secrets import Secret, secret_values
from tunnelspec.inventory import load_inventory
from tunnelspec.inventory.extra_file import read_extra_vars_file

FIXTURES = Path(__file__).parent / "vault"
PASSWORD = b"correct horse battery staple"
ANSIBLE_VAULT = shutil.which("ansible-vault") or str(Path(sys.executable).parent / "ansible-vault")


@pytest.fixture(autouse=True)
def no_passwords():
    vault.use_passwords([])
    yield
    vault.use_passwords([])


def _with(password: bytes) -> None:
    vault.use_passwords([lambda: password])


# ---- the committed fixtures -----------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_committed_values_decrypt(version):
    text = (FIXTURES / f"value-{version}.vault").read_text()
    env = vault.parse_envelope(text)
    assert (env.version, env.cipher, env.vault_id) == (version, "AES256", "prod" if version == "1.2" else None)
    assert vault.decrypt_with(text, PASSWORD) == f"fixture-plaintext-{version}".encode()


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_wrong_password_is_told_from_damage(version):
    text = (FIXTURES / f"value-{version}.vault").read_text()
    with pytest.raises(vault.VaultDecryptError, match=r"decryption failed \(wrong vault password\?\)"):
        vault.decrypt_with(text, b"not it")


def _damaged(text: str) -> dict[str, str]:
    header, *body = text.splitlines()
    return {
        "not hex": header + "\n" + "zz" + "".join(body)[2:],
        "truncated": header + "\n" + "".join(body)[:40],
        "odd length": header + "\n" + "".join(body)[:-1],
        "version": header.replace("1.1", "9.9") + "\n" + "\n".join(body),
        "cipher": header.replace("AES256", "AES") + "\n" + "\n".join(body),
        "header": "$ANSIBLE_VAULT\n" + "\n".join(body),
        "empty": "",
    }


@pytest.mark.parametrize("kind", list(_damaged("$ANSIBLE_VAULT;1.1;AES256\n00")))
def test_malformed_vault_is_a_format_error(kind):
    text = _damaged((FIXTURES / "value-1.1.vault").read_text())[kind]
    _with(PASSWORD)
    with pytest.raises(vault.VaultFormatError):
        vault.decrypt(text)


def test_a_flipped_ciphertext_byte_fails_the_hmac():
    header, *body = (FIXTURES / "value-1.1.vault").read_text().splitlines()
    inner = bytes.fromhex("".join(body)).split(b"\n")
    last = bytearray(bytes.fromhex(inner[2].decode()))
    last[0] ^= 1
    inner[2] = last.hex().encode()
    tampered = header + "\n" + b"\n".join(inner).hex()
    with pytest.raises(vault.VaultDecryptError):
        vault.decrypt_with(tampered, PASSWORD)


def test_no_password_is_said_before_anything_is_asked():
    with pytest.raises(vault.VaultPasswordError, match="--vault-password-file"):
        vault.decrypt((FIXTURES / "value-1.1.vault").read_text())


def test_every_password_is_tried_and_asked_once():
    asked = []

    def source(pw):
        return lambda: asked.append(pw) or pw

    vault.use_passwords([source(b"first"), source(PASSWORD)])
    for version in ("1.1", "1.2", "1.1"):
        assert vault.decrypt_text((FIXTURES / f"value-{version}.vault").read_text()) == f"fixture-plaintext-{version}"
    assert asked == [b"first", PASSWORD]


# ---- inventories and -e @FILE ---------------------------------------------------------------------
def _yaml_inventory(tmp_path: Path, version: str = "1.1") -> Path:
    value = "\n".join("            " + line for line in (FIXTURES / f"value-{version}.vault").read_text().splitlines())
    path = tmp_path / "inv.yml"
    path.write_text(
        "all:\n  children:\n    main:\n      hosts:\n        m1:\n          ansible_host: 127.0.0.1\n"
        f"          my_service_url: !vault |\n{value}\n"
    )
    return path


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_yaml_inventory_value_is_a_secret(tmp_path, version):
    _with(PASSWORD)
    inv = load_inventory(_yaml_inventory(tmp_path, version))
    value = inv.host_vars("m1")["my_service_url"]
    assert isinstance(value, Secret) and value.reveal() == f"fixture-plaintext-{version}"
    assert f"fixture-plaintext-{version}" in secret_values(inv.host_vars("m1"))  # masked though not secret-named
    assert inv.hosts["m1"].origins["my_service_url"][1] == 7


def test_yaml_inventory_without_password_names_file_line_and_variable(tmp_path):
    path = _yaml_inventory(tmp_path)
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert str(err.value).startswith(f"{path}:7: variable 'my_service_url' is vault-encrypted: no vault password")


def test_yaml_inventory_wrong_password(tmp_path):
    _with(b"wrong")
    path = _yaml_inventory(tmp_path)
    with pytest.raises(InventoryError, match=r"inv.yml:7: variable 'my_service_url'.*wrong vault password"):
        load_inventory(path)


def test_whole_vaulted_inventory_is_refused_clearly(tmp_path):
    path = tmp_path / "inv.yml"
    shutil.copy(FIXTURES / "vars.vault.yml", path)
    with pytest.raises(InventoryError, match="encrypted with ansible-vault as a whole"):
        load_inventory(path)


def test_whole_vaulted_extra_vars_file():
    _with(PASSWORD)
    data = read_extra_vars_file(str(FIXTURES / "vars.vault.yml"))
    assert data == {"fixture_token": "whole-file-plaintext", "fixture_port": 2222}
    assert isinstance(data["fixture_token"], Secret) and not isinstance(data["fixture_port"], Secret)


def test_vault_values_in_extra_vars_file(tmp_path):
    value = "\n".join("  " + line for line in (FIXTURES / "value-1.2.vault").read_text().splitlines())
    path = tmp_path / "vars.yml"
    path.write_text(f"plain: 1\nmy_thing: !vault |\n{value}\n")
    with pytest.raises(UsageError, match=r"vars.yml:2: variable 'my_thing' is vault-encrypted: no vault password"):
        read_extra_vars_file(str(path))
    _with(PASSWORD)
    data = read_extra_vars_file(str(path))
    assert data["plain"] == 1 and isinstance(data["my_thing"], Secret)


def test_whole_vaulted_extra_vars_file_wrong_password():
    _with(b"wrong")
    with pytest.raises(UsageError, match=r"vars.vault.yml:1: -e @FILE is vault-encrypted: decryption failed"):
        read_extra_vars_file(str(FIXTURES / "vars.vault.yml"))


# ---- where the password comes from ----------------------------------------------------------------
def test_password_file_and_script(tmp_path):
    plain = tmp_path / "pw"
    plain.write_bytes(b"  secret-one \r\n")
    assert vault_password.from_file(str(plain), "test")() == b"secret-one"
    script = tmp_path / "pw.sh"
    script.write_text("#!/bin/sh\necho secret-two\n")
    script.chmod(0o700)
    assert vault_password.from_file(str(script), "test")() == b"secret-two"
    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o700)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path, why in ((failing, "exited with 3"), (empty, "empty"), (tmp_path / "nope", "does not exist"),
                      (tmp_path, "is a directory")):
        with pytest.raises(vault.VaultPasswordError, match=why):
            vault_password.from_file(str(path), "test")()


def test_env_password_file_only_without_options(tmp_path):
    env = {vault_password.ENV_FILE: str(tmp_path / "pw")}
    assert len(vault_password.sources((), False, env)) == 1
    assert len(vault_password.sources(("a",), False, env)) == 1
    assert vault_password.sources((), False, {}) == []
    assert vault_password.sources((), True, {}, vault_ids=("dev@prompt",)) == [vault_password.from_terminal]
    ids = vault_password.sources((), False, env, vault_ids=("prod@/x", "/y"))
    assert len(ids) == 2 and all(s is not vault_password.from_terminal for s in ids)


def test_ask_without_a_terminal_fails_at_once():
    """In a new session there is no controlling terminal: the prompt is refused, stdin is never read."""
    code = ("from tunnelspec.core import vault, vault_password\n"
            "try:\n    vault_password.from_terminal()\nexcept vault.VaultPasswordError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       start_new_session=True, stdin=subprocess.PIPE, env={**os.environ})
    assert "needs a terminal" in p.stdout, p.stdout + p.stderr


# ---- fresh vaults made by ansible-vault ----------------------------------------------------------
needs_ansible_vault = pytest.mark.skipif(not os.access(ANSIBLE_VAULT, os.X_OK),
                                         reason="ansible-vault is not installed (the committed fixtures still run)")


@needs_ansible_vault
@pytest.mark.parametrize("vault_id", [None, "prod"])
@pytest.mark.parametrize("plaintext", ["x", "a" * 16, "pässwörd ✓ with spaces", "line one\nline two\n"])
def test_fresh_ansible_vault_strings(tmp_path, vault_id, plaintext):
    pw = tmp_path / "pw"
    pw.write_text("fresh-password\n")
    source = f"{vault_id}@{pw}" if vault_id else str(pw)
    flag = "--vault-id" if vault_id else "--vault-password-file"
    p = subprocess.run([ANSIBLE_VAULT, "encrypt_string", flag, source, "--stdin-name", "v"], input=plaintext,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    text = "\n".join(line.strip() for line in p.stdout.splitlines()[1:])
    assert text.startswith(f"$ANSIBLE_VAULT;{'1.2' if vault_id else '1.1'};AES256")
    assert vault.decrypt_with(text, b"fresh-password").decode() == plaintext
    with pytest.raises(vault.VaultDecryptError):
        vault.decrypt_with(text, b"fresh-passwore")


def test_a_crash_report_reads_no_password_source():
    asked = []
    vault.use_passwords([lambda: asked.append(1) or PASSWORD])
    vault.hold_passwords()
    with pytest.raises(vault.VaultPasswordError):
        vault.decrypt((FIXTURES / "value-1.1.vault").read_text())
    assert asked == []
    _with(PASSWORD)
    assert vault.decrypt_text((FIXTURES / "value-1.1.vault").read_text()) == "fixture-plaintext-1.1"
    vault.hold_passwords()  # passwords already read are kept
    assert vault.decrypt_text((FIXTURES / "value-1.1.vault").read_text()) == "fixture-plaintext-1.1"
