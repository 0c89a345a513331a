"""The lab's Debian images, one per release: built once with debootstrap, customised, cached by
content key, each with the package repository its hosts install from.

An image holds what a freshly installed server has (systemd, openssh-server, sudo) and no build
toolchain: every lab deploy installs its prerequisites (components/host/prereqs.py) the way it does on a user's
bare host. Lab hosts have no route out, so the packages come from a repository served on the lab
bridge's own address (lab/aptrepo.py): the very files of Debian's archive — its signed `InRelease`,
its `Packages` index and the `.deb`s the prerequisites need — fetched once when the image is built,
so apt on the hosts verifies Debian's signature and every hash as it would against a mirror.

The key hashes the release, the package lists and the customisation, so changing any of them builds
a new image; an unchanged key reuses `/var/cache/tunnelspec/image-<key>.tar.zst` (and its repo
`/var/cache/tunnelspec/apt/<key>`) and the unpacked tree.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from collections.abc import Callable

from tunnelspec.core.errors import LabError
from tunnelspec.components.host import prereqs
from tunnelspec.lab import aptrepo

CACHE_DIR = Path("/var/cache/tunnelspec")
IMAGES_DIR = Path("/var/lib/tunnelspec-lab/images")
REPO_DIR = CACHE_DIR / "apt"
MIRROR = "http://deb.debian.org/debian"
# Debian releases a lab host can run (`lab up --release HOST=CODENAME`): between them they bracket
# the Ubuntu LTS releases (OpenSSH 8.4 / 9.2 / 10.0, systemd 247 / 252 / 257, gcc 10 / 12 / 14).
RELEASES = ("bullseye", "bookworm", "trixie")
DEFAULT_RELEASE = "bookworm"

PACKAGES = (
    # systemd as PID 1 with logind/dbus so `systemctl` over SSH behaves as on a real host
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "dbus-user-session",
    "openssh-server",
    "iproute2",
    "netbase",
    "procps",
    "util-linux",
    "coreutils",
    "sudo",
    "curl",
    "ca-certificates",
)


# What the lab offers beyond the prerequisites: a GPU driver is the user's, never installed by a
# deploy, and the lab's one accelerator is Mesa's lavapipe (a Vulkan device on the CPU), which a
# test installs on the node it makes a Vulkan node, as a user installs their GPU's driver.
LAB_DRIVER_PACKAGES = ("mesa-vulkan-drivers",)


def repo_packages() -> tuple[str, ...]:
    """What the lab's repository offers: every apt package a prerequisite names, and the lab's driver."""
    return tuple(prereqs.apt_packages_all()) + LAB_DRIVER_PACKAGES


# Bump when CUSTOMISE_FILES or _customise() change: it is part of the content key.
CUSTOMISE_VERSION = "5"

# Paths are inside the image. Host keys and machine-id are deliberately absent: every host gets
# its own, written into its overlay before boot.
CUSTOMISE_FILES = {
    "etc/ssh/sshd_config.d/tunnelspec-lab.conf": (
        "# tunnelspec lab: keys only, one pinned ed25519 host key per host\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
    ),
    # Shared ccache, bind-mounted from the controller: content-based compiler check and base_dir=/
    # make hits portable between hosts whose compilers and build paths are identical.
    "etc/ccache.conf": (
        "cache_dir = /var/cache/ccache\ncompiler_check = content\nbase_dir = /\nhash_dir = false\nmax_size = 5G\n"
    ),
    "etc/environment": "CCACHE_DIR=/var/cache/ccache\n",
    "etc/systemd/journald.conf.d/tunnelspec-lab.conf": "[Journal]\nStorage=persistent\n",
    # The lab's repository has no translations; each host's sources.list is written at boot
    # (host.personalise): it names the lab bridge's address.
    "etc/apt/apt.conf.d/99tunnelspec-lab": 'Acquire::Languages "none";\n',
    "etc/apt/sources.list": "",
    # No DNS inside the lab: a name lookup must never leave the machine.
    "etc/resolv.conf": "",
    "etc/hostname": "",
}

MASKED_UNITS = (
    # We configure eth0 ourselves from the controller; networkd must not touch it.
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-networkd-wait-online.service",
    # Need real block devices / hardware that a container does not have.
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "e2scrub_all.service",
    "systemd-firstboot.service",
)


def content_key(release: str = DEFAULT_RELEASE) -> str:
    h = hashlib.sha256()
    h.update("\n".join(sorted(PACKAGES)).encode())
    h.update(b"\0" + "\n".join(sorted(repo_packages())).encode())
    h.update(f"\0{release}\0{CUSTOMISE_VERSION}\0".encode())
    for path in sorted(CUSTOMISE_FILES):
        h.update(f"{path}\0{CUSTOMISE_FILES[path]}\0".encode())
    h.update("\0".join(MASKED_UNITS).encode())
    return h.hexdigest()[:16]


def _run(argv: list[str], what: str) -> None:
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        tail = "\n".join(res.stdout.splitlines()[-20:])
        raise LabError(f"{what} failed (exit {res.returncode}): {' '.join(argv[:3])} ...\n{tail}")


def _customise(root: Path) -> None:
    for key in root.glob("etc/ssh/ssh_host_*"):
        key.unlink()
    for rel in ("etc/machine-id", "var/lib/dbus/machine-id"):
        (root / rel).unlink(missing_ok=True)
    # An empty machine-id file is what systemd treats as "not yet initialised" without running
    # first-boot services; each host's overlay replaces it with its own id anyway.
    (root / "etc/machine-id").write_text("")
    (root / "var/lib/dbus/machine-id").symlink_to("/etc/machine-id")
    for rel, text in CUSTOMISE_FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_text(text)
        path.chmod(0o644)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    _run(["chroot", str(root), "systemctl", "enable", "ssh.service"], "enabling sshd")
    _run(["chroot", str(root), "systemctl", "mask", *MASKED_UNITS], "masking units")
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    # No package lists: the host fetches them from the lab's repository (a 45 MB index saved).
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (root / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)


def release_of(key_dir: Path) -> str:
    """The release an unpacked image was built from (written beside its `.complete` marker)."""
    try:
        return (key_dir / ".release").read_text().strip() or DEFAULT_RELEASE
    except OSError:
        return DEFAULT_RELEASE


def ensure_image(log: Callable[[str], None] = print, release: str = DEFAULT_RELEASE) -> Path:
    """Return the unpacked image directory (lowerdir for the hosts' overlays), building if needed;
    its package repository (`aptrepo.repo_dir(key)`) is there too when this returns."""
    if release not in RELEASES:
        raise LabError(f"unknown release {release!r}: the lab offers {', '.join(RELEASES)}")
    key = content_key(release)
    tarball = CACHE_DIR / f"image-{key}.tar.zst"
    unpacked = IMAGES_DIR / key
    if not aptrepo.is_complete(key) and tarball.exists():
        tarball.unlink()  # image and repository are made together: both again
    if (unpacked / ".complete").exists() and aptrepo.is_complete(key):
        return unpacked
    if unpacked.exists():
        shutil.rmtree(unpacked)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    staging = IMAGES_DIR / f"{key}.partial"
    if staging.exists():
        shutil.rmtree(staging)  # a crashed earlier attempt
    staging.mkdir(mode=0o755)
    if tarball.exists():
        t0 = time.monotonic()
        _run(
            ["tar", "-C", str(staging), "--numeric-owner", "--xattrs", "-I", "zstd -d", "-xpf", str(tarball)],
            "unpacking the cached image",
        )
        log(f"lab: image {key} unpacked from {tarball} in {time.monotonic() - t0:.1f} s")
    else:
        _build(staging, tarball, key, release, log)
    (staging / ".release").write_text(release + "\n")
    (staging / ".complete").write_text(key + "\n")
    staging.rename(unpacked)
    return unpacked


def _build(root: Path, tarball: Path, key: str, release: str, log: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    debs = CACHE_DIR / f"debootstrap-debs-{release}"
    debs.mkdir(parents=True, exist_ok=True)
    log(f"lab: building the {release} image {key} with debootstrap ({len(PACKAGES)} packages) ...")
    # nice: the machine's few cores are shared with builds running at the same time.
    _run(
        [
            "nice",
            "-n",
            "10",
            "debootstrap",
            "--variant=minbase",
            f"--cache-dir={debs}",
            "--include=" + ",".join(PACKAGES),
            release,
            str(root),
            MIRROR,
        ],
        "debootstrap",
    )
    t1 = time.monotonic()
    n = aptrepo.build_repo(root, key, release, repo_packages(), log)
    log(f"lab: {release} package repository: {n} packages for the prerequisites in {time.monotonic() - t1:.0f} s")
    t1 = time.monotonic()
    _customise(root)
    tmp = tarball.with_suffix(".partial")
    # Written to a temp name then renamed, so a crash never leaves a truncated cache entry.
    _run(
        [
            "nice",
            "-n",
            "10",
            "tar",
            "-C",
            str(root),
            "--numeric-owner",
            "--xattrs",
            "--exclude=./.complete",
            "-I",
            "zstd -T0 -3",
            "-cpf",
            str(tmp),
            ".",
        ],
        "archiving the image",
    )
    os.replace(tmp, tarball)
    log(
        f"lab: image {key} built: debootstrap {t1 - t0:.0f} s, customise+archive "
        f"{time.monotonic() - t1:.0f} s -> {tarball}"
    )


def _mounted_lowerdirs() -> set[str]:
    """Image trees under a live overlay mount: the truth, whatever any state file says."""
    used: set[str] = set()
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 3 and fields[2] == "overlay":
                for opt in fields[3].split(","):
                    if opt.startswith("lowerdir="):
                        used.update(Path(p).name for p in opt[len("lowerdir=") :].split(":"))
    return used


def prune_images(keep: set[str], log: Callable[[str], None] = print) -> None:
    """Remove cached images no lab uses any more (each is ≈ 1 GB unpacked + 250 MB archived).

    `.partial` trees are left alone: one may be a build in progress in another process.
    Trees still under an overlay mount are kept even if no state file names them.
    """
    keep = keep | _mounted_lowerdirs()
    for tarball in CACHE_DIR.glob("image-*.tar.zst"):
        if tarball.name[len("image-") : -len(".tar.zst")] not in keep:
            tarball.unlink(missing_ok=True)
            log(f"lab: removed unused image archive {tarball}")
    if REPO_DIR.is_dir():
        for repo in REPO_DIR.iterdir():
            if repo.is_dir() and "." not in repo.name and repo.name not in keep:
                shutil.rmtree(repo, ignore_errors=True)
    if IMAGES_DIR.is_dir():
        for tree in IMAGES_DIR.iterdir():
            if tree.is_dir() and "." not in tree.name and tree.name not in keep:
                shutil.rmtree(tree, ignore_errors=True)
                log(f"lab: removed unused image tree {tree}")
