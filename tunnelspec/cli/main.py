"""Command line. The only module that imports click; it holds no logic of its own."""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from pathlib import Path

import click

from tunnelspec import __version__
from tunnelspec.core.errors import (EXIT_CLOSED_OUTPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_UNREACHABLE, EXIT_USAGE,
                                    TunnelspecError)
from tunnelspec.core.secrets import masked
from tunnelspec.reporting import events


def _wants_json(args: list[str]) -> bool:
    return any(a == "--format=json" or (a == "--format" and nxt == "json") for a, nxt in zip(args, [*args[1:], ""]))


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
    tail = (f"the traceback is in {where}" if where else "no directory could hold the traceback")
    _fail_with(f"internal error (a bug in tunnelspec, please report it): {one_line(err)}; {tail}",
               EXIT_INTERNAL, as_json)


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


def _run_options(check, diff, limit, tags, skip_tags, forks, verbose, extra_vars=(), **kw):
    from tunnelspec.engine.context import RunOptions  # lazy: CLI startup

    return RunOptions(check=check, diff=diff, limit=limit, tags=_split(tags), skip_tags=_split(skip_tags),
                      forks=forks, verbose=verbose, extra_vars=_extra_vars(extra_vars), **kw)


def _extra_vars(extra_vars) -> dict:
    from tunnelspec.inventory.extra_file import read_extra_vars_file  # lazy: CLI startup

    ev = {}
    for item in extra_vars:
        if item.startswith("@"):
            # -e @FILE: variables from a YAML or JSON mapping (Ansible's form), e.g. a become password
            # kept out of the process list and the shell history.
            ev.update(read_extra_vars_file(item[1:]))
            continue
        if "=" not in item:
            raise click.UsageError(f"-e expects KEY=VALUE or @FILE, got {item!r}")
        k, v = item.split("=", 1)
        ev[k] = v
    return ev


# -e for the commands that read hosts without running a playbook (status, logs, bench).
_extra_vars_option = click.option("-e", "--extra-vars", "extra_vars", multiple=True,
                                  help="KEY=VALUE or @FILE (YAML/JSON), highest precedence.")


def _split(values) -> list[str]:
    return [t for v in values for t in v.split(",") if t]


# ---- INVENTORY: the positional argument or -i (Ansible's habit) -------------------------------------
_INVENTORY_HELP = "The inventory (INI or YAML), instead of the INVENTORY argument (as ansible-playbook -i)."


def _one_inventory(positional: str | None, option: str | None) -> str:
    if positional and option:
        raise click.UsageError(f"the inventory is given twice ({positional!r} and -i {option!r}): give "
                               "INVENTORY or -i INVENTORY, not both")
    if not (positional or option):
        raise click.UsageError("Missing argument 'INVENTORY' (or -i INVENTORY).")
    return positional or option


def inventory_argument(f):
    """INVENTORY for every command that reads one: the positional argument or `-i/--inventory`, exactly
    one of them. The command's function receives it as `inventory_file`."""

    @functools.wraps(f)
    def command(*args, inventory_file=None, inventory_option=None, **kw):
        return f(*args, inventory_file=_one_inventory(inventory_file, inventory_option), **kw)

    command = click.argument("inventory_file", metavar="[INVENTORY]", required=False,
                             type=click.Path(dir_okay=False))(command)
    return click.option("-i", "--inventory", "inventory_option", metavar="INVENTORY",
                        type=click.Path(dir_okay=False), help=_INVENTORY_HELP)(command)


def lock_options(f):
    """The run lock (engine/runlock.py): commands that change hosts wait for another run on them."""
    f = click.option("--no-wait", "no_wait", is_flag=True,
                     help="Another run holds a host of this one: exit 5 at once instead of waiting.")(f)
    return click.option("--lock-timeout", default=1800, show_default=True, type=click.IntRange(1, 86400),
                        help="Seconds to wait for another run's lock on the hosts, then exit 5.")(f)


