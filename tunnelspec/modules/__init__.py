"""Generic task modules (Ansible's "modules"): files, systemd units, users, lines in files, commands,
git checkouts. The registry is filled by `tunnelspec.engine.registry.load_all`, which imports these
and the components' tasks."""

from tunnelspec.modules.base import TASKS, Arg, Change, Diff, Task, change, ok, register_task

__all__ = ["TASKS", "Arg", "Change", "Diff", "Task", "change", "ok", "register_task"]
