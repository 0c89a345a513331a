"""Exception tree. Each error carries the exit code the CLI returns for it.

Exit codes (the table in docs/ci.md; every command follows it): 0 converged, 1 a task failed,
2 usage or inventory error, 3 --check found drift, 4 a host unreachable, 5 another run holds the
cluster's run lock (--no-wait, or --lock-timeout passed; engine/runlock.py), 70 internal error (a bug:
the traceback is written to a file the message names), 130 interrupted (Ctrl-C), 141 the output was
closed (`| head`).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DRIFT = 3
EXIT_UNREACHABLE = 4
EXIT_LOCKED = 5
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
EXIT_CLOSED_OUTPUT = 141  # 128 + SIGPIPE


class TunnelspecError(Exception):
    exit_code = EXIT_FAILED


class UsageError(TunnelspecError):
    """Bad command line, inventory, playbook or option: nothing was contacted."""

    exit_code = EXIT_USAGE


class SourceError(UsageError):
    """An error located in a file the user wrote: carries file and line."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        self.file = file
        self.line = line
        self.message = message
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        super().__init__(where + message)


class InventoryError(SourceError):
    pass


class PlaybookError(SourceError):
    pass


class ClusterError(UsageError):
    """The inventory parses but does not describe a valid tunnelspec cluster. `cluster.fields.cluster_error`
    sets where: the host, the variable, the file and line (None where not known)."""

    host: str | None = None
    var: str | None = None
    file: str | None = None
    line: int | None = None


class TaskFailed(TunnelspecError):
    """A task failed on one host. Raised inside tasks; the executor turns it into a result."""

    exit_code = EXIT_FAILED


class ArgumentError(TunnelspecError):
    """A task's arguments are wrong (missing, unknown, wrong type or choice): the playbook's mistake,
    reported with the task's file:line. Distinct from a bug inside a task (an internal error)."""

    exit_code = EXIT_FAILED


class HostUnreachable(TunnelspecError):
    exit_code = EXIT_UNREACHABLE


class HostKeyError(HostUnreachable):
    """Host key unknown or changed. Never retried."""


class LabError(TunnelspecError):
    pass