def run_options(f):
    """Options shared by every command that runs a playbook and may change hosts (Ansible's spelling)."""
    return playbook_options(lock_options(f))


def playbook_options(f):
    """Options shared by every command that runs a playbook (Ansible's spelling); no run lock options:
    `verify` only reads and never locks."""
    opts = [
        click.option("--check", "-C", is_flag=True, help="Change nothing; exit 3 when something would change."),
        click.option("--diff", "-D", is_flag=True, help="Show before/after of changed files (secrets masked)."),
        click.option("--limit", "-l", help="Only hosts matching this pattern."),
        click.option("--tags", "-t", multiple=True, help="Only tasks with these tags (comma-separated)."),
        click.option("--skip-tags", multiple=True, help="Skip tasks with these tags."),
        click.option("--forks", "-f", default=20, show_default=True, type=click.IntRange(1, 500),
                     help="Hosts worked on in parallel."),
        click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True,
                     help="Output: human recap or JSON lines (one event per line)."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Pin unknown host keys on first use (reported). A changed key always fails."),
        click.option("-e", "--extra-vars", "extra_vars", multiple=True, help="KEY=VALUE or @FILE (YAML/JSON), highest precedence."),
        click.option("-v", "--verbose", count=True),
        click.option("--list-hosts", is_flag=True,
                     help="Print the hosts each play would run on (after --limit) and exit; nothing is contacted."),
        click.option("--list-tags", is_flag=True,
                     help="Print the tags of each play's tasks and exit; nothing is contacted."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _play(inventory_file, playbook, fmt, accept_new_host_keys, require_cluster=False, require_models=False,
          preflight=False, lock="", lock_timeout=1800, no_wait=False, list_hosts=False, list_tags=False,
          rollback=None, **kw):
    from tunnelspec.commands.runner import connect_options_from_env, run_playbook_file  # lazy: CLI startup

    if list_hosts or list_tags:
        from tunnelspec.commands.runner import list_playbook  # lazy: CLI startup

        click.echo(list_playbook(inventory_file, playbook, _extra_vars(kw.get("extra_vars", ())), kw.get("limit"),
                                 hosts=list_hosts, tags=list_tags, fmt=fmt))
        sys.exit(0)

    # --check changes nothing: it never takes (or waits for) the run lock.
    options = _run_options(lock="" if kw.get("check") else lock, lock_timeout=lock_timeout,
                           lock_wait=not no_wait, **kw)
    code = run_playbook_file(inventory_file, playbook, options, fmt,
                             connect_options_from_env(accept_new_host_keys), require_cluster=require_cluster,
                             require_models=require_models, preflight=preflight, rollback=rollback)
    sys.exit(code)


@main.command("play")
@click.option("-i", "--inventory", "inventory_option", metavar="INVENTORY", type=click.Path(dir_okay=False),
              help=_INVENTORY_HELP + " The one argument is then the PLAYBOOK.")
@click.argument("paths", nargs=-1, metavar="[INVENTORY] PLAYBOOK", type=click.Path(dir_okay=False))
@run_options
def play_cmd(inventory_option, paths, **kw):
    """Run any playbook against INVENTORY (like ansible-playbook; `play -i INVENTORY PLAYBOOK` too)."""
    if inventory_option is not None:
        if len(paths) != 1:
            raise click.UsageError(f"the inventory is given twice (-i {inventory_option!r} and {paths[0]!r}): with "
                                   "-i INVENTORY, not both, the one argument is the PLAYBOOK" if paths else
                                   "Missing argument 'PLAYBOOK'.")
        inventory_file, playbook = inventory_option, paths[0]
    elif len(paths) == 2:
        inventory_file, playbook = paths
    else:
        raise click.UsageError({0: "Missing argument 'INVENTORY' (or -i INVENTORY) and 'PLAYBOOK'.",
                                1: "Missing argument 'PLAYBOOK'."}.get(len(paths), "Got unexpected extra "
                               f"argument(s) {' '.join(paths[2:])!r}: play takes INVENTORY PLAYBOOK"))
    _play(inventory_file, playbook, lock=f"play {Path(playbook).name}", **kw)


def _builtin(name: str) -> str:
    from tunnelspec.engine.playbook import builtin_playbook  # lazy: CLI startup

    return str(builtin_playbook(name))


@main.command("deploy")
@inventory_argument
@click.option("--allow-vulnerable-llama", is_flag=True,
              help="Deploy even when the pinned build is in a known-vulnerable range (see `tunnelspec advisories`).")
@click.option("--no-rollback", is_flag=True,
              help="On failure, leave the hosts as the failure left them (debugging) instead of returning to the "
                   "last verified generation (docs/generations.md).")
@run_options
def deploy_cmd(inventory_file, allow_vulnerable_llama, no_rollback, **kw):
    """Converge every host: same llama.cpp source, built, RPC services, tunnels, llama-server."""
    _play(inventory_file, _builtin("deploy.yml"), require_cluster=True, require_models=True, preflight=True,
          allow_vulnerable_llama=allow_vulnerable_llama, lock="deploy", rollback=not no_rollback, **kw)


@main.command("rollback")
@inventory_argument
@click.option("--to", "to", type=click.IntRange(1), default=None,
              help="The kept generation to return to (`tunnelspec status` lists them); default: the current one.")
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
@_extra_vars_option
@lock_options
def rollback_cmd(inventory_file, to, fmt, extra_vars, lock_timeout, no_wait):
    """Return every host to a kept generation (its build, files and source; no compile, no download) and verify."""
    from tunnelspec.commands.rollback import rollback  # lazy: CLI startup
    from tunnelspec.commands.runner import reporter  # lazy: CLI startup

    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    options = _run_options(False, False, None, (), (), 20, 0, extra_vars=extra_vars,
                           lock=f"rollback{f' --to {to}' if to else ''}", lock_timeout=lock_timeout,
                           lock_wait=not no_wait)
    sys.exit(rollback(inventory_file, cluster, options, reporter(fmt), opts, to or 0))


@main.command("teardown")
@inventory_argument
@click.option("--purge", is_flag=True, help="Also remove sources, builds, caches and uploaded models.")
@run_options
def teardown_cmd(inventory_file, purge, **kw):
    """Remove everything tunnelspec installed; prove nothing it started still listens."""
    kw["extra_vars"] = tuple(kw.get("extra_vars") or ()) + (f"tunnelspec_purge={'true' if purge else 'false'}",)
    _play(inventory_file, _builtin("teardown.yml"), require_cluster=True, lock="teardown", **kw)


@main.command("verify")
@inventory_argument
@playbook_options
def verify_cmd(inventory_file, **kw):
    """Read-only: /health, a completion with draft tokens and the draft buffer on the remote device (no draft:
    a completion and the target's layers per device from its load lines)."""
    _play(inventory_file, _builtin("verify.yml"), require_cluster=True, **kw)


def _cluster_and_opts(inventory_file, accept_new_host_keys=False, extra_vars=(), connects=True):
    from tunnelspec.inventory import load_inventory  # lazy: CLI startup
    from tunnelspec.cluster.model import Cluster  # lazy: CLI startup
    from tunnelspec.commands.runner import connect_options_from_env  # lazy: CLI startup

    inv = load_inventory(inventory_file).with_extra_vars(_extra_vars(extra_vars))
    cluster, opts = Cluster.from_inventory(inv), connect_options_from_env(accept_new_host_keys)
    if connects:  # a known_hosts that cannot be read is exit 2 before any host is contacted
        from tunnelspec.connection.factory import check_known_hosts  # lazy: CLI startup

        check_known_hosts(inv, cluster.hosts, opts)
    return inv, cluster, opts


@main.command("status")
@inventory_argument
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
@_extra_vars_option
def status_cmd(inventory_file, fmt, extra_vars):
    """One screen: sources, builds, services, tunnels, RPC versions/devices, llama-server health, draft acceptance."""
    import asyncio  # lazy: CLI startup

    from tunnelspec.commands import status  # lazy: CLI startup

    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    report = asyncio.run(status.gather(inv, cluster, opts))
    click.echo(json.dumps(report, sort_keys=True) if fmt == "json" else status.render(report))
    sys.exit(status.status_exit_code(report))


@main.command("logs")
@inventory_argument
@click.option("--output", "-o", "output", default=None, type=click.Path(),
              help="Directory, or a .tar.gz file, to write (default ./tunnelspec-logs-<UTC time>).")
@click.option("--since", default=None,
              help="Journal lines since this time (journalctl --since syntax, e.g. '1 hour ago'); "
                   "default: the current boot.")
@_extra_vars_option
def logs_cmd(inventory_file, output, since, extra_vars):
    """Read-only bug-report bundle: every host's tunnelspec journals, unit files, llama-server version
    and devices, load/placement lines, status; secrets masked. Unreachable hosts are listed."""
    from tunnelspec.commands import logs  # lazy: CLI startup

    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    where, hosts = logs.run(inv, cluster, opts, output, since)
    click.echo(logs.summary(hosts, where), nl=False)
    unreachable = [b.name for b in hosts if b.unreachable]
    if unreachable:  # the bundle holds what could be collected; the exit code says it is not everything
        click.echo(f"ERROR: unreachable: {', '.join(unreachable)} (the bundle {where} has the other hosts)",
                   err=True)
        sys.exit(EXIT_UNREACHABLE)


@main.command("bench")
@inventory_argument
@click.option("--n-predict", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Tokens generated per completion.")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1, 50),
              help="Measured completions per side, after one warm-up; speeds are their median.")
@click.option("--prompt", default=None, help="Prompt text, the same for both sides (a fixed story prompt by default).")
@click.option("--same-placement", is_flag=True,
              help="Baseline keeps the deployed target placement (--rpc, -dev, -ts) and drops only the draft. "
                   "INTERRUPTS SERVING: stops the deployed llama-server meanwhile; needs --yes.")
@click.option("--yes", is_flag=True, help="Allow an option that interrupts serving (--same-placement); never asked.")
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True,
              help="A side-by-side table, or one JSON object (schema 2, docs/cli.md).")
@_extra_vars_option
def bench_cmd(inventory_file, n_predict, runs, prompt, same_placement, yes, fmt, extra_vars):
    """The cluster as deployed vs. the same model on main alone (when it fits main; else why, with both
    figures): load time, prompt and generation tokens/s, draft accepted, time waiting on the network.
    Read-only unless --same-placement (docs/cli.md, "tunnelspec bench")."""
    from tunnelspec.commands.bench import command as bench  # lazy: CLI startup

    if same_placement:
        bench.refuse_same_placement(yes)  # before anything is read or contacted
    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    kw = {"n_predict": n_predict, "runs": runs, "same_placement": same_placement, "yes": yes}
    if prompt:
        kw["prompt"] = prompt
    result = bench.bench_sync(inv, cluster, opts, **kw)
    click.echo(json.dumps(result, sort_keys=True) if fmt == "json" else bench.render(result))
    sys.exit(bench.exit_code(result))


@main.command("check")
@inventory_argument
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True,
              help="Errors, warnings and the plan as text, or one JSON object.")
