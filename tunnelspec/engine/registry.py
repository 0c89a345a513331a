"""The task registry, filled: every task kind of the generic modules (`tunnelspec.modules`) and of the
components (`tunnelspec.components`), imported for their `@register_task` side effect."""

from __future__ import annotations

import importlib
import pkgutil

import tunnelspec.components
import tunnelspec.modules
from tunnelspec.modules.base import TASKS


def load_all() -> dict:
    for pkg in (tunnelspec.modules, tunnelspec.components):
        for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if mod.name != "tunnelspec.modules.base":
                importlib.import_module(mod.name)
    return TASKS


__all__ = ["TASKS", "load_all"]
