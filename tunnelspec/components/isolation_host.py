"""What loopback isolation (components/isolation.py) needs of a host and puts on it besides the rules:
CAP_NET_ADMIN and a kernel that loads an nftables table, the package, the oneshot unit that loads
the rules, and the include line in Debian's /etc/nftables.conf. And the way out where nftables
cannot work: rpc_local_isolation=false, warned about on every run."""

from __future__ import annotations

from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts import nft

OPT_OUT = "rpc_local_isolation"
APT_INSTALL = [
    "env",
    "DEBIAN_FRONTEND=noninteractive",
    "apt-get",
    "install",
    "-y",
    "-q",
    "--no-install-recommends",
    "nftables",
]
# Appended to Debian's /etc/nftables.conf (after its `flush ruleset`): every `nft -f` of it —
# nftables.service's start, restart and reload — loads our table in the same transaction as its
# flush. The bracket makes it a glob: no error when the file is gone (a teardown that could not
# edit the configuration leaves a harmless line, never a firewall that fails to load).
NFT_CONF = "/etc/nftables.conf"
CONF_MARK = "# tunnelspec: loopback isolation, loaded in the same transaction as this file's flush"
CONF_INCLUDE = f'include "{nft.RULES_PATH[:-1]}[{nft.RULES_PATH[-1]}]"'
CONF_DROP = [
    "sed",
    "-i",
    "-e",
    f"/^{CONF_MARK}$/d",
    "-e",
    r'/^include "\/etc\/tunnelspec\/isolation.nf\[t\]"$/d',
    "--",
    NFT_CONF,
]


def unit_text(label: str, guarded: list[str]) -> str:
    units = " ".join(guarded)
    return "\n".join(
        [
            f"# Managed by tunnelspec: loopback isolation ({label}).",
            f"# Loads {nft.RULES_PATH}, which replaces nftables table inet tunnelspec and touches no other table.",
            "[Unit]",
            f"Description=tunnelspec loopback isolation ({label})",
            # Early, like Debian's nftables.service: before any network and before the guarded units.
            "DefaultDependencies=no",
            "Wants=network-pre.target",
            f"Before=network-pre.target {units}".rstrip(),
            # Debian's /etc/nftables.conf usually starts with `flush ruleset`: load after it, and again
            # whenever it is restarted.
            "After=local-fs.target nftables.service",
            # A stop or restart of nftables.service (whose ExecStop is `flush ruleset`) stops or restarts
            # this unit, and with it the units that require it: never guarded units up without rules.
            "PartOf=nftables.service",
            # `systemctl reload nftables` runs `nft -f /etc/nftables.conf` again (flush ruleset): load
            # ours again right after it. Where /etc/nftables.conf includes our file (tunnelspec adds the
            # line), its own flush and our table are one transaction and there is no moment without.
            "ReloadPropagatedFrom=nftables.service",
            "",
            "[Service]",
            "Type=oneshot",
            "RemainAfterExit=yes",
            f"ExecStart={nft.NFT} -f {nft.RULES_PATH}",
            f"ExecReload={nft.NFT} -f {nft.RULES_PATH}",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            # Fail closed: a guarded unit does not start when the rules could not be loaded.
            *([f"RequiredBy={units}"] if units else []),
            "",
        ]
    )


def cap_reason(host: str) -> str:
    return (
        f"{host}: local isolation unavailable: this host's root session lacks CAP_NET_ADMIN (a container "
        f"without it?), so nftables rules cannot be loaded. Grant the capability, or set {OPT_OUT}=false "
        f"for this host in the inventory to run without the protection"
    )


async def kernel_check(ctx, text: str) -> str:
    """'' when nft accepts `text` against this kernel (--check: nothing is committed), else why not."""
    v = await ctx.conn.probe([nft.NFT, "--check", "-f", "/dev/stdin"], input=text.encode(), timeout=30)
    if v.rc == 0:
        return ""
    return " ".join((v.stderr or v.stdout).strip().splitlines()[-3:]) or f"nft exited {v.rc}"


def opted_in(value) -> bool:
    """`rpc_local_isolation` as the inventory wrote it: true (default) or false, nothing else."""
    if value is None or value is True or value is False:
        return value is not False
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise TaskFailed(f"{OPT_OUT} must be true or false, got {value!r}")


def warning(host: str, what: str) -> str:
    return (
        f"WARNING: {host}: local isolation is off ({OPT_OUT}=false): every local user can connect to "
        f"{what} on 127.0.0.1 and speak the unauthenticated RPC protocol"
    )
