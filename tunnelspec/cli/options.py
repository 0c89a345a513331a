"""What the command modules share: the INVENTORY argument, the option sets of the commands that run a
playbook (`@run_options`, `@playbook_options`, `@lock_options`), -e, and `_play`, which runs one. Options
and calls only; the logic is in tunnelspec.commands."""

from __future__ import annotations

import functools
import sys

import click


def _run_options(check, diff, limit, tags, skip_tags, forks, verbose, extra_vars=(), **kw):
    from tunnelspec.engine.context import RunOptions  # lazy: CLI startup

    return RunOptions(
        check=check,
        diff=diff,
        limit=limit,
        tags=_split(tags),
        skip_tags=_split(skip_tags),
        forks=forks,
        verbose=verbose,
        extra_vars=_extra_vars(extra_vars),
        **kw,
    )


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
        if not k.isidentifier() or not k.isascii():
            raise click.UsageError(f"-e {item!r}: {k!r} is not a variable name (letters, digits and _)")
        ev[k] = v
    return ev


# -e for the commands that read hosts without running a playbook (status, logs, bench).
_extra_vars_option = click.option(
    "-e", "--extra-vars", "extra_vars", multiple=True, help="KEY=VALUE or @FILE (YAML/JSON), highest precedence."
)


def shown(text: str) -> str:
    """What a command prints, with every secret value this process met masked: a value decrypted from
    Ansible Vault (or any Secret) stays hidden wherever a report, a plan or a host's answer quotes it."""
    from tunnelspec.core.secrets import mask_text, seen  # lazy: CLI startup

    return mask_text(text, seen())


def _split(values) -> list[str]:
    return [t for v in values for t in v.split(",") if t]


# ---- INVENTORY: the positional argument or -i (Ansible's habit) -------------------------------------
_INVENTORY_HELP = "The inventory (INI or YAML), instead of the INVENTORY argument (as ansible-playbook -i)."


def _one_inventory(positional: str | None, option: str | None) -> str:
    if positional and option:
        raise click.UsageError(
            f"the inventory is given twice ({positional!r} and -i {option!r}): give INVENTORY or -i INVENTORY, not both"
        )
    if not (positional or option):
        raise click.UsageError("Missing argument 'INVENTORY' (or -i INVENTORY).")
    return positional or str(option)


def vault_options(f):
    """Ansible Vault's passwords (core/vault.py), for every command that reads an inventory: read at the
    first vault-encrypted value or -e @FILE met, never before (a command on a plain inventory asks
    nothing)."""

    @functools.wraps(f)
    def command(*args, vault_password_files=(), ask_vault_pass=False, vault_ids=(), **kw):
        from tunnelspec.core import vault, vault_password  # lazy: CLI startup

        vault.use_passwords(vault_password.sources(vault_password_files, ask_vault_pass, vault_ids=vault_ids))
        return f(*args, **kw)

    command = click.option(
        "--vault-id",
        "vault_ids",
        multiple=True,
        metavar="[LABEL@]FILE|prompt",
        help="Ansible's form of a vault password source (the label is not checked: every password is tried).",
    )(command)

    command = click.option(
        "--ask-vault-pass",
        "ask_vault_pass",
        is_flag=True,
        help="Ask for the vault password on the terminal (no terminal, as in CI: exit 2; use a file).",
    )(command)
    return click.option(
        "--vault-password-file",
        "vault_password_files",
        multiple=True,
        metavar="FILE",
        type=click.Path(),
        help="The vault password: the file's content, or an executable's output (env: ANSIBLE_VAULT_PASSWORD_FILE).",
    )(command)


def inventory_argument(f=None, *, deferred: bool = False):
    """INVENTORY for every command that reads one: the positional argument or `-i/--inventory`, exactly
    one of them. The command's function receives it as `inventory_file`. `deferred` (check): the path
    is not judged by click and a wrong pair is not raised here: the function receives
    `inventory_file=(positional, option)` and reports any problem itself (`--format json`: in its object)."""

    def wrap(f):
        @functools.wraps(f)
        def command(*args, inventory_file=None, inventory_option=None, **kw):
            if deferred:
                return f(*args, inventory_file=(inventory_file, inventory_option), **kw)
            return f(*args, inventory_file=_one_inventory(inventory_file, inventory_option), **kw)

        command = vault_options(command)
        path = click.Path() if deferred else click.Path(dir_okay=False)
        command = click.argument("inventory_file", metavar="[INVENTORY]", required=False, type=path)(command)
        return click.option(
            "-i", "--inventory", "inventory_option", metavar="INVENTORY", type=path, help=_INVENTORY_HELP
        )(command)

    return wrap if f is None else wrap(f)


