"""The TLS part of the main host (docs/tls.md): read when `llama_server_public_bind=true`, which
always means TLS, terminated by the front (HAProxy) on main; llama-server itself stays plain HTTP
on loopback, so nothing about its build matters here. The names clients use, where the inventory's
CA lives on the controller, or the user's own certificate files; and where the front's certificate
and key go on main."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.constants import TLS_CERT, TLS_KEY
from tunnelspec.cluster.fields import HostVars
from tunnelspec.cluster.tls_names import ca_dir_for, parse_names

OWN_VARS = ("llama_server_tls_cert_file", "llama_server_tls_key_file", "llama_server_tls_ca_file")


@dataclass(frozen=True)
class TlsSettings:
    names: tuple[str, ...]  # llama_server_tls_names: the first is the one tunnelspec checks
    ca_dir: Path  # the inventory's CA on the controller (unused with own files)
    own_cert: Path | None = None  # the user's own files (all three or none)
    own_key: Path | None = None
    own_ca: Path | None = None
    key_path: str = TLS_KEY  # on main: HAProxy's `crt <cert_path>` loads the key from <cert_path>.key
    cert_path: str = TLS_CERT

    @property
    def own(self) -> bool:
        return self.own_cert is not None

    @property
    def ca_file(self) -> str:
        """What clients pin (a controller path)."""
        return str(self.own_ca if self.own_ca is not None else self.ca_dir / "ca.crt")

    @property
    def server_name(self) -> str:
        return self.names[0]


def _default_names(hv: HostVars) -> list[str]:
    out = []
    for name in (hv.values.get("ansible_host"), hv.host):
        try:
            parse_names([str(name)])
        except ValueError:
            continue  # e.g. an inventory name with '_' is no DNS name: not a default then
        if str(name) not in out:
            out.append(str(name))
    return out


def _controller_path(hv: HostVars, var: str) -> Path | None:
    value = hv.get(var)
    if value is None:
        return None
    return (hv.inv.path.parent / Path(value).expanduser()).absolute()


def tls_of(hv: HostVars) -> TlsSettings:
    raw = hv.raw("llama_server_tls_names", None)
    names = list(hv.get("llama_server_tls_names")) if raw is not None else _default_names(hv)
    if raw is not None and not names:
        raise hv.fail(
            "llama_server_tls_names",
            "is empty; list the names and addresses clients use, "
            "e.g. llama_server_tls_names=llm.example.org,192.168.1.20",
        )
    if not names:
        raise hv.fail(
            "llama_server_tls_names",
            f"neither ansible_host nor the name {hv.host!r} is a DNS name or "
            "address; list the names clients use, e.g. llama_server_tls_names=llm.example.org",
        )
    try:
        parsed = parse_names(names)
    except ValueError as e:
        raise hv.fail("llama_server_tls_names", str(e)) from None
    names = [str(n.value) for n in parsed]
    own = {var: _controller_path(hv, var) for var in OWN_VARS}
    given = [v for v, p in own.items() if p is not None]
    if given and len(given) != len(OWN_VARS):
        missing = [v for v in OWN_VARS if own[v] is None]
        raise hv.fail(
            given[0], f"your own certificate needs all three of {', '.join(OWN_VARS)}; missing: {', '.join(missing)}"
        )
    # The files themselves are read by `tunnelspec check`, which deploy runs first (commands/certs.py
    # check_tls_files, components/tls/own.py), errors naming the variable; commands that only read
    # (status, client-config) need no key file on this controller.
    tls_dir = _controller_path(hv, "tunnelspec_tls_dir")
    return TlsSettings(
        names=tuple(names),
        ca_dir=tls_dir if tls_dir is not None else ca_dir_for(hv.inv.path),
        own_cert=own["llama_server_tls_cert_file"],
        own_key=own["llama_server_tls_key_file"],
        own_ca=own["llama_server_tls_ca_file"],
    )
