"""`tunnelspec lab`: a local lab of real hosts."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.group()
def lab() -> None:
    """A local lab of real hosts (systemd-nspawn containers) to try everything."""


_lab_dir = click.option(
    "--dir",
    "lab_dir",
    default="lab",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the lab writes its files.",
)


@lab.command("up")
@click.option(
    "--hosts",
    default="main,rpc-a,rpc-b",
    show_default=True,
    help="Comma-separated host names; the first is main, the others rpc nodes.",
)
@_lab_dir
@click.option("--subnet", default=None, help="Lab subnet inside 10.77.0.0/16 [10.77.0.0/24].")
@click.option("--bridge", default=None, help="Bridge name, one per lab [tslab0].")
@click.option(
    "--release",
    "release",
    default="",
    metavar="HOST=CODENAME[,...]",
    help="Debian release per host: bullseye, bookworm or trixie [bookworm for every host].",
)
@click.option(
    "--login-user",
    default=None,
    metavar="NAME",
    help="Log in as NAME, a sudoer on every host (ansible_become=true), instead of root.",
)
@click.option(
    "--login-password-file",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="NAME's sudo password, from this file (default: passwordless sudo).",
)
def lab_up(
    hosts: str,
    lab_dir: str,
    subnet: str | None,
    bridge: str | None,
    release: str,
    login_user: str | None,
    login_password_file: str | None,
) -> None:
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
    Lab(lab_dir, subnet=subnet, bridge=bridge).up(
        [h for h in hosts.split(",") if h], releases=releases, login_user=login_user, login_password=password
    )


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
        click.echo(f"{r.name:<12} {r.ip:<15} {pid:>8}  {'up' if r.link_up else 'down':<5} {r.system_state}")


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
