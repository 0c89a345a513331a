"""The TLS names of the main host and where its CA lives, as the inventory gives them: the pure part of
the inventory's certificate authority (tunnelspec/components/tls/ca.py issues the certificates)."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def ca_dir_for(inventory_path: str | os.PathLike) -> Path:
    """`<dir>/<file name>.tls` beside the inventory: it moves with the inventory (and its known_hosts),
    and two inventories in one directory never share a CA. A `tunnelspec_tls_dir` variable may
    override it (wiring: docs/tls.md)."""
    p = Path(inventory_path).expanduser().absolute()
    return p.parent / f"{p.name}.tls"


# ---- names ----------------------------------------------------------------------------------------
def parse_names(names) -> list[x509.GeneralName]:
    """DNS names and IP addresses as SANs, in order, duplicates dropped. An address (IPv4, IPv6, with
    or without [brackets]) becomes an IPAddress entry — never a DNS one, which no client matches
    against an address. Raises ValueError naming the bad entry."""
    out: list[x509.GeneralName] = []
    for raw in names:
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(f"empty or non-text TLS name {raw!r}")
        name = raw.strip()
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        try:
            ip = ipaddress.ip_address(bare.split("%", 1)[0] if ":" in bare else bare)
        except ValueError:
            ip = None
        if ip is not None:
            entry: x509.GeneralName = x509.IPAddress(ip)
        else:
            dns = name.lower().rstrip(".")
            if not dns.isascii():
                raise ValueError(f"TLS name {raw!r} is not ASCII: give its IDNA form (xn--…)")
            if "*" in dns:
                raise ValueError(f"TLS name {raw!r}: wildcards are not issued; list each name")
            if len(dns) > 253 or not all(_LABEL.match(label) for label in dns.split(".")):
                raise ValueError(f"TLS name {raw!r} is neither an IP address nor a DNS name")
            entry = x509.DNSName(dns)
        if entry not in out:
            out.append(entry)
    if not out:
        raise ValueError("no TLS name: a server certificate needs at least one DNS name or address")
    return out
