"""The one error of llama/devices.py, llama/nvidia_smi.py and llama/memory_fit.py: a node or host
does not serve what the inventory and its build ask for, or a model does not fit. A `TaskFailed`, so
a task may let it through as is; every message names the host."""

from __future__ import annotations

from tunnelspec.core.errors import TaskFailed


class DeviceError(TaskFailed):
    """A node or host does not serve what the inventory and its build ask for, or a model does not fit."""
