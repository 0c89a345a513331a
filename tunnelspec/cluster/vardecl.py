"""What a variable's declaration is (`Var`) and how a value is read by its declared type. Pure:
no inventory, no host. The declarations themselves are in vars_ansible.py, vars_hosts.py and
vars_main.py; cluster/schema.py puts them together and checks an inventory with them.

A type reads one value alone. What depends on another variable (llama_server_host needs the API key
file, metrics_port must differ from llama-server's port) is a relation, checked by the model's
readers (host_sections.py, front_vars.py, tls_vars.py, placement.py) after every value was read.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunnelspec.cluster import host_kinds
from tunnelspec.cluster import hub_ref as hub
from tunnelspec.core import ssh_args, vartypes, writable
from tunnelspec.core.secrets import Secret
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.vartypes import VarValueError
from tunnelspec.inventory.values import USER_NAME


@dataclass(frozen=True)
class Var:
    name: str
    type: str  # a key of PARSERS
    doc: str  # one line: what it does
    # The value when unset. None: required, or unset means "not used" (the doc says which); a
    # default worked out from other values (`derived`) is settled by the cluster model.
    default: Any = None
    secret: bool = False  # never printed, not even in an error
    hosts: str = "all"  # "all", "main" or "rpc": the hosts that read it
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    reason: str = ""  # type "refused": why, and what to write instead
    derived: str = ""  # the default in words when it comes from other values ("ansible_host")
    by_command: bool = False  # set by a tunnelspec command with -e, not written in an inventory

    @property
    def default_text(self) -> str:
        """The default as the docs show it."""
        if self.derived:
            return self.derived
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, (list, tuple)):
            return "[]" if not self.default else ",".join(map(str, self.default))
        return str(self.default)


Parser = Callable[[Var, Any, Any], Any]


def _int(var: Var, value: Any, base_dir) -> int:
    low = None if var.minimum is None else int(var.minimum)
    high = None if var.maximum is None else int(var.maximum)
    return vartypes.integer(value, low, high)


def _choice(var: Var, value: Any, base_dir) -> str:
    text = vartypes.string(value)
    if text not in var.choices:
        if len(var.choices) == 1:
            raise VarValueError(f"{text!r} is not supported: only {var.choices[0]}")
        raise VarValueError(f"must be one of {', '.join(var.choices)}; got {text!r}")
    return text


def _user(var: Var, value: Any, base_dir) -> str:
    name = vartypes.string(value)
    if not USER_NAME.match(name) or name == "root":
        raise VarValueError(f"{name!r} is not a valid unprivileged system user name (e.g. {var.default})")
    return name


def _users(var: Var, value: Any, base_dir) -> list[str]:
    names = _csv(var, value, base_dir)
    for name in names:
        if not USER_NAME.match(name) or name == "root":
            raise VarValueError(f"{name!r} is not a user name (root may connect anyway)")
    return names


def _csv(var: Var, value: Any, base_dir) -> list[str]:
    """`CUDA0,CUDA1` (or a list literal) -> ["CUDA0", "CUDA1"]."""
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _devices(var: Var, value: Any, base_dir) -> list[str]:
    devices = _csv(var, value, base_dir)
    for device in devices:
        if not _DEVICE.match(device):
            raise VarValueError(f"{device!r} is not a device name (like CPU, CUDA0, Vulkan1)")
    return devices


def _words(var: Var, value: Any, base_dir) -> list[str]:
    """A string split like a shell command line, or a list literal of strings."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    if not isinstance(value, str):
        raise VarValueError(f"must be a string of arguments, got {value!r}")
    try:
        return shlex.split(value)
    except ValueError as err:
        raise VarValueError(f"cannot split into arguments ({err}); check the quotes") from None


def _patches(var: Var, value: Any, base_dir) -> list:
    # Each entry (its keys, its SHAs, its file beside the inventory) is read by patches.py.
    if not isinstance(value, list):
        raise VarValueError(
            'must be a list literal, e.g. [{"pr": 123, "commit": "<sha>"}, {"file": "patches/x.patch"}]'
        )
    return value


def _loopback(var: Var, value: Any, base_dir) -> str:
    bind = vartypes.string(value)
    if bind != LOOPBACK:
        raise VarValueError(
            f"{bind!r} refused: the RPC protocol is unauthenticated remote code execution, so "
            f"ggml-rpc-server only listens on {LOOPBACK} and is reached through the SSH tunnel; remove {var.name}"
        )
    return bind


def _ngl(var: Var, value: Any, base_dir) -> str:
    if not (value == "all" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)):
        raise VarValueError(f"must be 'all' or a number of layers (0 or more), got {value!r}")
    return str(value)


def _probability(var: Var, value: Any, base_dir) -> float:
    return vartypes.fraction(value, 0.0, 1.0, "a probability between 0 and 1")


def _share(var: Var, value: Any, base_dir) -> float:
    return vartypes.fraction(value, 0.0, None, "a number (0 or more)")


def _model(var: Var, value: Any, base_dir) -> str:
    text = vartypes.string(value)
    if hub.is_hub_ref(text) or text.lower().startswith(("hf:", "huggingface:")):
        try:
            return str(hub.parse_ref(text))
        except hub.HubRefError as err:
            raise VarValueError(str(err)) from None
    return text


def _abspath(var: Var, value: Any, base_dir) -> str:
    text = vartypes.string(value)
    if not text.startswith("/"):
        raise VarValueError(f"must be an absolute path on the main host, got {text!r}")
    return text


