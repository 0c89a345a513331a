"""user (a system user) and authorized_key (one key line, with options)."""

from __future__ import annotations

from tunnelspec.connection.base import read_argv
from tunnelspec.core.constants import SERVICE_USER_MARK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.reporting import events
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task

NOLOGIN = "/usr/sbin/nologin"
# Written as the account's comment (GECOS) when tunnelspec creates it: an account without it is not
# tunnelspec's, and is never changed or removed (a deploy with llama_user=ubuntu once got nologin, then
# teardown killed its processes and deleted it with its home). The comment lives in /etc/passwd with
# the account itself: no separate record to lose, and reading it is the getent the task runs anyway.
MARK = SERVICE_USER_MARK
SYSTEM_UID_MAX = 999


def ours(fields: list[str]) -> bool:
    """Was this account (a `getent passwd` line split on ':') created by tunnelspec? Its comment says
    so; accounts created before the comment existed are recognised by what tunnelspec made them: a
    system uid, a `tunnelspec-` name and an empty comment (they get the comment on the next deploy)."""
    if len(fields) < 7:
        return False
    if fields[4] == MARK:
        return True
    return (
        fields[4] == ""
        and fields[0].startswith("tunnelspec-")
        and fields[2].isdigit()
        and 0 < int(fields[2]) <= SYSTEM_UID_MAX
    )


def not_ours(host: str, fields: list[str]) -> str:
    return (
        f"{host}: user {fields[0]} exists and was not created by tunnelspec (uid {fields[2]}, shell {fields[6]}"
        + (f", comment {fields[4]!r}" if fields[4] else "")
        + "): tunnelspec changes and removes only the "
        "service users it created. Choose another name (rpc_user, tunnel_user, llama_user, front_user) or "
        "remove that account yourself"
    )


# Kill every process of the user, then wait (≤ 5 s) until none is left but zombies: SIGKILL is
# asynchronous, and a process still tearing down its memory counts for userdel (zombies do not).
_KILL_ALL = r"""
i=0
while ps -o stat= -u "$1" 2>/dev/null | grep -qv '^Z' && [ $i -lt 50 ]; do
  pkill -KILL -u "$1"
  i=$((i + 1))
  sleep 0.1
done
"""


@register_task
class User(Task):
    """A (system) user, present or absent."""

    module = "user"
    args = {
        "name": Arg(str, required=True, help="The user."),
        "system": Arg(bool, default=True, help="A system user (no aging, low uid)."),
        "shell": Arg(str, default=NOLOGIN, help="Login shell."),
        "home": Arg(str, help="Home directory."),
        "create_home": Arg(bool, default=False, help="Create the home directory."),
        "state": Arg(str, default="present", choices=("present", "absent"), help="`present` or `absent`."),
    }

    def probes(self) -> list[list[str]]:
        return [self._getent_argv()]

    def _getent_argv(self) -> list[str]:
        return ["getent", "passwd", self.p["name"]]

    async def check(self, ctx):
        res = await ctx.conn.probe(self._getent_argv())
        present = res.rc == 0
        fields = res.stdout.strip().split(":") if present else []
        if self.p["state"] == "absent":
            if present and not ours(fields):
                msg = f"user {self.p['name']} left alone: not created by tunnelspec"
                ctx.emit(events.message(f"WARNING: {ctx.host}: {msg}"))
                return ok(msg)
            return change(f"remove user {self.p['name']}") if present else ok("user absent")
        if not present:
            return change(f"create user {self.p['name']}", create=True)
        if not ours(fields):
            raise TaskFailed(not_ours(ctx.host, fields))
        diffs = []
        if fields[4] != MARK:
            diffs.append(("comment", fields[4], MARK))
        if fields[6] != self.p["shell"]:
            diffs.append(("shell", fields[6], self.p["shell"]))
        if self.p["home"] and fields[5] != self.p["home"]:
            diffs.append(("home", fields[5], self.p["home"]))
        if diffs:
            return change(
                ", ".join(f"{k} {a} → {b}" for k, a, b in diffs),
                Diff("\n".join(f"{k}={a}" for k, a, _ in diffs), "\n".join(f"{k}={b}" for k, _, b in diffs)),
            )
        return ok("user present")

    async def apply(self, ctx, ch):
        name = self.p["name"]
        if self.p["state"] == "absent":
            # Stop the user's leftover processes first or userdel refuses — and until they have exited
            # (a CI teardown failed: "user tunnelspec-tunnel is currently used by process N").
            await ctx.conn.run(["sh", "-c", _KILL_ALL, "sh", name], timeout=30)
            await ctx.conn.run(["userdel", "--remove", name], check=False)
            res = await ctx.conn.run(["getent", "passwd", name])
            if res.rc == 0:
                raise TaskFailed(f"could not remove user {name}")
            return
        if ch.data.get("create"):
            argv = ["useradd", "--shell", self.p["shell"], "--user-group", "--comment", MARK]
            if self.p["system"]:
                argv.append("--system")
            if self.p["home"]:
                argv += ["--home-dir", self.p["home"]]
            argv += ["--create-home"] if self.p["create_home"] else ["--no-create-home"]
            await ctx.conn.run(argv + ["--", name], check=True)
        else:
            argv = ["usermod", "--shell", self.p["shell"], "--comment", MARK]
            if self.p["home"]:
                argv += ["--home", self.p["home"]]
            await ctx.conn.run(argv + ["--", name], check=True)