@_extra_vars_option
def check_cmd(inventory_file, fmt, extra_vars):
    """Offline: every inventory mistake at once (file:line), then what systemd will run on each host.
    Contacts nothing. Exit 2 on errors, 0 otherwise (warnings alone are fine)."""
    from tunnelspec.commands.check import check_inventory  # lazy: CLI startup

    report = check_inventory(inventory_file, _extra_vars(extra_vars))
    click.echo(json.dumps(report.as_json(), sort_keys=True) if fmt == "json" else report.render())
    sys.exit(report.exit_code())


# ---- inventory -------------------------------------------------------------------------------
@main.group()
def inventory() -> None:
    """Inspect an Ansible inventory (INI or YAML)."""


@inventory.command("list")
@inventory_argument
@click.option("--show-secrets", is_flag=True,
              help="Print the values of secret-named variables (…_password, …_token, api_key, …) too; "
                   "masked as *** by default.")
def inventory_list(inventory_file: str, show_secrets: bool) -> None:
    """Print the inventory as JSON, in the structure of `ansible-inventory --list` (secret-named
    variables masked unless --show-secrets)."""
    from tunnelspec.inventory import load_inventory  # lazy: CLI startup

    inv = load_inventory(inventory_file)
    data = inv.to_ansible_list()
    click.echo(json.dumps(data if show_secrets else masked(data), indent=4, sort_keys=True))


