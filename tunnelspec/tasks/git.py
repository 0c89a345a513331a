"""git_checkout: a repository at a pinned commit, detached. Local modifications are reported,
not silently discarded."""

from __future__ import annotations

import re

from tunnelspec.errors import TaskFailed
from tunnelspec.tasks.base import Arg, Diff, Task, change, ok, register_task

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")

# Prints HEAD sha (or 'absent'), then 'dirty' or 'clean'.
_STATE = r"""
[ -d "$1/.git" ] || [ -f "$1/HEAD" -a -d "$1/objects" ] || { echo absent; exit 0; }
cd -- "$1" || exit 2
git rev-parse --verify -q HEAD || echo none
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo dirty; else echo clean; fi
"""


@register_task
class GitCheckout(Task):
    module = "git_checkout"
    args = {"repo": Arg(str, required=True), "dest": Arg(str, required=True), "version": Arg(str, required=True),
            "force": Arg(bool, default=False)}

    def _state_argv(self) -> list[str]:
        return ["sh", "-c", _STATE, "sh", self.p["dest"]]

    def probes(self) -> list[list[str]]:
        return [self._state_argv()]

    async def check(self, ctx):
        if not FULL_SHA.match(self.p["version"]):
            raise TaskFailed(f"version {self.p['version']!r} is not a full 40-hex commit SHA; pin the SHA "
                             f"(`git rev-parse {self.p['version']}`)")
        res = await ctx.conn.probe(self._state_argv(), check=True)
        lines = res.stdout.split()
        if lines[0] == "absent":
            return change(f"clone {self.p['repo']} at {self.p['version'][:12]}", Diff("", self.p["version"]), clone=True)
        head, state = lines[0], lines[1]
        if state == "dirty" and not self.p["force"]:
            raise TaskFailed(f"{self.p['dest']} has local modifications; commit or discard them, or set force")
        if head == self.p["version"] and state == "clean":
            return ok(f"at {head[:12]}")
        return change(f"check out {self.p['version'][:12]} (was {head[:12]})", Diff(head, self.p["version"]))

    async def apply(self, ctx, ch):
        dest, repo, ver = self.p["dest"], self.p["repo"], self.p["version"]
        run = ctx.conn.run
        if ch.data.get("clone"):
            await run(["git", "clone", "--no-checkout", "--quiet", "--", repo, dest], check=True)
        has = await run(["git", "-C", dest, "cat-file", "-e", f"{ver}^{{commit}}"])
        if has.rc != 0:
            await run(["git", "-C", dest, "fetch", "--quiet", "origin", ver], check=True)
        argv = ["git", "-C", dest, "checkout", "--quiet", "--detach"]
        if self.p["force"]:
            argv.append("--force")
        await run(argv + [ver], check=True)
