"""What `lab up` needs from the machine; each miss is a LabError saying what to do."""

from __future__ import annotations

import os
import platform
import shutil

from tunnelspec.core.errors import LabError

APT_LINE = "apt-get install -y systemd-container debootstrap iproute2 zstd"
TOOLS = ("systemd-nspawn", "debootstrap", "ip", "zstd", "nsenter", "mount", "tar", "chroot", "ssh")


def check_platform() -> None:
    if platform.system() != "Linux":
        raise LabError(f"the lab needs Linux (systemd-nspawn); this is {platform.system()}")
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, mounts, bridges): run it with sudo")


def check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise LabError(
            f"missing tools for the lab: {', '.join(missing)}; install them with:\n"
            f"  {APT_LINE} openssh-client util-linux"
        )