# ---- lab -------------------------------------------------------------------------------------
@main.group()
def lab() -> None:
    """A local lab of real hosts (systemd-nspawn containers) to try everything."""


_lab_dir = click.option("--dir", "lab_dir", default="lab", show_default=True,
                        type=click.Path(file_okay=False), help="Where the lab writes its files.")


@lab.command("up")
@click.option("--hosts", default="main,rpc-a,rpc-b", show_default=True,
              help="Comma-separated host names; the first is main, the others rpc nodes.")
@_lab_dir
@click.option("--subnet", default=None, help="Lab subnet inside 10.77.0.0/16 [10.77.0.0/24].")
@click.option("--bridge", default=None, help="Bridge name, one per lab [tslab0].")
@click.option("--release", "release", default="", metavar="HOST=CODENAME[,...]",
              help="Debian release per host: bullseye, bookworm or trixie [bookworm for every host].")
@click.option("--login-user", default=None, metavar="NAME",
              help="Log in as NAME, a sudoer on every host (ansible_become=true), instead of root.")
@click.option("--login-password-file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="NAME's sudo password, from this file (default: passwordless sudo).")
def lab_up(hosts: str, lab_dir: str, subnet: str | None, bridge: str | None, release: str,
           login_user: str | None, login_password_file: str | None) -> None:
    """Build the images (once), boot the hosts, write inventory, known_hosts, key, ssh_config."""
    from tunnelspec.lab import Lab  # lazy: CLI startup

    releases = {}
    for item in (x for x in release.split(",") if x.strip()):
        name, sep, rel = item.partition("=")
        if not sep or not name.strip() or not rel.strip():
            raise click.UsageError(f"--release takes HOST=CODENAME[,...], got {item!r}")
        releases[name.strip()] = rel.strip()
    if login_password_file and not login_user:
        raise click.UsageError("--login-password-file needs --login-user")

    password = Path(login_password_file).read_text().rstrip("\n") if login_password_file else None
    Lab(lab_dir, subnet=subnet, bridge=bridge).up([h for h in hosts.split(",") if h], releases=releases,
                                                  login_user=login_user, login_password=password)


@lab.command("status")
@_lab_dir
def lab_status(lab_dir: str) -> None:
    """Each host: address, nspawn PID, link and `systemctl is-system-running`."""
    from tunnelspec.lab import Lab  # lazy: CLI startup

    rows = Lab(lab_dir).status()
    if not rows:
        click.echo(f"no lab in {lab_dir}")
        return
    click.echo(f"{'HOST':<12} {'ADDRESS':<15} {'PID':>8}  {'LINK':<5} SYSTEM")
    for r in rows:
        pid = str(r.pid) if r.running else "-"
        click.echo(f"{r.name:<12} {r.ip:<15} {pid:>8}  {'up' if r.link_up else 'down':<5} "
                   f"{r.system_state}")


@lab.command("down")
@_lab_dir
def lab_down(lab_dir: str) -> None:
    """Power off the hosts and remove overlays, mounts, cgroups, namespaces, veths, bridge."""
    from tunnelspec.lab import Lab  # lazy: CLI startup

    Lab(lab_dir).down()


@lab.command("exec", context_settings={"ignore_unknown_options": True})
@_lab_dir
@click.argument("host")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def lab_exec(lab_dir: str, host: str, argv: tuple[str, ...]) -> None:
    """Run a command inside a lab host: tunnelspec lab exec HOST -- CMD..."""
    from tunnelspec.lab import Lab  # lazy: CLI startup

    sys.exit(Lab(lab_dir).exec(host, list(argv), capture=False).returncode)


@lab.command("link")
@_lab_dir
@click.argument("host")
@click.argument("state", type=click.Choice(["up", "down"]))
def lab_link(lab_dir: str, host: str, state: str) -> None:
    """Cut (down) or restore (up) a host's network link."""
    from tunnelspec.lab import Lab  # lazy: CLI startup

    Lab(lab_dir).link(host, up=(state == "up"))


# ---- hostkeys --------------------------------------------------------------------------------
@main.group("hostkeys")
def hostkeys() -> None:
    """Review SSH host keys before trusting them."""


@hostkeys.command("scan")
@inventory_argument
@click.option("--limit", "-l", help="Only hosts matching this pattern.")
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
def hostkeys_scan(inventory_file: str, limit: str | None, fmt: str) -> None:
    """Print each host's keys and SHA256 fingerprints, marked pinned / not pinned / CHANGED against
    known_hosts. Trusts nothing and writes nothing; exit 4 when a host fails or a key changed."""
    from tunnelspec.commands.hostkeys_scan import run_scan  # lazy: CLI startup
    from tunnelspec.commands.runner import connect_options_from_env  # lazy: CLI startup

    sys.exit(run_scan(inventory_file, limit, fmt, connect_options_from_env(), sys.stdout))


# ---- advisories ------------------------------------------------------------------------------
@main.command("advisories")
@click.option("--build", "build_number", type=int, default=None,
              help="Check one llama.cpp build number (bNNNN) instead of printing the table.")
def advisories_cmd(build_number: int | None) -> None:
    """Known-vulnerable llama.cpp build ranges touching RPC."""
    from tunnelspec.llama import advisories  # lazy: CLI startup

    if build_number is None:
        click.echo(advisories.format_table())
        return
    result = advisories.check(build_number)
    click.echo(f"{result.verdict}: {result.message}")
    if result.verdict == advisories.AFFECTED:
        sys.exit(1)


# ---- tunnel / keys (persistent SSH tunnels on main) ---------------------------------------------
@main.group()
def tunnel() -> None:
    """Persistent SSH tunnels on the main host (one systemd unit per rpc node)."""


_tunnel_limit = click.option("--limit", "-l", "nodes", default="", help="Only these rpc nodes (comma-separated).")
_tunnel_fmt = click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)


