"""Ansible's connection variables as tunnelspec reads them: honoured, or refused with the reason
(never accepted and ignored), or Ansible's business only (`ignored`)."""

from __future__ import annotations

from tunnelspec.cluster.vardecl import Var

_KEYS_ONLY = (
    "refused: tunnelspec logs in with keys only (ansible_ssh_private_key_file, TUNNELSPEC_SSH_KEY or "
    "ssh-agent); remove it (a sudo password is ansible_become_password)"
)


def _old(new: str) -> str:
    return f"refused: an old Ansible spelling tunnelspec does not read; write {new}"


ANSIBLE_VARS: tuple[Var, ...] = (
    # ---- Ansible's connection variables ---------------------------------------------------------
    Var("ansible_host", "address", "The address the controller's ssh connects to.", derived="the inventory name"),
    Var("ansible_port", "port", "The SSH port of the host.", default=22),
    Var("ansible_user", "string", "The login name on the host.", derived="the controller's user"),
    Var(
        "ansible_connection",
        "choice",
        "ssh, or local: the controller itself is this host.",
        default="ssh",
        choices=("ssh", "smart", "local"),
    ),
    Var("ansible_become", "bool", "Run commands as root through sudo when the login is not root.", default=False),
    Var("ansible_become_user", "choice", "Whom become runs as: root only.", default="root", choices=("root",)),
    Var(
        "ansible_become_method",
        "choice",
        "How to become root: only sudo is supported.",
        default="sudo",
        choices=("sudo",),
    ),
    Var("ansible_become_password", "string", "The sudo password of the login, when sudo asks one.", secret=True),
    Var("ansible_become_pass", "string", "Ansible's other name for ansible_become_password.", secret=True),
    Var("ansible_sudo_pass", "string", "Ansible's old name for ansible_become_password.", secret=True),
    Var("ansible_ssh_private_key_file", "file", "The private key file to log in with (else ssh-agent, ~/.ssh/id_*)."),
    Var("ansible_private_key_file", "file", "Ansible's other name for ansible_ssh_private_key_file."),
    Var("ansible_ssh_timeout", "seconds", "Seconds to wait for the TCP connect to the host.", default=10),
    Var("ansible_timeout", "seconds", "Ansible's other name for ansible_ssh_timeout.", default=10),
    Var(
        "ansible_python_interpreter",
        "ignored",
        "Ansible's only: tunnelspec runs no Ansible module on the hosts; accepted so an Ansible inventory works.",
    ),
    Var(
        "ansible_ssh_common_args",
        "ssh_args",
        "ssh arguments: a jump host (-J, ProxyJump, ProxyCommand 'ssh -W'), ConnectTimeout, ServerAlive*; "
        "others refused (docs/hosts.md).",
    ),
    Var("ansible_ssh_extra_args", "ssh_args", "More ssh arguments, read as ansible_ssh_common_args."),
    Var("ansible_password", "refused", "A login password.", secret=True, reason=_KEYS_ONLY),
    Var("ansible_ssh_pass", "refused", "A login password.", secret=True, reason=_KEYS_ONLY),
    Var("ansible_ssh_host", "refused", "Old spelling of ansible_host.", reason=_old("ansible_host")),
    Var("ansible_ssh_port", "refused", "Old spelling of ansible_port.", reason=_old("ansible_port")),
    Var("ansible_ssh_user", "refused", "Old spelling of ansible_user.", reason=_old("ansible_user")),
)
