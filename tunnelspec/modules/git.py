"""git_checkout: a repository at a pinned commit, detached. Local modifications are reported,
not silently discarded."""

from __future__ import annotations

from tunnelspec.core.errors import TaskFailed
from tunnelspec.core.vartypes import VarValueError, full_sha, is_full_sha
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task

# 'absent', or one `git status` (porcelain v2: "# branch.oid <sha>|(initial)", then a line per
# modified tracked file): HEAD and dirtiness from one process, without taking the index lock. Where
# status cannot run (a bare repository): HEAD sha (or 'none'), then 'clean'.
_STATE = r"""
[ -d "$1/.git" ] || [ -f "$1/HEAD" -a -d "$1/objects" ] || { echo absent; exit 0; }
cd -- "$1" || exit 2
git --no-optional-locks status --porcelain=v2 --branch --untracked-files=no 2>/dev/null && exit 0
git rev-parse --verify -q HEAD || echo none
echo clean
"""


def _parse_state(out: str) -> tuple[str, str]:
    """(head sha | 'absent' | 'none', 'dirty' | 'clean')."""
    lines = out.splitlines()
    if not lines or lines[0] == "absent":
        return "absent", "clean"
    if lines[0].startswith("# "):
        head = "none"
        for line in lines:
            if line.startswith("# branch.oid "):
                head = line.split(" ", 2)[2].strip()
        dirty = any(line and not line.startswith("#") for line in lines)
        return ("none" if head == "(initial)" else head), ("dirty" if dirty else "clean")
    return lines[0].strip(), (lines[1].strip() if len(lines) > 1 else "clean")


@register_task
class GitCheckout(Task):
    """A git working tree at one commit, detached."""

    module = "git_checkout"
    args = {
        "repo": Arg(str, required=True, help="Repository URL or path to clone from."),
        "dest": Arg(str, required=True, help="The working tree on the host."),
        "version": Arg(str, required=True, help="The commit (a full SHA) to check out, detached."),
        "force": Arg(bool, default=False, help="Discard local modifications instead of failing."),
    }

    def _state_argv(self) -> list[str]:
        return ["sh", "-c", _STATE, "sh", self.p["dest"]]

    def probes(self) -> list[list[str]]:
        return [self._state_argv()]

    async def check(self, ctx):
        if not is_full_sha(self.p["version"]):
            try:
                full_sha(self.p["version"], "version")
                why = f"version {self.p['version']!r} is not lower-case; write the SHA as git prints it"
            except VarValueError as err:
                why = str(err)
            raise TaskFailed(why)
        res = await ctx.conn.probe(self._state_argv(), check=True)
        head, state = _parse_state(res.stdout)
        if head == "absent":
            return change(
                f"clone {self.p['repo']} at {self.p['version'][:12]}", Diff("", self.p["version"]), clone=True
            )
        if state == "dirty" and not self.p["force"]:
            raise TaskFailed(f"{self.p['dest']} has local modifications; commit or discard them, or set force")
        if head == self.p["version"] and state == "clean":
            return ok(f"at {head[:12]}")
        return change(f"check out {self.p['version'][:12]} (was {head[:12]})", Diff(head, self.p["version"]))

    async def apply(self, ctx, ch):
        dest, repo, ver = self.p["dest"], self.p["repo"], self.p["version"]
        run = ctx.conn.run
        if ch.data.get("clone"):
            async with ctx.heartbeat(f"git clone {repo}"):
                await run(["git", "clone", "--no-checkout", "--quiet", "--", repo, dest], check=True)
        has = await run(["git", "-C", dest, "cat-file", "-e", f"{ver}^{{commit}}"])
        if has.rc != 0:
            async with ctx.heartbeat(f"git fetch origin {ver[:12]}"):
                await run(["git", "-C", dest, "fetch", "--quiet", "origin", ver], check=True)
        argv = ["git", "-C", dest, "checkout", "--quiet", "--detach"]
        if self.p["force"]:
            argv.append("--force")
        await run(argv + [ver], check=True)
