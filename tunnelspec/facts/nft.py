"""tunnelspec's nftables table (`table inet tunnelspec`): the rules as data, the file that loads
them, and the parser that turns `nft -j list table inet tunnelspec` back into the same data.

Per guarded loopback port: one connect guard (only root and the one allowed user may open a
connection to it: `oif "lo" tcp dport P tcp flags syn / syn,ack meta skuid != { 0, U } counter reject
with tcp reset`) and three listen guards (only root and the service's user may answer there: a
squatter's SYN-ACK becomes a reset, a socketless SYN-ACK — a SYN cookie — is dropped). uids are
numbers resolved on the host at deploy time. Why each part of each rule is there, and what it does
not stop: SECURITY.md, "Loopback isolation"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

from tunnelspec.facts import sections
from tunnelspec.facts.fact import Fact

TABLE = "tunnelspec"
FAMILY = "inet"
CHAIN = "output"
NFT = "/usr/sbin/nft"


@dataclass(frozen=True)
class PortRule:
    port: int
    uids: tuple[int, ...]  # allowed socket owners, root included, sorted
    comment: str


@dataclass(frozen=True)
class ListenRule:
    """Only these uids (root included) may answer connections on loopback port `port`."""

    port: int
    uids: tuple[int, ...]
    comment: str


def _allowed(uids) -> tuple[int, ...]:
    return tuple(sorted({0, *(int(u) for u in uids)}))


def rules_for(ports, uids, comment: str) -> tuple[PortRule, ...]:
    allowed = _allowed(uids)
    return tuple(PortRule(int(p), allowed, comment) for p in sorted({int(p) for p in ports}))


def listen_rules_for(ports, uids, comment: str) -> tuple[ListenRule, ...]:
    allowed = _allowed(uids)
    return tuple(ListenRule(int(p), allowed, comment) for p in sorted({int(p) for p in ports}))


def ordered(rules) -> tuple:
    """Connect guards first, then listen guards, each by port: the order the file and the parser use."""
    return tuple(sorted(rules, key=lambda r: (isinstance(r, ListenRule), r.port)))


def _set(uids: tuple[int, ...]) -> str:
    return "{ " + ", ".join(str(u) for u in uids) + " }"


def ruleset_text(rules: tuple, header: str) -> str:
    """The file `nft -f` loads: it replaces tunnelspec's table in one transaction (the first line
    creates it if absent so that the delete never fails) and touches no other table."""
    lines = [
        f"#!{NFT} -f",
        *(f"# {h}" if h else "#" for h in header.splitlines()),
        f"table {FAMILY} {TABLE}",
        f"delete table {FAMILY} {TABLE}",
        f"table {FAMILY} {TABLE} {{",
        f"\tchain {CHAIN} {{",
        "\t\ttype filter hook output priority filter; policy accept;",
    ]
    for r in ordered(rules):
        if isinstance(r, ListenRule):
            synack = f'oif "lo" tcp sport {r.port} tcp flags & (syn | ack) == syn | ack'
            lines += [
                f'\t\t{synack} meta skuid {_set(r.uids)} accept comment "{r.comment}"',
                f'\t\t{synack} meta skuid != {_set(r.uids)} counter tcp flags set rst | ack comment "{r.comment}"',
                f'\t\t{synack} counter drop comment "{r.comment}"',
            ]
        else:
            lines.append(
                f'\t\toif "lo" tcp dport {r.port} tcp flags & (syn | ack) == syn '
                f'meta skuid != {_set(r.uids)} counter reject with tcp reset comment "{r.comment}"'
            )
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


def _rule(expr: list, comment: str | None) -> tuple | None:
    """One live rule as an atom when it is exactly one of our shapes, else None:
    ("connect", PortRule), or ("accept" | "reset" | "drop", port, uids) of a listen guard."""
    seen: dict[str, Any] = {  # what the rule matched so far: a flag, a port, uids, an operator, a verdict
        "oif": False,
        "dport": None,
        "sport": None,
        "syn": False,
        "synack": False,
        "uids": None,
        "op": None,
        "verdict": None,
    }
    for e in expr:
        m = e.get("match")
        if m:
            left, right, op = m.get("left", {}), m.get("right"), m.get("op")
            if left == {"meta": {"key": "oif"}} and op == "==" and right == "lo":
                seen["oif"] = True
            elif left == {"payload": {"protocol": "tcp", "field": "dport"}} and op == "==" and isinstance(right, int):
                seen["dport"] = right
            elif left == {"payload": {"protocol": "tcp", "field": "sport"}} and op == "==" and isinstance(right, int):
                seen["sport"] = right
            elif isinstance(left, dict) and "&" in left and op == "==" and right == "syn":
                seen["syn"] = sorted(_flags(left["&"][1])) == ["ack", "syn"]
            elif isinstance(left, dict) and "&" in left and op == "==" and sorted(_flags(right)) == ["ack", "syn"]:
                seen["synack"] = sorted(_flags(left["&"][1])) == ["ack", "syn"]
            elif left == {"meta": {"key": "skuid"}} and op in ("==", "!=") and seen["uids"] is None:
                seen["uids"], seen["op"] = _values(right), op
            else:
                return None
        elif "counter" in e:
            continue
        elif seen["verdict"] is not None:
            return None
        elif e.get("reject", {}).get("type") == "tcp reset":
            seen["verdict"] = "reject"
        elif "accept" in e:
            seen["verdict"] = "accept"
        elif "drop" in e:
            seen["verdict"] = "drop"
        elif e.get("mangle", {}).get("key") == {"payload": {"protocol": "tcp", "field": "flags"}} and sorted(
            _flags(e["mangle"].get("value"))
        ) == ["ack", "rst"]:
            seen["verdict"] = "reset"
        else:
            return None
    if not seen["oif"]:
        return None
    if (
        seen["dport"]
        and seen["sport"] is None
        and seen["syn"]
        and seen["uids"]
        and seen["op"] == "!="
        and seen["verdict"] == "reject"
    ):
        return ("connect", PortRule(seen["dport"], seen["uids"], comment or ""))
    if not (seen["sport"] and seen["dport"] is None and seen["synack"]):
        return None
    want = {"accept": "==", "reset": "!=", "drop": None}
    if (
        seen["verdict"] in want
        and seen["op"] == want[seen["verdict"]]
        and (seen["verdict"] == "drop") == (seen["uids"] is None)
    ):
        return (seen["verdict"], seen["sport"], seen["uids"], comment or "")
    return None


@dataclass
class LiveTable:
    present: bool
    rules: tuple = ()  # PortRule and ListenRule, ordered()
    foreign: int = 0  # rules or chains of another shape in our table
    chain_ok: bool = False  # our output chain with the right hook, priority and policy
    rejected: int = 0  # packets the rules refused so far (counters)


def _listen_guards(atoms: list[tuple]) -> tuple[list[ListenRule], int]:
    """Listen guards from their rules in chain order: per port exactly accept, reset, drop with one
    uid set; anything else counts as foreign."""
    by_port: dict[int, list[tuple]] = {}
    for a in atoms:
        by_port.setdefault(a[1], []).append(a)
    out, foreign = [], 0
    for port, seq in by_port.items():
        kinds = [a[0] for a in seq]
        if kinds == ["accept", "reset", "drop"] and seq[0][2] == seq[1][2]:
            out.append(ListenRule(port, seq[0][2], seq[0][3]))
        else:
            foreign += len(seq)
    return out, foreign


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
    rules: list = []
    listen_atoms: list[tuple] = []
    for i in items:
        if "chain" in i:
            c = i["chain"]
            if (
                c.get("name") == CHAIN
                and c.get("type") == "filter"
                and c.get("hook") == "output"
                and c.get("prio") == 0
                and c.get("policy") == "accept"
            ):
                live.chain_ok = True
            else:
                live.foreign += 1
        elif "rule" in i:
            r = i["rule"]
            parsed = _rule(r.get("expr", []), r.get("comment")) if r.get("chain") == CHAIN else None
            if parsed is None:
                live.foreign += 1
            elif parsed[0] == "connect":
                rules.append(parsed[1])
            else:
                listen_atoms.append(parsed)
            for e in r.get("expr", []):
                if "counter" in e:
                    live.rejected += int(e["counter"].get("packets", 0))
        elif "set" in i or "map" in i or "flowtable" in i:
            live.foreign += 1
    guards, foreign = _listen_guards(listen_atoms)
    live.foreign += foreign
    live.rules = ordered(rules + guards)
    return live


def matches(live: LiveTable, want: tuple) -> bool:
    return live.present and live.chain_ok and live.foreign == 0 and live.rules == ordered(want)


def guard_gaps(live: LiveTable, port: int, owner_uid: int, open_port: bool = False) -> list[str]:
    """What the live table lacks to guard a socket of `owner_uid` listening on loopback `port`: a
    listen guard that lets that owner answer, and a connect guard (unless anyone may connect: the
    API at the front). [] when both hold."""
    listen = [r for r in live.rules if isinstance(r, ListenRule) and r.port == port]
    connect = [r for r in live.rules if isinstance(r, PortRule) and r.port == port]
    gaps = []
    if not listen:
        gaps.append("no listen guard")
    elif owner_uid not in listen[0].uids:
        gaps.append(f"its listen guard lets uids {','.join(map(str, listen[0].uids))} answer, not its owner's")
    if not connect and not open_port:
        gaps.append("no connect guard")
    return gaps


def describe(rules: tuple) -> str:
    return (
        "; ".join(
            f"{'listen ' if isinstance(r, ListenRule) else ''}tcp/{r.port} uids {','.join(map(str, r.uids))}"
            for r in ordered(rules)
        )
        or "no rule"
    )


# ---- what a host has now, in one round trip ------------------------------------------------------
UNIT = "tunnelspec-isolation.service"
SYSTEMD_DIR = "/etc/systemd/system"  # the script's `d`
UNIT_PATH = f"{SYSTEMD_DIR}/{UNIT}"
RULES_PATH = "/etc/tunnelspec/isolation.nft"
CAP_NET_ADMIN = 12

# Few processes (this runs on every host of a no-op run): CapEff read by the shell itself (its
# capabilities are those a command it runs gets, unless the command's file has capabilities of its
# own: nft's does not), and one `find` for the unit's links and the `.requires` directories (the
# parser tells them apart by depth and sorts them).
_OBSERVE = r"""
nft=/usr/sbin/nft
echo "== nft"; [ -x "$nft" ] && echo yes || echo no
echo "== capeff"
while read -r k v; do [ "$k" = CapEff: ] && { echo "$v"; break; }; done </proc/self/status
echo "== table"
if [ -x "$nft" ]; then "$nft" -j list table inet tunnelspec 2>&1; echo "rc=$?"; else echo "rc=127"; fi
echo "== enabled"; systemctl is-enabled "$1" 2>/dev/null || :
echo "== active"; systemctl is-active "$1" 2>/dev/null || :
echo "== systemd"
d=/etc/systemd/system
find "$d" -mindepth 1 -maxdepth 2 \( -path "$d/*/*" -name "$1" -o ! -path "$d/*/*" -type d -name 'tunnelspec-*.requires' \) \
  -print 2>/dev/null
