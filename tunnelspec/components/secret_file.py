"""A file the user wrote on a host that holds a secret (llama-server's API key, the front's scrape token),
given to the one user that reads it: owner and mode 0600, set by root.

Root's fix goes only to a regular file with one name. Through a symlink, or onto a file with a second
name (a hard link), it would hand that user whatever the link points to: `stat` never follows a link,
and the fix itself works on the file it opened without following one (chmod(1) always follows a link).
"""

from __future__ import annotations

from tunnelspec.core.errors import TaskFailed

# Owner (with the user's login group, as `chown USER:`) and mode through one descriptor opened without
# following a link, after checking that descriptor: no link swapped in after the stat can be followed.
_FIX = r"""
import os, pwd, stat, sys
path, user = sys.argv[1], sys.argv[2]
try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
except OSError as err:
    sys.exit("%s: %s" % (path, err.strerror))
st = os.fstat(fd)
if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
    sys.exit("%s is no longer a regular file with one name" % path)
pw = pwd.getpwnam(user)
os.fchown(fd, pw.pw_uid, pw.pw_gid)
os.fchmod(fd, 0o600)
"""


def stat_argv(path: str) -> list[str]:
    return ["stat", "-c", "%h %a %U %s %F", "--", path]


def fix_argv(path: str, owner: str) -> list[str]:
    return ["python3", "-I", "-c", _FIX, path, owner]


async def plain_file(conn, host: str, path: str, what: str, missing: str, example: str) -> tuple[str, str, int]:
    """(mode, owner, size) of the regular file with one name at `path`; TaskFailed otherwise (`missing`
    when nothing is there). `what` names the file in the message ("API key file"), `example` a good place."""
    res = await conn.probe(stat_argv(path))
    if res.rc != 0:
        raise TaskFailed(missing)
    links, mode, owner, size, kind = res.stdout.strip().split(" ", 4)
    if kind not in ("regular file", "regular empty file") or links != "1":
        raise TaskFailed(
            f"{host}: {what} {path} is a {kind} with {links} name(s), not a plain file: tunnelspec "
            f"changes the owner only of a regular file with one name. Put it in a regular file (e.g. {example})"
        )
    return mode, owner, int(size)


async def make_private(conn, host: str, path: str, owner: str, what: str) -> None:
    """Owner `owner` (and its login group), mode 0600: only on a regular file with one name."""
    res = await conn.run(fix_argv(path, owner))
    if res.rc != 0:
        why = res.stderr.strip().splitlines()
        raise TaskFailed(f"{host}: {what} {path}: owner and mode not changed: {why[-1] if why else f'rc {res.rc}'}")
