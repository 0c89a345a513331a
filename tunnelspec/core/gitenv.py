"""The environment of every `git` the controller runs (and of every command on a local host): the
user's, less the variables that choose a repository, its index or its objects.

Run from a git hook (`tunnelspec check` in a pre-commit hook), tunnelspec inherits the hook's GIT_DIR,
GIT_INDEX_FILE, GIT_WORK_TREE, …: each `git -C OTHER …` would then work on the user's repository —
`read-tree` in the scratch repository of the patch check would write the user's index. git itself
clears the same set before it runs a git in another repository (a submodule).
"""

from __future__ import annotations

import os

# `git rev-parse --local-env-vars` (git 2.39), and GIT_NAMESPACE (refs of the user's namespace).
# GIT_CONFIG_PARAMETERS and GIT_CONFIG_COUNT carry the `git -c` settings of the user's own command.
LOCAL_ENV_VARS = frozenset(
    "GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_CONFIG GIT_CONFIG_PARAMETERS GIT_CONFIG_COUNT GIT_OBJECT_DIRECTORY "
    "GIT_DIR GIT_WORK_TREE GIT_IMPLICIT_WORK_TREE GIT_GRAFT_FILE GIT_INDEX_FILE GIT_NO_REPLACE_OBJECTS "
    "GIT_REPLACE_REF_BASE GIT_PREFIX GIT_INTERNAL_SUPER_PREFIX GIT_SHALLOW_FILE GIT_COMMON_DIR GIT_NAMESPACE".split()
)
# The pairs GIT_CONFIG_COUNT numbers: meaningless without it.
_CONFIG_PAIRS = ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")


def git_env(**extra: str) -> dict[str, str]:
    """os.environ without LOCAL_ENV_VARS (nor the config pairs), with `extra` on top."""
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_ENV_VARS and not k.startswith(_CONFIG_PAIRS)}
    env.update(extra)
    return env
