"""What a host is: OS and release, kernel, init, OpenSSH, package manager, CPU, free disk, the
tools tunnelspec runs and where they live, a GPU backend's runtime (Vulkan drivers' manifests,
/dev/kfd, nvcc's release), and what the login may do through sudo.

One read-only fact (`host_facts(build_root)`: a POSIX sh script that runs on Linux and macOS alike, as the
login user: no become, so a host whose sudo is broken still tells what it is) and its pure parser
(`parse_facts`). Gathered once per run per host (components/host/host.py); everything version-dependent on a
host is decided from these facts, never assumed. The script computes a key of the binaries its version
commands run and skips those commands when the controller already holds that key (`versions_of` reads what it
said; the controller's lines stand in: components/host/facts_cache.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from tunnelspec.facts.fact import Fact
from tunnelspec.llama.cuda_toolkit import parse_nvcc

# Commands whose presence and path matter to some task; `command -v` on each, in one round trip.
TOOLS = (
    "apt-get",
    "dnf",
    "yum",
    "zypper",
    "pacman",
    "apk",
    "brew",
    "git",
    "cmake",
    "make",
    "cc",
    "c++",
    "gcc",
    "g++",
    "ccache",
    "python3",
    "ssh",
    "sshd",
    "nft",
    "flock",
    "setpriv",
    "stdbuf",
    "nologin",
    "sudo",
    "systemctl",
    "useradd",
    "glslc",
    "nvcc",
    "hipcc",
    "nvidia-smi",
    "vulkaninfo",
    "rocminfo",
    "haproxy",
)
# Headers a build needs (their -dev packages carry no command to look for).
FILES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/usr/include/openssl/ssl.h",
    "/usr/include/vulkan/vulkan.h",
    "/usr/include/spirv/unified1/spirv.hpp",
)
# Where tunnelspec's unit files and the tunnel key's forced command name these tools: the absolute
# paths every Debian and Ubuntu release puts them at (`prereqs.FIXED_PATHS` checks them).
FIXED = (
    "/usr/bin/python3",
    "/usr/bin/setpriv",
    "/usr/bin/stdbuf",
    "/usr/sbin/sshd",
    "/usr/sbin/nft",
    "/usr/sbin/nologin",
    "/usr/sbin/haproxy",
)
# Where sshd and nologin live when not on the login's PATH (a sudoer's PATH often lacks /usr/sbin), and
# where NVIDIA's own CUDA installer puts nvcc (never on a non-interactive PATH; the build then names it
# to CMake: build_plan.cuda_compiler_options).
SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin"
CUDA_BIN = "/usr/local/cuda/bin"
# A GPU backend's runtime, looked for before any build (prereqs.RUNTIME decides what is missing):
# the Vulkan loader reads its drivers' manifests (ICDs) from these directories; ROCm's kernel
# driver makes /dev/kfd, and AMD's packages put rocminfo in /opt/rocm/bin, off the PATH.
VULKAN_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
DEVICE_FILES = ("/dev/kfd", "/opt/rocm/bin/rocminfo")
PACKAGE_MANAGERS = ("apt-get", "dnf", "yum", "zypper", "pacman", "apk", "brew")

# The version commands whose lines the controller may keep (components/host/facts_cache.py), and
# the keys of the lines they print.
VERSION_TOOLS = ("systemctl", "sshd", "ssh", "gcc", "cmake", "nvcc")
VERSION_LINES = ("systemd", "nvcc", "sshd_version", "ssh_version", "gcc", "cmake")

# $1: the directory whose file system holds builds (its nearest existing parent is measured).
# $2: the versions key the controller holds for this host ("": none).
# It runs on every host of every run, so it forks little: `command -v`, `read`, `case` and parameter
# expansion are the shell's own; a command's output is cut in the shell (no grep, head, sed or awk),
# and `say` forks (a subshell and `tr`) only for a value of several lines.
# The versions key: GNU `stat` of the version tools as `command -v` finds them, links resolved
# (`readlink -f`: real path, inode, size, mtime, ctime; an upgrade or an alternatives switch changes
# it), a marker for each one not found. Empty where stat cannot tell (macOS, busybox), and where a
# tool is a dispatcher whose own file says nothing of the version it runs: a real file not named for
# the tool (snap, a ccache masquerade, mise) or a version manager's shim; or found through a relative
# PATH entry. When the key equals $2, the version commands are not run (`versions_cached=yes`): the
# controller adds the lines it kept.
_SCRIPT = r"""
PATH="$PATH:__SBIN__:__CUDA_BIN__"; export PATH LC_ALL=C
root=$1 held=${2-}
nl='
'
say() { case $2 in *"$nl"*) printf '%s=%s\n' "$1" "$(printf '%s' "$2" | tr '\n' ' ')" ;; *) printf '%s=%s\n' "$1" "$2" ;; esac; }
pick() { l=; set -f; IFS=$nl; for x in $2; do case $x in *"$1"*) l=$x; break ;; esac; done; unset IFS; set +f; }
ossh() { o=; t=$1; while :; do case $t in *OpenSSH_[0-9]*) t=${t#*OpenSSH_}; case $t in [0-9]*) o=OpenSSH_${t%%[!0-9.p]*}; return ;; esac ;; *) return ;; esac; done; }
u=$(uname -s -r -m 2>/dev/null); set -f; set -- $u; set +f
if [ $# -eq 3 ]; then say system "$1"; say kernel "$2"; say arch "$3"
else say system "$(uname -s 2>/dev/null)"; say kernel "$(uname -r 2>/dev/null)"; say arch "$(uname -m 2>/dev/null)"; fi
i=$(id 2>/dev/null); i=${i%% *}
case $i in
  uid=[0-9]*"("*")") uid=${i#uid=}; uid=${uid%%"("*}; user=${i#*"("}; user=${user%")"} ;;
  *) uid=$(id -u 2>/dev/null); user=$(id -un 2>/dev/null) ;;
esac
say uid "$uid"; say user "$user"
if [ -r /etc/os-release ]; then
  while IFS= read -r l || [ -n "$l" ]; do
    case $l in ID=*|VERSION_ID=*|VERSION_CODENAME=*|PRETTY_NAME=*|ID_LIKE=*) printf 'os_%s\n' "$l" ;; esac
  done </etc/os-release