def _tunnel_play(inventory_file, name, fmt, extra, lock, lock_timeout, no_wait, user_extra=()):
    # The user's -e first, the command's own after: the command's variables are its meaning.
    _play(inventory_file, _builtin(name), fmt, False, require_cluster=True, check=False, diff=False, limit=None,
          tags=(), skip_tags=(), forks=20, verbose=0, extra_vars=(*user_extra, *extra), lock=lock,
          lock_timeout=lock_timeout, no_wait=no_wait)


@tunnel.command("open")
@inventory_argument
@_tunnel_limit
@_tunnel_fmt
@_extra_vars_option
@lock_options
def tunnel_open(inventory_file, nodes, fmt, extra_vars, lock_timeout, no_wait):
    """Install, start and check the tunnels (HELLO through each one); start llama-server again if
    closing the tunnels stopped it (deployed, enabled, and all of its tunnels open)."""
    _tunnel_play(inventory_file, "tunnel-open.yml", fmt, [f"tunnel_nodes={nodes}"] if nodes else [],
                 "tunnel open", lock_timeout, no_wait, extra_vars)


@tunnel.command("close")
@inventory_argument
@_tunnel_limit
@_tunnel_fmt
@_extra_vars_option
@lock_options
def tunnel_close(inventory_file, nodes, fmt, extra_vars, lock_timeout, no_wait):
    """Stop and disable the tunnel units (keys and files stay)."""
    _tunnel_play(inventory_file, "tunnel-close.yml", fmt, [f"tunnel_nodes={nodes}"] if nodes else [],
                 "tunnel close", lock_timeout, no_wait, extra_vars)


