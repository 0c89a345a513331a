"""Task modules (Ansible's "modules"). Importing this package registers every task kind."""

from tunnelspec.tasks.base import TASKS, Arg, Change, Diff, Task, change, ok, register_task


def load_all() -> dict:
    # Imported for their @register_task side effect.
    import importlib
    import pkgutil

    import tunnelspec.tasks as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name not in ("base", "docs"):   # docs: the generator of docs/modules.md, no task
            importlib.import_module(f"tunnelspec.tasks.{mod.name}")
    return TASKS


__all__ = ["TASKS", "Arg", "Change", "Diff", "Task", "change", "ok", "register_task", "load_all"]
