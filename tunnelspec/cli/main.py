"""Command line: the root group, its global options, and how every command's errors end (one line and
the exit code of their kind, docs/ci.md). Each command group lives in its own module of this package
(deploy, status, inventory, lab, hostkeys, advisories, tunnel, certs; their shared options in options);
the root registers them. cli/ is the only package that imports click; it holds no logic of its own."""

from __future__ import annotations

import errno
import json
import os
import sys

import click

from tunnelspec import __version__
from tunnelspec.cli import advisories, certs, deploy, hostkeys, inventory, lab, status, tunnel
from tunnelspec.core.errors import EXIT_CLOSED_OUTPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, TunnelspecError
from tunnelspec.reporting import events


def _wants_json(args: list[str]) -> bool:
    return any(
        a == "--format=json" or (a == "--format" and nxt == "json")
        for a, nxt in zip(args, [*args[1:], ""], strict=True)
    )


def _fail(err: TunnelspecError, as_json: bool = False) -> None:
    _fail_with(str(err), err.exit_code, as_json)


def _fail_with(msg: str, code: int, as_json: bool = False) -> None:
    try:
        click.echo(f"ERROR: {msg}", err=True)
        if as_json:
            # With --format json, stdout stays machine-readable: the error is one event (docs/output.md).
            click.echo(json.dumps(events.error(msg, code), sort_keys=True))
    except OSError:  # stdout (or stderr) closed: the exit code still says what happened
        _silence_stdout()
    sys.exit(code)


def _silence_stdout() -> None:
    """stdout was closed by its reader (`| head`): point it at /dev/null so that Python's flush at
    exit does not raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _is_closed_output(err: BaseException) -> bool:
    return isinstance(err, BrokenPipeError) or (isinstance(err, OSError) and err.errno == errno.EPIPE)


def _internal_error(err: BaseException, as_json: bool) -> None:
    from tunnelspec.cli.crash import one_line, write_report  # lazy: CLI startup (only a crash needs it)

    where = write_report(err)
    tail = f"the traceback is in {where}" if where else "no directory could hold the traceback"
    _fail_with(
        f"internal error (a bug in tunnelspec, please report it): {one_line(err)}; {tail}", EXIT_INTERNAL, as_json
    )


class _Group(click.Group):
    """Every command's errors become one line and the exit code of their kind (docs/ci.md), never a
    traceback: TunnelspecError carries its code; Ctrl-C is 130; a closed stdout ends quietly with 141;
    anything else is a bug, 70, its traceback written to a file the message names."""

    def invoke(self, ctx):  # noqa: D401
        # The subcommand and its arguments: Click >= 8.2 keeps the protected ones in `_protected_args`
        # (its `protected_args` property warns of removal), older Click in a plain attribute.
        protected = vars(ctx).get("_protected_args", vars(ctx).get("protected_args", []))
        args = [*protected, *ctx.args]
        try:
            return super().invoke(ctx)
        except TunnelspecError as err:
            _fail(err, _wants_json(args))
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own: usage errors (exit 2) and explicit exits
        except KeyboardInterrupt:
            _fail_with("interrupted", EXIT_INTERRUPTED, _wants_json(args))
        except Exception as err:  # noqa: BLE001 - the one place a bug becomes a line, not a traceback
            if _is_closed_output(err):
                _silence_stdout()
                sys.exit(EXIT_CLOSED_OUTPUT)
            _internal_error(err, _wants_json(args))

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as done:
            # click itself ends with 1 when its own output (--help, --version, a usage text) meets a
            # closed pipe, and wraps stdout to keep the exit quiet: that is a closed output, 141.
            if done.code == 1 and type(sys.stdout).__name__.lstrip("_") == "PacifyFlushWrapper":
                _silence_stdout()
                raise SystemExit(EXIT_CLOSED_OUTPUT) from None
            # Output still buffered when the reader went away fails only at this flush.
            try:
                sys.stdout.flush()
            except Exception as err:  # noqa: BLE001
                if not _is_closed_output(err):
                    raise
                _silence_stdout()
                raise SystemExit(done.code or EXIT_CLOSED_OUTPUT) from None
            raise


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tunnelspec")
def main() -> None:
    """Deploy llama.cpp distributed inference securely: RPC servers on loopback, reached only
    through SSH tunnels from the main host."""


# Registered in this order (the order of `main.commands`); `--help` lists them sorted by name.
for _command in (
    deploy.play_cmd,
    deploy.deploy_cmd,
    deploy.rollback_cmd,
    deploy.teardown_cmd,
    deploy.verify_cmd,
    status.status_cmd,
    status.logs_cmd,
    status.bench_cmd,
    status.check_cmd,
    inventory.inventory,
    lab.lab,
    hostkeys.hostkeys,
    advisories.advisories_cmd,
    tunnel.tunnel,
    tunnel.keys,
    certs.certs,
    certs.client_config_cmd,
):
    main.add_command(_command)
del _command


if __name__ == "__main__":  # pragma: no cover
    main()
