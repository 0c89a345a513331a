"""Files: directory, symlink, copy, template, absent. Rendered on the controller, compared by
sha256, uploaded only when different, validated before the move."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tunnelspec.engine.templating import TemplateError, render_file
from tunnelspec.facts.files import FileState, file_state, norm_mode
from tunnelspec.facts.files import command as file_state_argv
from tunnelspec.tasks.base import Arg, Change, Diff, Task, change, ok, register_task
from tunnelspec.errors import TaskFailed


def _meta_diffs(st: FileState, mode, owner, group) -> list[str]:
    out = []
    if mode and st.mode != norm_mode(mode):
        out.append(f"mode {st.mode} → {norm_mode(mode)}")
    if owner and st.owner != owner:
        out.append(f"owner {st.owner} → {owner}")
    if group and st.group != group:
        out.append(f"group {st.group} → {group}")
    return out


def _chown_spec(owner, group) -> str:
    if owner and group:
        return f"{owner}:{group}"
    if owner:
        return owner
    if group:
        return f":{group}"
    return ""


@register_task
class Directory(Task):
    module = "directory"
    args = {"path": Arg(str, required=True), "mode": Arg((str, int)), "owner": Arg(str), "group": Arg(str)}

    def probes(self) -> list[list[str]]:
        return [file_state_argv(self.p["path"])]

    async def check(self, ctx) -> Change:
        st = await file_state(ctx.conn, self.p["path"])
        if not st.exists:
            return change(f"create directory {self.p['path']}")
        if st.type != "dir":
            raise TaskFailed(f"{self.p['path']} exists and is a {st.type}, not a directory")
        d = _meta_diffs(st, self.p["mode"], self.p["owner"], self.p["group"])
        return change(", ".join(d)) if d else ok("directory present")

    async def apply(self, ctx, ch) -> None:
        argv = ["install", "-d"]
        if self.p["mode"]:
            argv += ["-m", norm_mode(self.p["mode"])]
        if self.p["owner"]:
            argv += ["-o", self.p["owner"]]
        if self.p["group"]:
            argv += ["-g", self.p["group"]]
        await ctx.conn.run(argv + ["--", self.p["path"]], check=True)


@register_task
class Symlink(Task):
    module = "symlink"
    args = {"path": Arg(str, required=True), "src": Arg(str, required=True)}

    def probes(self) -> list[list[str]]:
        return [file_state_argv(self.p["path"])]

    async def check(self, ctx) -> Change:
        st = await file_state(ctx.conn, self.p["path"])
        if st.type == "link" and st.link_target == self.p["src"]:
            return ok("link up to date")
        if st.exists and st.type not in ("link",):
            raise TaskFailed(f"{self.p['path']} exists and is a {st.type}; refusing to replace it with a link")
        return change(f"link {self.p['path']} → {self.p['src']}",
                      Diff(st.link_target, self.p["src"], self.p["path"]))

    async def apply(self, ctx, ch) -> None:
        await ctx.conn.run(["ln", "-sfn", "--", self.p["src"], self.p["path"]], check=True)


@register_task
class Absent(Task):
    module = "absent"
    args = {"path": Arg(str, required=True), "recurse": Arg(bool, default=False)}

    def probes(self) -> list[list[str]]:
        return [file_state_argv(self.p["path"])]

    async def check(self, ctx) -> Change:
        st = await file_state(ctx.conn, self.p["path"])
        if not st.exists:
            return ok("already absent")
        if st.type == "dir" and not self.p["recurse"]:
            return change(f"remove empty directory {self.p['path']}")
        return change(f"remove {st.type} {self.p['path']}")

    async def apply(self, ctx, ch) -> None:
        if self.p["recurse"]:
            await ctx.conn.run(["rm", "-rf", "--", self.p["path"]], check=True)
        else:
            await ctx.conn.run(["sh", "-c", '[ -d "$1" ] && [ ! -L "$1" ] && rmdir -- "$1" || rm -f -- "$1"',
                                "sh", self.p["path"]], check=True)


class _Content(Task):
    """Shared by copy and template: desired bytes known on the controller."""

    async def desired(self, ctx) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def probes(self) -> list[list[str]]:
        return [file_state_argv(self.p["dest"])]

    async def check(self, ctx) -> Change:
        data = await self.desired(ctx)
        want = hashlib.sha256(data).hexdigest()
        st = await file_state(ctx.conn, self.p["dest"])
        if st.exists and st.type != "file":
            raise TaskFailed(f"{self.p['dest']} exists and is a {st.type}, not a file")
        if not st.exists:
            return change(f"create {self.p['dest']}", Diff("", data.decode(errors="replace"), self.p["dest"]),
                          content=True)
        if st.sha256 != want:
            before = ""
            if ctx.options.diff or ctx.options.check:
                got = await ctx.conn.get(self.p["dest"])
                before = (got or b"").decode(errors="replace")
            return change(f"update {self.p['dest']} (content differs)",
                          Diff(before, data.decode(errors="replace"), self.p["dest"]), content=True)
        d = _meta_diffs(st, self.p["mode"], self.p["owner"], self.p["group"])
        return change(", ".join(d)) if d else ok("content and mode up to date")

    async def apply(self, ctx, ch) -> None:
        dest = self.p["dest"]
        mode = int(norm_mode(self.p["mode"] or "644"), 8)
        owner = _chown_spec(self.p["owner"], self.p["group"])
        if not ch.data.get("content"):
            argv = ["chmod", format(mode, "o"), "--", dest]
            await ctx.conn.run(argv, check=True)
            if owner:
                await ctx.conn.run(["chown", owner, "--", dest], check=True)
            return
        data = await self.desired(ctx)
        validate = self.p["validate"]
        if validate:
            # Validate a candidate next to the destination before it replaces the real file.
            cand = f"{dest}.tunnelspec-validate"
            await ctx.conn.put(data, cand, mode)
            try:
                argv = [a.replace("%s", cand) for a in __import__("shlex").split(validate)]
                res = await ctx.conn.run(argv)
                if res.rc != 0:
                    raise TaskFailed(f"validation of {dest} failed ({validate}):\n{(res.stderr or res.stdout).strip()}")
            finally:
                await ctx.conn.run(["rm", "-f", "--", cand])
        await ctx.conn.put(data, dest, mode, owner or None)


@register_task
class Copy(_Content):
    module = "copy"
    args = {"dest": Arg(str, required=True), "content": Arg(str), "src": Arg(str), "mode": Arg((str, int)),
            "owner": Arg(str), "group": Arg(str), "validate": Arg(str)}

    async def desired(self, ctx) -> bytes:
        if self.p["content"] is not None:
            return self.p["content"].encode()
        if self.p["src"]:
            path = Path(self.p["src"])
            if not path.is_absolute():
                path = ctx.inventory_dir / path
            try:
                return path.read_bytes()
            except OSError as e:
                raise TaskFailed(f"cannot read {path} on the controller: {e.strerror}") from None
        raise TaskFailed("copy needs `content` or `src`")


def template_search_path(ctx) -> list[Path]:
    here = Path(__file__).resolve().parent.parent
    return [ctx.inventory_dir, here / "data" / "templates"]


@register_task
class Template(_Content):
    module = "template"
    args = {"src": Arg(str, required=True), "dest": Arg(str, required=True), "mode": Arg((str, int)),
            "owner": Arg(str), "group": Arg(str), "validate": Arg(str), "vars": Arg(dict, default={})}

    async def desired(self, ctx) -> bytes:
        src = Path(self.p["src"])
        cands = [src] if src.is_absolute() else [d / src for d in template_search_path(ctx)]
        for c in cands:
            if c.exists():
                try:
                    return render_file(c.read_text(), {**ctx.vars, **(self.p["vars"] or {})}, str(c)).encode()
                except TemplateError as e:
                    raise TaskFailed(str(e)) from None
        raise TaskFailed(f"template {self.p['src']} not found (looked in {', '.join(map(str, cands))})")