fi
command -v sw_vers >/dev/null 2>&1 && say macos "$(sw_vers -productVersion 2>/dev/null)"
v=; [ -r /proc/1/comm ] && read -r v </proc/1/comm; say init "$v"
[ -d /run/systemd/system ] && say systemd_booted yes
for t in __TOOLS__; do printf 'tool:%s=' "$t"; command -v "$t" 2>/dev/null || echo; done
for f in __FILES__; do [ -e "$f" ] && say "file:$f" yes; done
for d in __ICD_DIRS__; do for f in "$d"/*.json; do [ -e "$f" ] && say "icd:$f" yes; done; done
v=$(for t in __VERSION_TOOLS__; do command -v "$t" 2>/dev/null || echo "$t:none"; done)
set -f; IFS=$nl; set -- $v; unset IFS; set +f
ok=1; vm=; for p do shift; case $p in /*) set -- "$@" "$p" ;; *:none) vm="$vm$p;" ;; *) ok= ;; esac; done
vk=; n=$#
if [ $n -gt 0 ] && [ -n "$ok" ] && v=$(readlink -f -- "$@" 2>/dev/null); then
  set -f; IFS=$nl; c=0
  for r in $v; do
    c=$((c + 1)); [ $c -gt $n ] && { ok=; break; }
    t=${1##*/}; shift; set -- "$@" "$r"
    case ${r##*/} in *"$t"*) ;; *) ok= ;; esac
    case $r in */shims/*) ok= ;; esac
  done
  unset IFS; set +f
  [ -n "$ok" ] && [ $c -eq $n ] && vk=$(stat --printf '%n:%i:%s:%.9Y:%.9Z;' -- "$@" 2>/dev/null) && vk=$vm$vk || vk=
fi
if [ -n "$vk" ] && [ "$vk" = "$held" ]; then say versions_cached yes
else
  if command -v systemctl >/dev/null 2>&1; then v=$(systemctl --version 2>/dev/null); say systemd "${v%%"$nl"*}"; fi
  if command -v nvcc >/dev/null 2>&1; then pick release "$(nvcc --version 2>/dev/null)"; say nvcc "$l"; fi
  v=; command -v sshd >/dev/null 2>&1 && v=$(sshd -V 2>&1); ossh "$v"; say sshd_version "$o"
  v=; command -v ssh >/dev/null 2>&1 && v=$(ssh -V 2>&1); ossh "$v"; say ssh_version "$o"
  command -v gcc >/dev/null 2>&1 && say gcc "$(gcc -dumpfullversion -dumpversion 2>/dev/null)"
  if command -v cmake >/dev/null 2>&1; then v=$(cmake --version 2>/dev/null); say cmake "${v%%"$nl"*}"; fi
fi
say versions_key "$vk"
d=$root; while [ ! -d "$d" ] && [ "$d" != / ]; do case $d in */*) d=${d%/*}; d=${d:-/} ;; *) d=. ;; esac; done
say disk_dir "$d"
v=$(df -Pk -- "$d" 2>/dev/null); case $v in *"$nl"*) v=${v#*"$nl"}; v=${v%%"$nl"*} ;; *) v= ;; esac
set -f; set -- $v; set +f; say disk_free_kb "${4-}"
say nproc "$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)"
v=; if [ -r /proc/meminfo ]; then while read -r k m _; do [ "$k" = MemTotal: ] && { v=$m; break; }; done </proc/meminfo; fi
say mem_kb "$v"
if [ "$uid" != 0 ] && command -v sudo >/dev/null 2>&1; then
  out=$(sudo -k -n true 2>&1 </dev/null); rc=$?
  say sudo_nopasswd_rc "$rc"
  say sudo_nopasswd_msg "$out"
fi
exit 0
"""

SCRIPT = (
    _SCRIPT.replace("__SBIN__", SBIN_DIRS)
    .replace("__CUDA_BIN__", CUDA_BIN)
    .replace("__TOOLS__", " ".join(TOOLS))
    .replace("__FILES__", " ".join(FILES + FIXED + DEVICE_FILES))
    .replace("__ICD_DIRS__", " ".join(VULKAN_ICD_DIRS))
    .replace("__VERSION_TOOLS__", " ".join(VERSION_TOOLS))
)


_VERSIONS = ("openssh", "gcc", "cmake", "nvcc")  # version tuples, "1.2.3" strings in the dict form


def _version(text: str, pattern: str = r"(\d+)\.(\d+)(?:\.(\d+))?") -> tuple[int, ...] | None:
    m = re.search(pattern, text or "")
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


@dataclass(frozen=True)
class HostFacts:
    system: str = ""  # uname -s: Linux, Darwin, ...
    kernel: str = ""
    arch: str = ""
    uid: int | None = None
    user: str = ""
    os_id: str = ""  # debian, ubuntu, ... (os-release ID)
    os_like: str = ""
    os_version: str = ""  # VERSION_ID: 12, 24.04
    os_codename: str = ""
    os_pretty: str = ""
    macos: str = ""  # sw_vers -productVersion on a Mac
    init: str = ""  # PID 1's name (systemd, init, sh, sshd, ...)
    systemd_booted: bool = False  # /run/systemd/system exists: systemd is the running manager
    systemd_version: int | None = None
    openssh: tuple[int, ...] | None = None  # sshd's version (the server), else ssh's
    openssh_text: str = ""
    gcc: tuple[int, ...] | None = None
    cmake: tuple[int, ...] | None = None
    nvcc: tuple[int, ...] | None = None  # the CUDA toolkit's release (nvcc --version: "release 12.4")
    nvcc_text: str = ""  # nvcc's own line, for messages
    package_manager: str | None = None
    disk_dir: str = ""
    disk_free_kb: int | None = None
    nproc: int | None = None
    mem_kb: int | None = None
    tools: dict = field(default_factory=dict)  # command -> path, for the TOOLS found
    files: tuple = ()  # the FILES present
    vulkan_icds: tuple = ()  # Vulkan driver manifests in VULKAN_ICD_DIRS
    sudo_nopasswd: bool | None = None  # `sudo -n true` worked (None: root, or no sudo)
    sudo_msg: str = ""

    # ---- derived --------------------------------------------------------------------------
    @property
    def is_linux(self) -> bool:
        return self.system == "Linux"

    @property
    def has_systemd(self) -> bool:
        return self.init == "systemd" and self.systemd_booted

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    @property
    def sshd_session_name(self) -> str:
        """The per-connection process name: `sshd-session` since OpenSSH 9.8."""
        return "sshd-session" if self.openssh and self.openssh >= (9, 8) else "sshd"

    def describe_os(self) -> str:
        if self.system == "Darwin":
            return f"macOS {self.macos}".strip()
        if self.os_pretty:
            return self.os_pretty
        return f"{self.system} {self.kernel}".strip() or "unknown"

    def summary(self) -> str:
        """One line for status and logs."""
        parts = [
            self.describe_os(),
            f"kernel {self.kernel}" if self.kernel else "",
            self.arch,
            f"systemd {self.systemd_version}"
            if self.has_systemd and self.systemd_version
            else f"init {self.init or '?'}",
            f"OpenSSH {'.'.join(map(str, self.openssh))}" if self.openssh else "",
            f"gcc {'.'.join(map(str, self.gcc))}" if self.gcc else "",
            f"cmake {'.'.join(map(str, self.cmake))}" if self.cmake else "",
            f"CUDA {'.'.join(map(str, self.nvcc))}" if self.nvcc else "",
            self.package_manager or "no known package manager",
            f"{self.disk_free_kb // 1024 // 1024} GiB free in {self.disk_dir}" if self.disk_free_kb is not None else "",
        ]
        return ", ".join(p for p in parts if p)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in _VERSIONS:
            d[k] = ".".join(map(str, d[k])) if d[k] else None
        return d


def parse_facts(text: str) -> HostFacts:
    raw: dict[str, str] = {}
    tools: dict[str, str] = {}
    files: list[str] = []
    icds: list[str] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if key.startswith("tool:"):
            if value.startswith("/"):  # `command -v` of a shell builtin or alias is no path
                tools[key[5:]] = value
            continue
        if key.startswith("file:"):
            files.append(key[5:])
            continue
        if key.startswith("icd:"):
            icds.append(key[4:])
            continue
        if key.startswith("os_"):
            value = value.strip('"').strip("'")
        raw[key] = value

    def num(key):
        v = raw.get(key, "")
        return int(v) if v.isdigit() else None

    systemd = _version(raw.get("systemd", ""), r"systemd (\d+)")
    ssh_text = raw.get("sshd_version") or raw.get("ssh_version") or ""
    sudo_rc = raw.get("sudo_nopasswd_rc")
    return HostFacts(
        system=raw.get("system", ""),
        kernel=raw.get("kernel", ""),
        arch=raw.get("arch", ""),
        uid=num("uid"),
        user=raw.get("user", ""),
        os_id=raw.get("os_ID", ""),
        os_like=raw.get("os_ID_LIKE", ""),
        os_version=raw.get("os_VERSION_ID", ""),
        os_codename=raw.get("os_VERSION_CODENAME", ""),
        os_pretty=raw.get("os_PRETTY_NAME", ""),
        macos=raw.get("macos", ""),
        init=raw.get("init", ""),
        systemd_booted=raw.get("systemd_booted") == "yes",
        systemd_version=systemd[0] if systemd else None,
        openssh=_version(ssh_text, r"OpenSSH_(\d+)\.(\d+)"),
        openssh_text=ssh_text,
        gcc=_version(raw.get("gcc", "")),
        cmake=_version(raw.get("cmake", "")),
        nvcc=parse_nvcc(raw.get("nvcc", "")),
        nvcc_text=raw.get("nvcc", ""),
        package_manager=next((p for p in PACKAGE_MANAGERS if p in tools), None),
        disk_dir=raw.get("disk_dir", ""),
        disk_free_kb=num("disk_free_kb"),
        nproc=num("nproc"),
        mem_kb=num("mem_kb"),
        tools=tools,
        files=tuple(files),
        vulkan_icds=tuple(icds),
        sudo_nopasswd=None if sudo_rc is None else sudo_rc == "0",
        sudo_msg=raw.get("sudo_nopasswd_msg", ""),
    )


def host_facts(build_root: str, versions_key: str = "") -> Fact[HostFacts]:
    """What the host is; `build_root`: the directory whose file system holds builds; `versions_key`:
    the key of the version lines the controller kept for this host ("": none, the commands run)."""
    return Fact(["sh", "-c", SCRIPT, "sh", build_root, versions_key], parse_facts)


@dataclass(frozen=True)
class Versions:
    """What the script said about its version commands: the host's key (empty: none to keep),
    whether it skipped the commands because the key was the one it was given, and their lines."""

    key: str
    cached: bool
    lines: tuple[str, ...]


def versions_of(text: str) -> Versions:
    key, cached, lines = "", False, []
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if not sep:
            continue
        if name == "versions_key":
            key = value.strip()
        elif name == "versions_cached":
            cached = value.strip() == "yes"
        elif name in VERSION_LINES:
            lines.append(line)
    return Versions(key, cached, tuple(lines))


def facts_from_dict(d: dict) -> HostFacts:
    """The inverse of `HostFacts.to_dict` (facts travel between tasks as registered dicts)."""
    d = dict(d)
    for k in _VERSIONS:
        d[k] = tuple(int(x) for x in d[k].split(".")) if d.get(k) else None
    for k in ("files", "vulkan_icds"):
        d[k] = tuple(d.get(k) or ())
    known = set(HostFacts.__dataclass_fields__)
    return HostFacts(**{k: v for k, v in d.items() if k in known})
