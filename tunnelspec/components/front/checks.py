"""The front of llama-server on main (tunnelspec/components/front/model.py; docs/degraded.md): the checks that are
not plain files and units."""

from __future__ import annotations

from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts import sockets
from tunnelspec.components import secret_file
from tunnelspec.components.front.model import HOLD_PORT
from tunnelspec.modules.base import Arg, Task, change, ok, register_task


@register_task
class FrontHoldFree(Task):
    """Read-only: nothing listens on the front's `hold` port (a privileged loopback port). The front
    sends requests there while llama-server is not up, counting on the connection to fail; a
    listener there would receive them."""

    module = "front_hold_free"
    read_only = True
    args = {}

    def probes(self) -> list[list[str]]:
        return [sockets.listening().argv]

    async def check(self, ctx):
        found = [
            s
            for s in await sockets.listening_sockets(ctx.conn)
            if s.port == HOLD_PORT and (s.loopback_only or s.wildcard)
        ]
        if found:
            who = ", ".join(f"{n} (pid {p})" for s in found for n, p in s.processes) or "a process"
            raise TaskFailed(
                f"{ctx.host}: {who} listens on TCP port {HOLD_PORT}, which the front keeps free to "
                "hold requests while llama-server restarts (docs/degraded.md); stop it"
            )
        return ok(f"nothing listens on port {HOLD_PORT} (the front's hold)")


# The token equals a key as HAProxy and llama-server read them, each line stripped: HAProxy's pattern
# file (-f) drops a line's leading blanks and its end of line; llama-server's --api-key-file takes each
# non-empty line as a key. So `KEY\n`, ` KEY ` or KEY among other lines is the key all the same. Run
# on main, where the files are: only the verdict (rc 0: the same, 1: not) comes back. The blanks are
# spelled out: older mawk has no [[:space:]].
_SAME_SECRET = r"""
function strip(s) { gsub(/^[ \t\r\f\v]+|[ \t\r\f\v]+$/, "", s); return s }
BEGIN { while ((getline line < ARGV[1]) > 0) { k = strip(line); if (k != "") keys[k] = 1 }; ARGV[1] = "" }
{ t = strip($0); if (t != "" && (t in keys)) same = 1 }
END { exit !same }
"""


def same_secret_argv(token_file: str, key_file: str) -> list[str]:
    return ["awk", _SAME_SECRET, key_file, token_file]


@register_task
class MetricsTokenFile(Task):
    """The scrape token's file on main (metrics_token_file, written by the user; docs/metrics.md):
    HAProxy compares the bearer token of a /metrics request with its line (`-f`), as the front's user,
    so it is owned by that user and 0600, fixed only on a regular file with one name
    (components/secret_file.py). A token equal to the API key is refused: the scrape credential must
    not open the API. The content never leaves main (compared there, _SAME_SECRET)."""

    module = "metrics_token_file"
    args = {
        "path": Arg(str, required=True, help="The token file on main (one line, written by you)."),
        "owner": Arg(str, required=True, help="The front's user, which alone reads it."),
        "api_key_file": Arg(str, default="", help="The API key's file on main: the token must differ from it."),
    }

    async def _stat(self, ctx) -> tuple[str, str, int]:
        path = self.p["path"]
        return await secret_file.plain_file(
            ctx.conn,
            ctx.host,
            path,
            "metrics_token_file",
            f"{ctx.host}: metrics_token_file {path} does not exist; write the scrape token there (one line, e.g. "
            "from `openssl rand -hex 32`) first",
            "/etc/tunnelspec/metrics-token",
        )

    async def check(self, ctx):
        path = self.p["path"]
        mode, owner, size = await self._stat(ctx)
        if size == 0:
            raise TaskFailed(f"{ctx.host}: metrics_token_file {path} is empty")
        if self.p["api_key_file"]:
            same = await ctx.conn.probe(same_secret_argv(path, self.p["api_key_file"]))
            if same.rc not in (0, 1):
                raise TaskFailed(
                    f"{ctx.host}: could not compare metrics_token_file {path} with the API key file "
                    f"{self.p['api_key_file']} (awk rc {same.rc}: {same.stderr.strip()[-300:]})"
                )
            if same.rc == 0:
                raise TaskFailed(
                    f"{ctx.host}: metrics_token_file {path} holds the API key: the scrape token is a "
                    "credential of its own; write another token there"
                )
        if (mode, owner) != ("600", self.p["owner"]):
            return change(f"{path}: mode {mode} owner {owner} → 600 {self.p['owner']}")
        return ok(f"scrape token file 0600, owned by {owner}")

    async def apply(self, ctx, ch):
        await self._stat(ctx)
        await secret_file.make_private(ctx.conn, ctx.host, self.p["path"], self.p["owner"], "metrics_token_file")