@tunnel.command("status")
@inventory_argument
@_tunnel_limit
@_tunnel_fmt
@_extra_vars_option
def tunnel_status_cmd(inventory_file, nodes, fmt, extra_vars):
    """Per tunnel: unit state, local port, remote RPC version and devices (or busy)."""
    import asyncio  # lazy: CLI startup

    from tunnelspec.commands.runner import connect_options_from_env  # lazy: CLI startup
    from tunnelspec.commands.tunnel_status import format_status, tunnel_status  # lazy: CLI startup

    rows = asyncio.run(tunnel_status(inventory_file, nodes, connect_options_from_env(),
                                     extra_vars=_extra_vars(extra_vars)))
    click.echo(json.dumps(rows) if fmt == "json" else format_status(rows))
    sys.exit(0 if all(r["state"] == "active" and r["rpc"] in ("ok", "busy") for r in rows) else 1)


@main.group()
def keys() -> None:
    """Tunnel keys."""


@keys.command("rotate")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
@lock_options
def keys_rotate(inventory_file, fmt, extra_vars, lock_timeout, no_wait):
    """Replace the tunnel key on main and its authorized_keys line on every node; restart tunnels."""
    from tunnelspec.components.tunnel.keypair import new_rotation_token  # lazy: CLI startup

    _tunnel_play(inventory_file, "tunnel-open.yml", fmt, [f"tunnel_key_rotation={new_rotation_token()}"],
                 "keys rotate", lock_timeout, no_wait, extra_vars)


