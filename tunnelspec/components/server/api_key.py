"""The API key file of llama-server on the main host (`api_key_file`): written by the user, kept
readable by llama-server's user alone."""

from __future__ import annotations

from tunnelspec.components import secret_file
from tunnelspec.core.errors import TaskFailed
from tunnelspec.modules.base import Arg, Task, change, ok, register_task


@register_task
class ApiKeyFile(Task):
    """The API key file (written by the user) readable by llama-server's user only: owner and mode
    0600 enforced, content never read into a diff."""

    module = "api_key_file"
    args = {
        "path": Arg(str, required=True, help="The key file on the host (written by you, one line)."),
        "owner": Arg(str, required=True, help="The user that must own it and alone read it (llama-server's user)."),
    }

    async def _stat(self, ctx) -> tuple[str, str, int]:
        # Never through a symlink or onto a file with other names (components/secret_file.py).
        return await secret_file.plain_file(
            ctx.conn,
            ctx.host,
            self.p["path"],
            "API key file",
            f"llama_server_api_key_file {self.p['path']} does not exist on {ctx.host}; write the key there (one line) first",
            "/etc/tunnelspec/llama-api-key",
        )

    async def check(self, ctx):
        mode, owner, size = await self._stat(ctx)
        if size == 0:
            raise TaskFailed(f"{ctx.host}: API key file {self.p['path']} is empty")
        if (mode, owner) != ("600", self.p["owner"]):
            return change(f"{self.p['path']}: mode {mode} owner {owner} → 600 {self.p['owner']}")
        # Owner and mode are not enough: every parent directory must let the user through, else
        # llama-server cannot start and the deploy only sees "not healthy" minutes later.
        res = await ctx.conn.probe(["runuser", "-u", owner, "--", "test", "-r", self.p["path"]])
        if res.rc != 0:
            raise TaskFailed(
                f"{owner} cannot read {self.p['path']} on {ctx.host}: a parent directory is not "
                "searchable for it (needs o+x or its group); move the key, e.g. to "
                "/etc/tunnelspec/llama-api-key"
            )
        return ok("API key file 0600, owned by " + owner)

    async def apply(self, ctx, ch):
        await self._stat(ctx)
        await secret_file.make_private(ctx.conn, ctx.host, self.p["path"], self.p["owner"], "API key file")
