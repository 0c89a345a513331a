"""The generation records on main (docs/generations.md): read all at once, stored by a script that
writes each kept file once, pruned with their build pins; and the figures the metrics exporter
reads (record.STATUS), published when a generation becomes current."""

from __future__ import annotations

import json
import time

from tunnelspec.components.generation import record as gen

# Every record on main, one per block: `--- <N>` then its JSON; then `--- current <N>`.
_RECORDS = r"""
d=$1
for f in "$d"/*.json; do [ -f "$f" ] || continue; n=${f##*/}; printf -- '--- %s\n' "${n%.json}"; cat -- "$f"; echo; done
printf -- '--- current %s\n' "$(cat -- "$d/current" 2>/dev/null)"
"""

# The copies of a host's serving files, each named by its sha256. Never through a link: a path that is
# one now is refused, and the sum is taken of the copy itself, so a file swapped for a link (or changed)
# between the state read and the copy is refused too, never kept under the sum of what it replaced.
STORE_SCRIPT = r"""
store=$1; shift
install -d -m 700 -- "$store"
while [ $# -gt 1 ]; do
  sha=$1; f=$2; shift 2
  [ -e "$store/$sha" ] && continue
  if [ -L "$f" ] || [ ! -f "$f" ]; then
    echo "$f is not a regular file (a link or another kind): not copied" >&2; exit 4
  fi
  install -m 600 -- "$f" "$store/$sha.tmp" || exit 4
  got=$(sha256sum < "$store/$sha.tmp" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || { rm -f -- "$store/$sha.tmp"; echo "$f changed while it was recorded" >&2; exit 4; }
  mv -f -- "$store/$sha.tmp" "$store/$sha"
done
"""

# Pins for the build pruning, then the file copies no kept generation uses removed.
PRUNE_SCRIPT = r"""
pins=$1; store=$2; shift 2
keys=; for a in "$@"; do case $a in sha:*) ;; *) keys="$keys$a
";; esac; done
[ -d "${pins%/*}" ] && printf '%s' "$keys" > "$pins.tmp" && mv -f -- "$pins.tmp" "$pins"
cd -- "$store" 2>/dev/null || exit 0
for f in *; do
  [ -f "$f" ] || continue
  case " $* " in *" sha:$f "*) ;; *) rm -f -- "$f";; esac
done
"""


def parse_records(text: str) -> tuple[dict[int, dict], int | None]:
    records: dict[int, dict] = {}
    buf: list[str] = []
    current, n = None, None

    def flush():
        if n is not None and "".join(buf).strip():
            try:
                records[n] = json.loads("".join(buf))
            except ValueError:
                pass  # a damaged record is no record

    for line in text.splitlines(keepends=True):
        if line.startswith("--- current"):
            flush()
            n, buf = None, []
            value = line.split()[-1] if len(line.split()) > 2 else ""
            current = int(value) if value.isdigit() else None
        elif line.startswith("--- "):
            flush()
            key = line[4:].strip()
            n, buf = (int(key) if key.isdigit() else None), []
        else:
            buf.append(line)
    flush()
    return records, (current if current in records else None)


RECORDS_ARGV = ["sh", "-c", _RECORDS, "sh", gen.GEN_DIR]
STATUS_ARGV = ["cat", "--", gen.STATUS]


async def publish(conn, n: int, rollback: bool = False, event: str = "") -> None:
    """Generation `n` is current: the metrics exporter's figures (gen.STATUS) say so, and count a
    return to it when `rollback`."""
    prev = gen.parse_status((await conn.run(["cat", "--", gen.STATUS])).stdout)
    await conn.put(gen.status_text(gen.next_status(prev, n, time.time(), rollback, event)), gen.STATUS, 0o644)


async def published(conn) -> int | None:
    """The generation gen.STATUS names (None: no file, or a damaged one)."""
    n = gen.parse_status((await conn.probe(STATUS_ARGV)).stdout).get("generation")
    return n if isinstance(n, int) else None


async def read_records(conn) -> tuple[dict[int, dict], int | None]:
    res = await conn.probe(RECORDS_ARGV)
    return parse_records(res.stdout)