echo "== end"
"""
# The users' uids: a probe of their own, so that the state above (nft's listing is most of the cost) is
# one probe whatever users a task asks about: the tasks of a run that read it share one answer.
_UIDS = 'for u do id -u -- "$u" 2>/dev/null || echo -; done'


@dataclass
class HostIsolation:
    nft: bool  # /usr/sbin/nft present
    net_admin: bool  # this session's effective capabilities include CAP_NET_ADMIN
    table: LiveTable
    table_error: str  # nft's complaint when it could not list (other than "no such table")
    enabled: str
    active: str
    links: list[str]  # <unit>.wants|requires/tunnelspec-isolation.service symlinks
    requires_dirs: list[str]
    uids: dict[str, int | None]


def parse_observation(text: str) -> HostIsolation:
    """The isolation probe's output; `uids` is left empty (`observe` fills it from `uids(users)`)."""
    s = sections(text)
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
    # One `find` lists both: a link two levels under SYSTEMD_DIR, a `.requires` directory one level.
    root = SYSTEMD_DIR + "/"
    found = [p[len(root) :] for p in s.get("systemd", []) if p.startswith(root)]
    return HostIsolation(
        nft=(s.get("nft") or ["no"])[0] == "yes",
        net_admin=net_admin,
        table=table,
        table_error=err,
        enabled=" ".join(s.get("enabled", [])).strip(),
        active=" ".join(s.get("active", [])).strip(),
        links=sorted(root + p for p in found if p.count("/") == 1),
        requires_dirs=sorted(root + p for p in found if p and "/" not in p),
        uids={},
    )


def parse_uids(text: str, users: list[str]) -> dict[str, int | None]:
    """`users`' uids, one line each ("-": no such user). The host's answer may stop short (a failed
    lookup): a user without a line is left out."""
    return {u: int(v) if v.strip().isdigit() else None for u, v in zip(users, text.splitlines(), strict=False)}


def isolation() -> Fact[HostIsolation]:
    """nft, CAP_NET_ADMIN, the live table, the isolation unit's state and links (no uids)."""
    return Fact(["sh", "-c", _OBSERVE, "sh", UNIT], parse_observation)


def uids(users: list[str]) -> Fact[dict[str, int | None]]:
    return Fact(["sh", "-c", _UIDS, "sh", *users], partial(parse_uids, users=users))


def probes(users: list[str]) -> list[list[str]]:
    """What `observe(conn, users)` reads, for a task's `probes()`."""
    return [isolation().argv, *([uids(users).argv] if users else [])]


async def observe(conn, users: list[str]) -> HostIsolation:
    """nft, CAP_NET_ADMIN, the live table, the isolation unit's state and links, and `users`' uids
    (a user with no uid: None)."""
    seen = await isolation().gather(conn, timeout=30)
    if users:
        seen.uids = await uids(users).gather(conn, timeout=30)
    return seen