# The services that read these files run with ProtectHome=yes and PrivateTmp=yes: a file below these
# is invisible to them (llama-server would fail to start, seen only as "not healthy" minutes later).
SANDBOX_HIDDEN_DIRS = ("/home/", "/root/", "/run/user/", "/tmp/", "/var/tmp/")
# Per file on main that holds a credential: (whose sandbox, what root does with it, an example path).
_CREDENTIAL_FILES = {
    "llama_server_api_key_file": (
        "llama-server's",
        "root reads the key there (systemd's LoadCredential=, verify)",
        "/etc/tunnelspec/llama-api-key",
    ),
    "metrics_token_file": (
        "the front's",
        "root makes the file private and compares it with the API key there",
        "/etc/tunnelspec/metrics-token",
    ),
}


def _credential_file(var: Var, value: Any, base_dir) -> str:
    """A file on main holding a key or token: absolute, visible to the service's sandbox, and out of
    every place a service user can write (SECURITY.md, invariant A)."""
    path = _abspath(var, value, base_dir)
    who, root_does, example = _CREDENTIAL_FILES[var.name]
    hidden = next((d for d in SANDBOX_HIDDEN_DIRS if path.startswith(d)), None)
    if hidden:
        raise VarValueError(
            f"{path!r} is under {hidden}, which {who} sandbox hides (ProtectHome=yes, PrivateTmp=yes): "
            f"it could not read the file; use e.g. {example}"
        )
    place = writable.place_of(path)
    if place is not None:
        raise VarValueError(
            f"{path!r} is in {place.path}, which a service user can write: {root_does} and would follow "
            f"a link put in its place (SECURITY.md, invariant A); use e.g. {example}"
        )
    return path


def _sha(var: Var, value: Any, base_dir) -> str:
    try:
        return vartypes.full_sha(value)
    except VarValueError as err:
        raise VarValueError(f'{err}: {var.name}="<sha>"') from None


_PAIR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*$")


def _tensor_split(var: Var, value: Any, base_dir) -> list[tuple[str, float]]:
    """`rpc-a=1,rpc-b=3` (or a mapping) -> [("rpc-a", 1.0), ("rpc-b", 3.0)]; whether each name is a
    node or a device of main's is the cluster's question (placement.py)."""
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        items = []
        for part in value.split(","):
            if not part.strip():
                continue
            m = _PAIR.match(part)
            if not m:
                raise VarValueError(
                    f"{part.strip()!r} is not NAME=WEIGHT (e.g. rpc-a=1,rpc-b=3): "
                    "proportions are given by node or device name, not by position"
                )
            items.append((m.group(1), m.group(2)))
    else:
        raise VarValueError(
            f'must be NAME=WEIGHT pairs like "rpc-a=1,rpc-b=3" (by node or device name, not by position), got {value!r}'
        )
    if not items:
        raise VarValueError("is empty; give NAME=WEIGHT pairs or remove the line")
    return [(name, vartypes.fraction(weight, 0.0, None, "a number (0 or more)")) for name, weight in items]


def _ssh_args(var: Var, value: Any, base_dir) -> Any:
    try:
        return ssh_args.parse(value)
    except ssh_args.SshArgsError as err:
        raise VarValueError(str(err)) from None


def _refused(var: Var, value: Any, base_dir) -> Any:
    raise VarValueError(var.reason)


def _as_is(var: Var, value: Any, base_dir) -> Any:
    return value


def _kind(read: Callable[[Any], Any]) -> Parser:
    return lambda var, value, base_dir: read(value)


PARSERS: dict[str, Parser] = {
    "port": lambda var, value, base_dir: vartypes.port(value),
    "service_port": lambda var, value, base_dir: vartypes.service_port(value),
    "int": _int,
    "seconds": lambda var, value, base_dir: vartypes.number(value),
    "bool": lambda var, value, base_dir: vartypes.boolean(value),
    "repo": lambda var, value, base_dir: vartypes.repo(value),
    "file": lambda var, value, base_dir: vartypes.file_path(value, base_dir),
    "string": lambda var, value, base_dir: vartypes.string(value),
    "address": lambda var, value, base_dir: vartypes.address(value),
    "choice": _choice,
    "sha": _sha,
    "user": _user,
    "users": _users,
    "list": _csv,
    "devices": _devices,
    "words": _words,
    "cmake_args": lambda var, value, base_dir: host_kinds.cmake_args(_words(var, value, base_dir)),
    "server_args": lambda var, value, base_dir: host_kinds.server_args(_words(var, value, base_dir)),
    "patches": _patches,
    "loopback": _loopback,
    "layers": _ngl,
    "probability": _probability,
    "share": _share,
    "model": _model,
    "abspath": _abspath,
    "credential_file": _credential_file,
    "tensor_split": _tensor_split,
    "root": _kind(host_kinds.root_dir),
    "backend": _kind(host_kinds.backend),
    "cuda_archs": _kind(host_kinds.cuda_architectures),
    "env": _kind(host_kinds.rpc_env),
    "ssh_args": _ssh_args,
    "refused": _refused,
    "ignored": _as_is,
}
TYPES = tuple(PARSERS)


def parse(var: Var, value: Any, base_dir=None) -> Any:
    """The value read by its type; VarValueError with the reason (a secret's value never in it)."""
    try:
        return PARSERS[var.type](var, value, base_dir)
    except VarValueError as err:
        if var.secret and var.type != "refused":
            raise VarValueError("must be text (the value is a secret and is not shown)") from None
        if isinstance(value, Secret):  # a vault-encrypted value: the reason without the value
            reason = str(err).split(", got ", 1)[0]
            raise VarValueError(f"{reason} (the value is vault-encrypted and is not shown)") from None
        raise err from None
