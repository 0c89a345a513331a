"""tunnelspec's nftables table (`table inet tunnelspec`): the rules as data, the file that loads
them, and the parser that turns `nft -j list table inet tunnelspec` back into the same data.

One rule per guarded loopback port, in one output chain:

    oif "lo" tcp dport P tcp flags syn / syn,ack meta skuid != { 0, U... } counter reject with tcp reset

- `oif "lo"`: every connection to an address of this host leaves through lo (127.0.0.1, ::1 and the
  host's own addresses alike); `inet` covers IPv4, IPv6 and IPv4-mapped IPv6 sockets at once.
- `tcp flags syn / syn,ack`: only a connection's first packet is judged. Its socket is the
  connecting process's own (`meta skuid` = the socket owner's uid); replies and data of allowed
  connections never meet the rule, and a reply whose ephemeral port happens to equal P is not hit.
- `meta skuid != { 0, U }`: root (tunnelspec's probes) and the one allowed user pass; anyone else
  gets a TCP reset, i.e. "connection refused" at once.
- uids are numbers resolved on the host at deploy time: loading at boot needs no name service.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

TABLE = "tunnelspec"
FAMILY = "inet"
CHAIN = "output"
NFT = "/usr/sbin/nft"


@dataclass(frozen=True)
class PortRule:
    port: int
    uids: tuple[int, ...]   # allowed socket owners, root included, sorted
    comment: str


def rules_for(ports, uids, comment: str) -> tuple[PortRule, ...]:
    allowed = tuple(sorted({0, *(int(u) for u in uids)}))
    return tuple(PortRule(int(p), allowed, comment) for p in sorted({int(p) for p in ports}))


def ruleset_text(rules: tuple[PortRule, ...], header: str) -> str:
    """The file `nft -f` loads: it replaces tunnelspec's table in one transaction (the first line
    creates it if absent so that the delete never fails) and touches no other table."""
    lines = [f"#!{NFT} -f", *(f"# {h}" if h else "#" for h in header.splitlines()),
             f"table {FAMILY} {TABLE}", f"delete table {FAMILY} {TABLE}",
             f"table {FAMILY} {TABLE} {{", f"\tchain {CHAIN} {{",
             "\t\ttype filter hook output priority filter; policy accept;"]
    for r in rules:
        uids = ", ".join(str(u) for u in r.uids)
        lines.append(f'\t\toif "lo" tcp dport {r.port} tcp flags & (syn | ack) == syn '
                     f'meta skuid != {{ {uids} }} counter reject with tcp reset comment "{r.comment}"')
    lines += ["\t}", "}"]
    return "\n".join(lines) + "\n"


def _values(right) -> tuple | None:
    if isinstance(right, dict) and "set" in right:
        out = []
        for v in right["set"]:
            if not isinstance(v, int):
                return None
            out.append(v)
        return tuple(sorted(out))
    if isinstance(right, int):
        return (right,)
    return None


def _flags(mask) -> list:
    """The flags of a mask as nft prints it: a list (nftables 1.0.x) or {"|": [...]} (0.9.x, 1.1.x)."""
    if isinstance(mask, dict) and isinstance(mask.get("|"), list):
        mask = mask["|"]
    return [f for f in mask if isinstance(f, str)] if isinstance(mask, list) else []


def _rule(expr: list, comment: str | None) -> PortRule | None:
    """One live rule as a PortRule when it is exactly our shape, else None."""
    seen = {"oif": False, "port": None, "syn": False, "uids": None, "reject": False}
    for e in expr:
        m = e.get("match")
        if m:
            left, right, op = m.get("left", {}), m.get("right"), m.get("op")
            if left == {"meta": {"key": "oif"}} and op == "==" and right == "lo":
                seen["oif"] = True
            elif left == {"payload": {"protocol": "tcp", "field": "dport"}} and op == "==" and isinstance(right, int):
                seen["port"] = right
            elif "&" in left and op == "==" and right == "syn":
                seen["syn"] = sorted(_flags(left["&"][1])) == ["ack", "syn"]
            elif left == {"meta": {"key": "skuid"}} and op == "!=":
                seen["uids"] = _values(right)
            else:
                return None
        elif "counter" in e:
            continue
        elif e.get("reject", {}).get("type") == "tcp reset":
            seen["reject"] = True
        else:
            return None
    if seen["oif"] and seen["port"] and seen["syn"] and seen["uids"] and seen["reject"]:
        return PortRule(seen["port"], seen["uids"], comment or "")
    return None


@dataclass
class LiveTable:
    present: bool
    rules: tuple[PortRule, ...] = ()
    foreign: int = 0          # rules or chains of another shape in our table
    chain_ok: bool = False    # our output chain with the right hook, priority and policy
    rejected: int = 0         # packets the rules refused so far (counters)


def parse_live(text: str) -> LiveTable:
    """`nft -j list table inet tunnelspec` → LiveTable (handles and counters are ignored)."""
    try:
        items = json.loads(text).get("nftables", [])
    except (ValueError, AttributeError):
        return LiveTable(False)
    table = any("table" in i and i["table"].get("name") == TABLE for i in items)
    if not table:
        return LiveTable(False)
    live = LiveTable(True)
    rules = []
    for i in items:
        if "chain" in i:
            c = i["chain"]
            if (c.get("name") == CHAIN and c.get("type") == "filter" and c.get("hook") == "output"
                    and c.get("prio") == 0 and c.get("policy") == "accept"):
                live.chain_ok = True
            else:
                live.foreign += 1
        elif "rule" in i:
            r = i["rule"]
            parsed = _rule(r.get("expr", []), r.get("comment")) if r.get("chain") == CHAIN else None
            if parsed is None:
                live.foreign += 1
            else:
                rules.append(parsed)
            for e in r.get("expr", []):
                if "counter" in e:
                    live.rejected += int(e["counter"].get("packets", 0))
        elif "set" in i or "map" in i or "flowtable" in i:
            live.foreign += 1
    live.rules = tuple(sorted(rules, key=lambda r: r.port))
    return live


def matches(live: LiveTable, want: tuple[PortRule, ...]) -> bool:
    return live.present and live.chain_ok and live.foreign == 0 and live.rules == tuple(want)


def describe(rules: tuple[PortRule, ...]) -> str:
    return "; ".join(f"tcp/{r.port} uids {','.join(map(str, r.uids))}" for r in rules) or "no rule"


# ---- what a host has now, in one round trip ------------------------------------------------------
UNIT = "tunnelspec-isolation.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
RULES_PATH = "/etc/tunnelspec/isolation.nft"
CAP_NET_ADMIN = 12

_OBSERVE = r"""
nft=/usr/sbin/nft
echo "== nft"; [ -x "$nft" ] && echo yes || echo no
echo "== capeff"; sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status
echo "== table"
if [ -x "$nft" ]; then "$nft" -j list table inet tunnelspec 2>&1; echo "rc=$?"; else echo "rc=127"; fi
echo "== enabled"; systemctl is-enabled "$1" 2>/dev/null || :
echo "== active"; systemctl is-active "$1" 2>/dev/null || :
echo "== links"; find /etc/systemd/system -mindepth 2 -maxdepth 2 -name "$1" 2>/dev/null | sort
echo "== reqdirs"; find /etc/systemd/system -mindepth 1 -maxdepth 1 -type d -name 'tunnelspec-*.requires' 2>/dev/null | sort
echo "== uids"; shift; for u in "$@"; do id -u -- "$u" 2>/dev/null || echo -; done
echo "== end"
"""


@dataclass
class HostIsolation:
    nft: bool                  # /usr/sbin/nft present
    net_admin: bool            # this session's effective capabilities include CAP_NET_ADMIN
    table: LiveTable
    table_error: str           # nft's complaint when it could not list (other than "no such table")
    enabled: str
    active: str
    links: list[str]           # <unit>.wants|requires/tunnelspec-isolation.service symlinks
    requires_dirs: list[str]
    uids: dict[str, int | None]


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("== "):
            cur = line[3:].strip()
            out[cur] = []
        elif cur is not None:
            out[cur].append(line)
    return out


def parse_observation(text: str, users: list[str]) -> HostIsolation:
    s = _sections(text)
    if "end" not in s:
        raise ValueError("incomplete isolation probe output")
    cap = (s.get("capeff") or ["0"])[0].strip() or "0"
    try:
        net_admin = bool(int(cap, 16) >> CAP_NET_ADMIN & 1)
    except ValueError:
        net_admin = False
    tbl_lines = s.get("table", [])
    rc_line = tbl_lines[-1] if tbl_lines else "rc=1"
    body = "\n".join(tbl_lines[:-1])
    table, err = LiveTable(False), ""
    if rc_line == "rc=0":
        table = parse_live(body)
    elif rc_line != "rc=127" and "No such file or directory" not in body:
        err = body.strip().splitlines()[-1] if body.strip() else rc_line
    uids = {}
    for u, v in zip(users, s.get("uids", [])):
        uids[u] = int(v) if v.strip().isdigit() else None
    return HostIsolation(nft=(s.get("nft") or ["no"])[0] == "yes", net_admin=net_admin, table=table,
                         table_error=err, enabled=" ".join(s.get("enabled", [])).strip(),
                         active=" ".join(s.get("active", [])).strip(),
                         links=[l for l in s.get("links", []) if l], requires_dirs=[l for l in s.get("reqdirs", []) if l],
                         uids=uids)


def observe_argv(users: list[str]) -> list[str]:
    return ["sh", "-c", _OBSERVE, "sh", UNIT, *users]


async def observe(conn, users: list[str]) -> HostIsolation:
    res = await conn.probe(observe_argv(users), timeout=30)
    return parse_observation(res.stdout, users)
