"""The lab network: one bridge on the controller, one network namespace + veth pair per host.

Controller side: bridge `<bridge>` with the subnet's first address. Host side: namespace
`<bridge>-<host>` holding `eth0` (the veth peer) with `.10+i`. No default route, no DNS:
traffic from a lab host can only reach the bridge's subnet.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from dataclasses import dataclass

from tunnelspec.core.errors import LabError

NETNS_DIR = "/run/netns"
FIRST_HOST_OFFSET = 10


@dataclass(frozen=True)
class LabNet:
    bridge: str
    subnet: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def host_ip(self, index: int) -> str:
        addr = self.subnet.network_address + FIRST_HOST_OFFSET + index
        if addr not in self.subnet or addr == self.subnet.broadcast_address:
            raise LabError(f"subnet {self.subnet} has no room for host number {index + 1}")
        return str(addr)

    def netns(self, host: str) -> str:
        return f"{self.bridge}-{host}"

    def veth(self, index: int) -> str:
        # Interface names are limited to 15 bytes, so the host side is named by index.
        name = f"{self.bridge}v{index}"
        if len(name) > 15:
            raise LabError(f"bridge name {self.bridge!r} too long for veth names")
        return name


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as err:
        raise LabError(f"invalid lab subnet {text!r}: {err}") from None
    # The lab may only ever use its own private range (see DESIGN: traffic stays on the machine).
    if not net.subnet_of(ipaddress.IPv4Network("10.77.0.0/16")):
        raise LabError(f"lab subnet {net} must lie inside 10.77.0.0/16")
    if net.prefixlen > 27:
        raise LabError(f"lab subnet {net} is too small (need at least a /27)")
    return net


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def ensure_bridge(net: LabNet) -> None:
    if not link_exists(net.bridge):
        ip("link", "add", net.bridge, "type", "bridge")
    addr = f"{net.gateway}/{net.subnet.prefixlen}"
    if addr not in ip("-4", "-o", "addr", "show", "dev", net.bridge).stdout:
        ip("addr", "add", addr, "dev", net.bridge)
    ip("link", "set", net.bridge, "up")


def ensure_host_link(net: LabNet, index: int, host: str) -> None:
    """Namespace, veth pair and addresses for one host; keeps what already exists."""
    ns, veth = net.netns(host), net.veth(index)
    path = os.path.join(NETNS_DIR, ns)
    if netns_exists(ns) and not os.path.ismount(path):
        # /run is on disk here: after a reboot of the machine the name outlives its namespace.
        os.unlink(path)
    if not netns_exists(ns):
        ip("netns", "add", ns)
    has_eth0 = ip("link", "show", "eth0", netns=ns, check=False).returncode == 0
    if not has_eth0:
        if link_exists(veth):
            ip("link", "del", veth)  # left from a crash, its peer is gone
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", veth, "master", net.bridge)
    ip("link", "set", veth, "up")
    addr = f"{net.host_ip(index)}/{net.subnet.prefixlen}"
    if addr not in ip("-4", "-o", "addr", "show", "dev", "eth0", netns=ns).stdout:
        ip("addr", "add", addr, "dev", "eth0", netns=ns)
    ip("link", "set", "lo", "up", netns=ns)
    ip("link", "set", "eth0", "up", netns=ns)


def set_link(net: LabNet, index: int, up: bool) -> None:
    """Fault helper: cut or restore a host's cable (the controller side of its veth)."""
    ip("link", "set", net.veth(index), "up" if up else "down")


def link_is_up(net: LabNet, index: int) -> bool:
    out = ip("-o", "link", "show", net.veth(index), check=False).stdout
    if "<" not in out:
        return False
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",")
    return "UP" in flags


def remove_host_link(net: LabNet, index: int, host: str) -> None:
    if link_exists(net.veth(index)):
        ip("link", "del", net.veth(index), check=False)
    if netns_exists(net.netns(host)):
        ip("netns", "del", net.netns(host))


def remove_bridge(net: LabNet) -> None:
    if link_exists(net.bridge):
        ip("link", "del", net.bridge)