def lock_options(f):
    """The run lock (engine/runlock.py): commands that change hosts wait for another run on them."""
    f = click.option(
        "--no-wait",
        "no_wait",
        is_flag=True,
        help="Another run holds a host of this one: exit 5 at once instead of waiting.",
    )(f)
    return click.option(
        "--lock-timeout",
        default=1800,
        show_default=True,
        type=click.IntRange(1, 86400),
        help="Seconds to wait for another run's lock on the hosts, then exit 5.",
    )(f)


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
        click.option(
            "--forks",
            "-f",
            default=20,
            show_default=True,
            type=click.IntRange(1, 500),
            help="Hosts worked on in parallel.",
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["human", "json"]),
            default="human",
            show_default=True,
            help="Output: human recap or JSON lines (one event per line).",
        ),
        click.option(
            "--accept-new-host-keys",
            is_flag=True,
            help="Pin unknown host keys on first use (reported). A changed key always fails.",
        ),
        click.option(
            "-e",
            "--extra-vars",
            "extra_vars",
            multiple=True,
            help="KEY=VALUE or @FILE (YAML/JSON), highest precedence.",
        ),
        click.option("-v", "--verbose", count=True),
        click.option(
            "--list-hosts",
            is_flag=True,
            help="Print the hosts each play would run on (after --limit) and exit; nothing is contacted.",
        ),
        click.option(
            "--list-tags", is_flag=True, help="Print the tags of each play's tasks and exit; nothing is contacted."
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _play(
    inventory_file,
    playbook,
    fmt,
    accept_new_host_keys,
    require_cluster=False,
    require_models=False,
    check_first=False,
    lock="",
    lock_timeout=1800,
    no_wait=False,
    list_hosts=False,
    list_tags=False,
    rollback=None,
    **kw,
):
    from tunnelspec.commands.runner import connect_options_from_env, run_playbook_file  # lazy: CLI startup

    if list_hosts or list_tags:
        from tunnelspec.commands.runner import list_playbook  # lazy: CLI startup

        click.echo(
            list_playbook(
                inventory_file,
                playbook,
                _extra_vars(kw.get("extra_vars", ())),
                kw.get("limit"),
                hosts=list_hosts,
                tags=list_tags,
                fmt=fmt,
            )
        )
        sys.exit(0)

    # --check changes nothing: it never takes (or waits for) the run lock.
    options = _run_options(lock="" if kw.get("check") else lock, lock_timeout=lock_timeout, lock_wait=not no_wait, **kw)
    code = run_playbook_file(
        inventory_file,
        playbook,
        options,
        fmt,
        connect_options_from_env(accept_new_host_keys),
        require_cluster=require_cluster,
        require_models=require_models,
        check_first=check_first,
        rollback=rollback,
    )
    sys.exit(code)


def _builtin(name: str) -> str:
    from tunnelspec.engine.playbook import builtin_playbook  # lazy: CLI startup

    return str(builtin_playbook(name))


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


# ---- the thin commands (tunnel, keys, certs, client-config): --format, and a built-in playbook ------
_tunnel_fmt = click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)


def _tunnel_play(inventory_file, name, fmt, extra, lock, lock_timeout, no_wait, user_extra=()):
    # The user's -e first, the command's own after: the command's variables are its meaning.
    _play(
        inventory_file,
        _builtin(name),
        fmt,
        False,
        require_cluster=True,
        check=False,
        diff=False,
        limit=None,
        tags=(),
        skip_tags=(),
        forks=20,
        verbose=0,
        extra_vars=(*user_extra, *extra),
        lock=lock,
        lock_timeout=lock_timeout,
        no_wait=no_wait,
    )
