"""The live state of a host that a generation records (components/generation/record.py): where its
`current` build link points, and each managed file's sha256 and mode, read in one command."""

from __future__ import annotations


# One round trip: where `current` points, and each file's sha256 and mode ("-" when absent). A path
# that is a symbolic link (dangling or not) or not a regular file is reported as such (`!` and its
# kind), never followed: its sum and mode would be another file's (a link's own mode reads 777), and
# the copy kept of it would be that other file.
# The regular files' digests and modes come from one sha256sum and one stat for all of them (not
# three processes a file); each digest line must name the file asked for, else nothing is printed.
STATE_SCRIPT = r"""
root=$1; shift
printf 'build %s\n' "$(readlink -- "$root/current" 2>/dev/null)"
n=$#
for f do
  if [ -L "$f" ]; then printf 'file ! link %s\n' "$f"
  elif [ -f "$f" ]; then set -- "$@" "$f"
  elif [ -e "$f" ]; then printf 'file ! other %s\n' "$f"
  else printf 'file - - %s\n' "$f"; fi
done
shift "$n"
[ $# -gt 0 ] || exit 0
nl='
'
modes=$(stat -c %a -- "$@")$nl || exit 1
sha256sum -- "$@" | {
  for f do
    IFS=' ' read -r sum p || exit 1
    [ "$p" = " $f" ] || [ "$p" = "$f" ] || exit 1
    printf 'file %s %s %s\n' "$sum" "${modes%%"$nl"*}" "$f"
    modes=${modes#*"$nl"}
  done
}
"""


def parse_state(text: str) -> dict:
    """STATE_SCRIPT's output → {"build": dir or "", "files": {path: {sha256, mode} | {"kind": "link" or
    "other"} | None}}. A kind is never recorded (generation_record refuses it) and never equals a recorded
    file: a restore replaces it with the file."""
    build, files = "", {}
    for line in text.splitlines():
        if line.startswith("build "):
            build = line[6:].strip()
        elif line.startswith("file "):
            _, sha, mode, path = line.split(" ", 3)
            files[path] = None if sha == "-" else {"kind": mode} if sha == "!" else {"sha256": sha, "mode": mode}
    return {"build": build, "files": files}