# ---- TLS of llama-server's API (public bind) ---------------------------------------------------
@main.group()
def certs() -> None:
    """The inventory's certificate authority and llama-server's certificate (llama_server_public_bind=true)."""


@certs.command("rotate")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
@lock_options
def certs_rotate(inventory_file, fmt, extra_vars, lock_timeout, no_wait):
    """A new CA for this inventory (the old key is deleted), main's certificate re-issued by it and
    the front reloaded (llama-server keeps running); clients must pin the new ca.crt (the old one no
    longer validates)."""
    from tunnelspec.commands import certs as certs_mod  # lazy: CLI startup

    _, cluster, _ = _cluster_and_opts(inventory_file, extra_vars=extra_vars, connects=False)
    old, new = certs_mod.rotate(cluster)
    click.echo(f"CA rotated: {old or '(none)'} → {new}; clients pin {cluster.main.tls.ca_file}", err=True)
    _tunnel_play(inventory_file, "certs-rotate.yml", fmt, [], "certs rotate", lock_timeout, no_wait, extra_vars)


@certs.command("show")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
def certs_show(inventory_file, fmt, extra_vars):
    """The CA clients pin (subject, end, fingerprint) and where main's certificate and key are. No key is shown."""
    from tunnelspec.commands import certs as certs_mod  # lazy: CLI startup

    _, cluster, _ = _cluster_and_opts(inventory_file, extra_vars=extra_vars, connects=False)
    d = certs_mod.show(cluster)
    click.echo(json.dumps(d, sort_keys=True) if fmt == "json" else certs_mod.render_show(d), nl=fmt == "json")


@main.command("client-config")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
def client_config_cmd(inventory_file, fmt, extra_vars):
    """What a client needs: the base URL (https://…/v1), the CA file to pin, where the API key lives
    on main (never the key itself)."""
    from tunnelspec.commands import certs as certs_mod  # lazy: CLI startup
    from tunnelspec.commands.client_config import render  # lazy: CLI startup

    _, cluster, _ = _cluster_and_opts(inventory_file, extra_vars=extra_vars, connects=False)
    cfg = certs_mod.config_for(cluster)
    click.echo(json.dumps(cfg, sort_keys=True, indent=2) if fmt == "json" else render(cfg), nl=fmt == "json")


# ---- end of command groups -------------------------------------------------------------------
if __name__ == "__main__":  # pragma: no cover
    main()
