"""Ansible Vault, read side: values and files encrypted with `ansible-vault` (format 1.1 and 1.2,
cipher AES256), decrypted with the run's vault password.

The format is Ansible's public one: a header line `$ANSIBLE_VAULT;1.1;AES256` (1.2 adds `;<vault-id>`,
a label only: it is not authenticated, so every password is tried whatever it names), then the hex of
three lines: the hex salt, the hex HMAC-SHA256 of the ciphertext, the hex ciphertext. PBKDF2-HMAC-SHA256
(10000 iterations) of the password and the salt gives 80 bytes: the AES-256 key, the HMAC key and the
CTR counter's initial block; the plaintext is PKCS7-padded. The HMAC is checked (in constant time)
before anything is decrypted, so a wrong password is told from a damaged vault.

Where the password comes from (a file, a script, the terminal) is the CLI's business
(core/vault_password.py); it hands this module the sources with `use_passwords`, and they are read at
the first vault data met, once. A decrypted value is a `Secret` (core/secrets.py): never shown.
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable
from dataclasses import dataclass


HEADER = "$ANSIBLE_VAULT"
_VERSIONS = ("1.1", "1.2")
_KEY, _IV = 32, 16


class VaultError(Exception):
    """Vault data that cannot be decrypted; the message says why (never the data or a password)."""


class VaultFormatError(VaultError):
    """Not vault data as ansible-vault writes it."""


class VaultPasswordError(VaultError):
    """No vault password, or its source could not give one."""


class VaultDecryptError(VaultError):
    """No vault password opens the data."""


@dataclass(frozen=True)
class Envelope:
    version: str
    cipher: str
    vault_id: str | None
    body: bytes  # the hex of salt, HMAC and ciphertext (the header and line breaks removed)


def is_vaulted(data: str | bytes) -> bool:
    if isinstance(data, bytes):
        return data.lstrip().startswith(HEADER.encode())
    return data.lstrip().startswith(HEADER)


def parse_envelope(text: str | bytes) -> Envelope:
    raw = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    lines = raw.strip().splitlines()
    if not lines:
        raise VaultFormatError("empty vault data")
    fields = [f.strip() for f in lines[0].strip().split(";")]
    if fields[0] != HEADER or len(fields) < 3:
        raise VaultFormatError(f"not a vault header ({HEADER};1.1;AES256 expected)")
    version, cipher = fields[1], fields[2]
    if version not in _VERSIONS:
        raise VaultFormatError(f"vault format version {version!r} is not known (1.1 and 1.2 are)")
    if cipher != "AES256":
        raise VaultFormatError(f"vault cipher {cipher!r} is not supported (AES256 is)")
    vault_id = fields[3] if len(fields) > 3 and fields[3] else None
    body = "".join(line.strip() for line in lines[1:])
    try:
        return Envelope(version, cipher, vault_id, body.encode("ascii"))
    except UnicodeEncodeError:
        raise VaultFormatError("the vault body is not hex text") from None


def _unhex(data: bytes, what: str) -> bytes:
    try:
        return binascii.unhexlify(data.strip())
    except (binascii.Error, ValueError):
        raise VaultFormatError(f"the vault {what} is not valid hex (a damaged or truncated copy?)") from None


def _parts(env: Envelope) -> tuple[bytes, bytes, bytes]:
    inner = _unhex(env.body, "body")
    pieces = inner.split(b"\n", 2)
    if len(pieces) != 3:
        raise VaultFormatError("the vault body does not hold salt, HMAC and ciphertext (a damaged copy?)")
    salt, mac, ciphertext = pieces
    return _unhex(salt, "salt"), _unhex(mac, "HMAC"), _unhex(ciphertext, "ciphertext")


@functools.lru_cache(maxsize=64)
def _keys(password: bytes, salt: bytes) -> tuple[bytes, bytes, bytes]:
    from cryptography.hazmat.primitives import hashes  # lazy: only a vault pays for cryptography's import
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC  # lazy: as above

    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=2 * _KEY + _IV, salt=salt, iterations=10000)
    derived = kdf.derive(password)
    return derived[:_KEY], derived[_KEY : 2 * _KEY], derived[2 * _KEY :]


def decrypt_with(text: str | bytes, password: bytes) -> bytes:
    """The plaintext of one vault, with one password. VaultDecryptError when the HMAC does not match
    (the wrong password), VaultFormatError when the data is not a vault."""
    # Only a vault pays for cryptography's import (≈ 10 ms of every command's start-up otherwise).
    from cryptography.exceptions import InvalidSignature  # lazy: cryptography, for a vault only
    from cryptography.hazmat.primitives import hashes, padding  # lazy: as above
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # lazy: as above
    from cryptography.hazmat.primitives.hmac import HMAC  # lazy: as above

    salt, mac, ciphertext = _parts(parse_envelope(text))
    aes_key, mac_key, iv = _keys(password, salt)
    check = HMAC(mac_key, hashes.SHA256())
    check.update(ciphertext)
    try:
        check.verify(mac)  # constant time (cryptography's own comparison)
    except InvalidSignature:
        raise VaultDecryptError("decryption failed (wrong vault password?)") from None
    decryptor = Cipher(algorithms.AES(aes_key), modes.CTR(iv)).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(decryptor.update(ciphertext) + decryptor.finalize()) + unpadder.finalize()
    except ValueError:
        raise VaultFormatError("the decrypted data has no valid padding (a damaged vault?)") from None


# ---- the run's passwords ----------------------------------------------------------------------------
# Each source returns one password (bytes) or raises VaultPasswordError. Read at the first vault data
# met and kept for the rest of the process (a prompt is answered once).
_sources: list[Callable[[], bytes]] = []
_passwords: list[bytes] | None = None
_failure: VaultPasswordError | None = None


def use_passwords(sources: list[Callable[[], bytes]]) -> None:
    """The run's password sources, in the order they are tried (the CLI's options)."""
    global _passwords, _failure
    _sources[:] = sources
    _passwords, _failure = None, None


def hold_passwords() -> None:
    """No source is read from now on (a crash report rereading -e files); passwords read are kept."""
    global _failure
    if _passwords is None and _failure is None:
        _failure = VaultPasswordError("the vault password was not read before the error")


def _read_passwords() -> list[bytes]:
    global _passwords, _failure
    if _failure is not None:
        raise _failure
    if _passwords is None:
        if not _sources:
            raise VaultPasswordError(
                "no vault password was given: pass --vault-password-file FILE "
                "(or set ANSIBLE_VAULT_PASSWORD_FILE), or --ask-vault-pass at a terminal"
            )
        try:
            _passwords = [source() for source in _sources]
        except VaultPasswordError as err:
            _failure = err
            raise
    return _passwords


def decrypt(text: str | bytes) -> bytes:
    """The plaintext of vault data, with the first of the run's passwords that opens it."""
    env = parse_envelope(text)  # a malformed vault is told before any password is asked for
    _parts(env)
    passwords = _read_passwords()
    for password in passwords:
        try:
            return decrypt_with(text, password)
        except VaultDecryptError:
            continue
    raise VaultDecryptError("decryption failed (wrong vault password?)")


def decrypt_text(text: str | bytes) -> str:
    plain = decrypt(text)
    try:
        return plain.decode("utf-8")
    except UnicodeDecodeError:
        raise VaultFormatError("the decrypted value is not UTF-8 text") from None