@register_task
class ServiceUsersOwned(Task):
    """Read-only preflight: every service user named for this host is either absent (tunnelspec
    will create it) or one tunnelspec created — never an existing account of someone else's, which
    the deploy would change (nologin shell) and a teardown would delete."""

    module = "service_users_owned"
    read_only = True
    args = {"names": Arg(list, default=[], help="The service users of this host.")}

    def probes(self) -> list[list[str]]:
        return [self._argv()]

    def _argv(self) -> list[str]:
        return [
            "sh",
            "-c",
            'for u in "$@"; do getent passwd -- "$u" || echo "$u:-"; done',
            "sh",
            *[str(n) for n in self.p["names"]],
        ]

    async def check(self, ctx):
        names = [str(n) for n in self.p["names"]]
        if not names:
            return ok("no service user")
        res = await ctx.conn.probe(self._argv())
        problems = []
        for line in res.stdout.splitlines():
            fields = line.split(":")
            if len(fields) >= 7 and fields[0] in names and not ours(fields):
                problems.append(not_ours(ctx.host, fields))
        if problems:
            raise TaskFailed("; ".join(problems))
        return ok("service users absent or tunnelspec's: " + ", ".join(names))


def key_line(options: str | None, key: str) -> str:
    key = " ".join(key.split())
    return f"{options} {key}" if options else key


def _key_body(line: str) -> str | None:
    """The 'type base64' part of an authorized_keys line, whatever options precede it."""
    parts = line.split()
    for i, p in enumerate(parts):
        if p.startswith(("ssh-", "ecdsa-", "sk-")) and i + 1 < len(parts):
            return f"{p} {parts[i + 1]}"
    return None


@register_task
class AuthorizedKey(Task):
    """One key line in an authorized_keys file, with its options (present or absent)."""

    module = "authorized_key"
    args = {
        "path": Arg(str, required=True, help="The authorized_keys file."),
        "key": Arg(str, required=True, help="The public key: `type base64 [comment]`."),
        "options": Arg(str, help="Options written before the key (e.g. `restrict,port-forwarding`)."),
        "owner": Arg(str, help="Owner of the file (and of a created directory)."),
        "state": Arg(
            str,
            default="present",
            choices=("present", "absent"),
            help="`present`: the line is there exactly; `absent`: no line with this key.",
        ),
        "exclusive": Arg(bool, default=False, help="Remove every other key line from the file."),
    }

    def probes(self) -> list[list[str]]:
        return [read_argv(self.p["path"])]

    async def check(self, ctx):
        data = await ctx.conn.get(self.p["path"])
        cur = (data or b"").decode()
        body = _key_body(self.p["key"])
        if not body:
            raise TaskFailed("authorized_key: `key` is not an OpenSSH public key line")
        want_line = key_line(self.p["options"], self.p["key"])
        lines = [row for row in cur.splitlines() if row.strip()]
        if self.p["state"] == "absent":
            kept = [row for row in lines if _key_body(row) != body]
        elif self.p["exclusive"]:
            kept = [want_line]
        else:
            kept = [row for row in lines if _key_body(row) != body] + [want_line]
            # Keep the file's order when the line is already right.
            if want_line in lines and sum(_key_body(row) == body for row in lines) == 1:
                kept = lines
        new = "\n".join(kept) + ("\n" if kept else "")
        if new == cur or (not kept and data is None):
            return ok("key " + ("present" if self.p["state"] == "present" else "absent"))
        return change(
            "key line " + ("installed" if self.p["state"] == "present" else "removed"),
            Diff(cur, new, self.p["path"]),
            new=new,
        )

    async def apply(self, ctx, ch):
        owner = self.p["owner"]
        d = self.p["path"].rsplit("/", 1)[0]
        await ctx.conn.run(["install", "-d", "-m", "700", *(["-o", owner] if owner else []), "--", d], check=True)
        await ctx.conn.put(ch.data["new"], self.p["path"], 0o600, owner)
