"""Files: directory, symlink, copy, template, absent. Rendered on the controller, compared by
sha256, uploaded only when different, validated before the move."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tunnelspec.core.templating import TemplateError, render_file
from tunnelspec.facts.files import FileState, file_state, norm_mode
from tunnelspec.hostprogs import program_path
from tunnelspec.modules.base import Arg, Change, Diff, Task, change, ok, register_task
from tunnelspec.core.errors import TaskFailed
from tunnelspec.reporting import events


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
    """A directory, with mode and owner."""

    module = "directory"
    args = {
        "path": Arg(str, required=True, help="The directory (parents are created)."),
        "mode": Arg((str, int), help="Mode, e.g. `0755`."),
        "owner": Arg(str, help="Owner user."),
        "group": Arg(str, help="Owner group."),
    }

    def probes(self) -> list[list[str]]:
        return [file_state(self.p["path"]).argv]

    async def check(self, ctx) -> Change:
        st = await file_state(self.p["path"]).gather(ctx.conn, check=True)
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
    """A symbolic link pointing at `src`."""

    module = "symlink"
    args = {
        "path": Arg(str, required=True, help="The link."),
        "src": Arg(str, required=True, help="What it points to."),
    }

    def probes(self) -> list[list[str]]:
        return [file_state(self.p["path"]).argv]

    async def check(self, ctx) -> Change:
        st = await file_state(self.p["path"]).gather(ctx.conn, check=True)
        if st.type == "link" and st.link_target == self.p["src"]:
            return ok("link up to date")
        if st.exists and st.type not in ("link",):
            raise TaskFailed(f"{self.p['path']} exists and is a {st.type}; refusing to replace it with a link")
        return change(f"link {self.p['path']} → {self.p['src']}", Diff(st.link_target, self.p["src"], self.p["path"]))

    async def apply(self, ctx, ch) -> None:
        await ctx.conn.run(["ln", "-sfn", "--", self.p["src"], self.p["path"]], check=True)


@register_task
class Absent(Task):
    """A path removed (a directory only with `recurse`)."""

    module = "absent"
    args = {
        "path": Arg(str, required=True, help="Path to remove (file, symlink or directory)."),
        "recurse": Arg(
            bool,
            default=False,
            help="Remove a non-empty directory with its contents; without it a directory must be empty.",
        ),
    }

    def probes(self) -> list[list[str]]:
        return [file_state(self.p["path"]).argv]

    async def check(self, ctx) -> Change:
        st = await file_state(self.p["path"]).gather(ctx.conn, check=True)
        if not st.exists:
            return ok("already absent")
        if st.type == "dir" and not self.p["recurse"]:
            return change(f"remove empty directory {self.p['path']}")
        return change(f"remove {st.type} {self.p['path']}")

    async def apply(self, ctx, ch) -> None:
        if self.p["recurse"]:
            await ctx.conn.run(["rm", "-rf", "--", self.p["path"]], check=True)
        else:
            await ctx.conn.run(
                ["sh", "-c", '[ -d "$1" ] && [ ! -L "$1" ] && rmdir -- "$1" || rm -f -- "$1"', "sh", self.p["path"]],
                check=True,
            )


class _Content(Task):
    """Shared by copy and template: desired bytes known on the controller."""

    async def desired(self, ctx) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def probes(self) -> list[list[str]]:
        return [file_state(self.p["dest"]).argv]

    async def check(self, ctx) -> Change:
        data = await self.desired(ctx)
        want = hashlib.sha256(data).hexdigest()
        st = await file_state(self.p["dest"]).gather(ctx.conn, check=True)
        if st.exists and st.type != "file":
            raise TaskFailed(f"{self.p['dest']} exists and is a {st.type}, not a file")
        if not st.exists:
            return change(
                f"create {self.p['dest']}", Diff("", data.decode(errors="replace"), self.p["dest"]), content=True
            )
        if st.sha256 != want:
            before = ""
            if ctx.options.diff or ctx.options.check:
                got = await ctx.conn.get(self.p["dest"])
                before = (got or b"").decode(errors="replace")
            return change(
                f"update {self.p['dest']} (content differs)",
                Diff(before, data.decode(errors="replace"), self.p["dest"]),
                content=True,
            )
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
    """A file with the given content, or a copy of a controller file; written atomically, validated first when asked."""

    module = "copy"
    args = {
        "dest": Arg(str, required=True, help="Destination path on the host."),
        "content": Arg(str, help="The file's content (one of content/src)."),
        "src": Arg(str, help="A file on the controller (relative: from the inventory's directory)."),
        "mode": Arg((str, int), help="Mode, e.g. `0644`."),
        "owner": Arg(str, help="Owner user."),
        "group": Arg(str, help="Owner group."),
        "validate": Arg(str, help="Command run on a candidate first (`%s` is its path); non-zero keeps the old file."),
    }

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


SHIPPED_TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
# Shipped templates a file of the same name next to the inventory may replace (with a warning on
# every run): what runs as an unprivileged service user only. Everything else shipped — unit files
# (systemd reads them as root; one line makes a service root), the draft watch (a root daemon) and
# the sshd configuration — is never replaced by a file that happens to lie next to the inventory.
OVERRIDABLE = frozenset({"tunnelspec-front.cfg.j2", "tunnelspec-rpc-wait.py"})


def shipped_source(name: str) -> Path:
    """Where tunnelspec's own file `name` lies: a program that runs on the hosts (tunnelspec/hostprogs,
    found by the name the playbooks give it) or a template of data/templates."""
    return program_path(name) or SHIPPED_TEMPLATES / name


def template_search_path(ctx, name: str) -> list[Path]:
    """The files template `name` is looked for in, in order: the inventory's directory, then
    tunnelspec's own. A file next to the inventory that replaces a shipped one is refused (root-run)
    or warned about (OVERRIDABLE), each run."""
    shipped = shipped_source(name)
    where = ctx.inventory_dir / name
    if shipped.exists() and where.exists():
        if name not in OVERRIDABLE:
            raise TaskFailed(
                f"{where} would replace tunnelspec's own {name}, which root runs or reads: refused. "
                f"Move or rename that file (only {', '.join(sorted(OVERRIDABLE))} may be replaced)"
            )
        ctx.emit(
            events.message(
                f"WARNING: {ctx.host}: {where} replaces tunnelspec's shipped {name} "
                "(a file next to the inventory wins): remove it to use the shipped one"
            )
        )
    return [where, shipped]


@register_task
class Template(_Content):
    """A file rendered from a jinja2 template on the controller; uploaded only when its sha256 differs."""

    module = "template"
    args = {
        "src": Arg(
            str, required=True, help="The template (relative: the inventory's directory, then tunnelspec's templates)."
        ),
        "dest": Arg(str, required=True, help="Destination path on the host."),
        "mode": Arg((str, int), help="Mode, e.g. `0644`."),
        "owner": Arg(str, help="Owner user."),
        "group": Arg(str, help="Owner group."),
        "validate": Arg(str, help="Command run on a candidate first (`%s` is its path); non-zero keeps the old file."),
        "vars": Arg(dict, default={}, help="Variables added to the host's for this template."),
    }

    async def desired(self, ctx) -> bytes:
        src = Path(self.p["src"])
        cands = [src] if src.is_absolute() else template_search_path(ctx, str(src))
        for c in cands:
            if c.exists():
                if c == program_path(str(src)):
                    # A host program is code, not a template: sent as it is (a `{{` in Python stays).
                    return c.read_bytes()
                try:
                    return render_file(c.read_text(), {**ctx.vars, **(self.p["vars"] or {})}, str(c)).encode()
                except TemplateError as e:
                    raise TaskFailed(str(e)) from None
        raise TaskFailed(f"template {self.p['src']} not found (looked in {', '.join(map(str, cands))})")
