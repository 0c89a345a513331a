"""A fork server for the unit tier's CLI runs: one Python process that has imported tunnelspec forks a
child per `tunnelspec …` command line, so each run skips the interpreter's start and the imports
(≈ 0.5 s of CPU per run → ≈ 0.03 s; the badinput corpus makes a few hundred runs).

The child is the real CLI in a process of its own: `python -m tunnelspec`'s `__main__` run by runpy,
with the caller's argv, environment, working directory, stdin from /dev/null and stdout/stderr to
files; its exit status is the command's. What it does not go through is the interpreter's start and
the first import of tunnelspec, which the sshd, build and lab tiers (fresh interpreters) and
tests/test_packaging.py cover. A caller whose environment is read at import time (the kill-point
hook, the lab's ccache) gets a fresh interpreter instead (support/cli.py).

Protocol, one request per connection on a Unix socket: the client sends one JSON line
{argv, env, cwd, out, err, timeout}; the server answers {"rc": N} when the child exits, or
{"timeout": true} after killing it (SIGKILL, by PID) when `timeout` passed. The server runs one
thread: it forks children and polls them; it stops (killing what it started) when its stdin closes,
which is when the test process that started it ends.

    python -m support.zygote SOCKET_PATH
"""

from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import socket
import sys
import time


def _child(req: dict) -> None:
    """In the forked child: become `python -m tunnelspec ARGV`; never returns."""
    code = 70
    try:
        os.setpgid(0, 0)  # its own group: a timeout kills what it spawned too
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        # The dispositions a fresh interpreter starts with.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        sys.argv = ["tunnelspec", *req["argv"]]
        try:
            runpy.run_module("tunnelspec", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                sys.stderr.write(f"{e.code}\n")
                code = 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - a closed stream: the exit status stands
            pass
        os._exit(code & 0xFF)


def serve(path: str) -> None:
    import tunnelspec.cli.main  # noqa: F401 - the point of the server: imported once
    import tunnelspec.commands.runner  # noqa: F401
    import tunnelspec.commands.status  # noqa: F401
    import tunnelspec.commands.check  # noqa: F401
    import tunnelspec.connection.ssh  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    running: dict[int, tuple[socket.socket, float]] = {}  # pid -> (its client, deadline)
    print("ready", flush=True)
    try:
        while True:
            for key, _ in sel.select(timeout=0.02):
                if key.data == "stdin":
                    if not sys.stdin.buffer.read1(1024):
                        return
                    continue
                conn, _ = listener.accept()
                conn.settimeout(10)
                line = conn.makefile("rb").readline()
                req = json.loads(line)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    _child(req)
                running[pid] = (conn, time.monotonic() + float(req["timeout"]))
            now = time.monotonic()
            for pid, (conn, deadline) in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    reply = {"rc": os.waitstatus_to_exitcode(status)}
                elif now > deadline:
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    reply = {"timeout": True}
                else:
                    continue
                del running[pid]
                try:
                    conn.sendall((json.dumps(reply) + "\n").encode())
                except OSError:
                    pass
                conn.close()
    finally:
        for pid in running:
            try:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


if __name__ == "__main__":
    serve(sys.argv[1])
