"""What each host needs before tunnelspec can build and run llama.cpp there: one table, decided from
the host's facts (facts/host.py) and its role in the cluster.

Every entry names what is looked for (a command on the host, or a header file), the package that
brings it per package manager, and why it is needed. The deploy's first plays use it (components/host/host.py):
read-only before the run lock (what is missing, and whether it can be installed), then the install
itself. The README's "What each host needs" is rendered from this table (`markdown_table`), and a
test fails when the two differ. The lab's package repository holds every apt package named here
(`apt_packages_all`), so a lab host starts bare and the deploy installs its toolchain.

A GPU backend also needs its runtime — the driver — which tunnelspec never installs (`RUNTIME`):
looked for in the same preflight, before anything is checked out or built, and named with the host
and what brings it. A missing NVIDIA driver is refused (the CUDA build reads the GPUs' architecture
from nvidia-smi and cannot start without it); a missing Vulkan or ROCm driver is a warning, because
it may be installed before the RPC server starts, and the rpc play's check of what the started
server serves ("serves CPU only") is what refuses such a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from tunnelspec.facts.host import DEVICE_FILES, FILES, FIXED, VULKAN_ICD_DIRS, HostFacts

# Package managers tunnelspec installs with. Elsewhere a preflight names what is missing and stops.
INSTALLERS = ("apt-get",)


@dataclass(frozen=True)
class Need:
    """Context a requirement is decided on (one host of one cluster)."""

    role: str  # "main" or "rpc"
    backend: str  # llama_backend of this host: cpu, cuda, hip, vulkan, metal
    isolation: bool  # rpc_local_isolation
    https_repo: bool  # llama_repo is fetched over https (CA certificates needed)


@dataclass(frozen=True)
class Prereq:
    what: str  # a command name, or an absolute path of a file
    apt: str | None  # the Debian/Ubuntu package bringing it (None: not installable by us)
    why: str
    when: Callable[[Need], bool] = lambda n: True
    when_text: str = "every host"

    @property
    def is_file(self) -> bool:
        return self.what.startswith("/")

    def present(self, facts: HostFacts) -> bool:
        return self.what in facts.files if self.is_file else self.what in facts.tools


def _main(n: Need) -> bool:
    return n.role == "main"


def _rpc(n: Need) -> bool:
    return n.role == "rpc"


TABLE: tuple[Prereq, ...] = (
    Prereq("git", "git", "checks out the pinned llama.cpp commit and applies the patch stack"),
    Prereq("cmake", "cmake", "configures the llama.cpp build"),
    Prereq("make", "make", "runs the build cmake generates"),
    Prereq("g++", "g++", "compiles llama.cpp (C++17)"),
    Prereq("ccache", "ccache", "makes rebuilds and other hosts' builds of the same tree cheap"),
    Prereq("python3", "python3", "runs the readiness helper before llama-server and the root probe relay"),
    Prereq("flock", "util-linux", "holds the run lock: one run at a time per cluster"),
    Prereq("setpriv", "util-linux", "the tunnel key's forced command ends with its session"),
    Prereq("stdbuf", "coreutils", "line-buffers the RPC server's banner into the journal"),
    Prereq(
        "/etc/ssl/certs/ca-certificates.crt",
        "ca-certificates",
        "git fetches llama_repo over https",
        when=lambda n: n.https_repo,
        when_text="llama_repo is an https URL",
    ),
    Prereq(
        "nft",
        "nftables",
        "the loopback isolation rules (only the tunnel / llama-server may connect)",
        when=lambda n: n.isolation,
        when_text="rpc_local_isolation (default true)",
    ),
    Prereq("ssh", "openssh-client", "the persistent tunnels to the rpc nodes", when=_main, when_text="main"),
    Prereq(
        "haproxy",
        "haproxy",
        "the front of llama-server: holds requests while it restarts or switches between "
        "speculative and degraded, terminates TLS with public bind",
        when=_main,
        when_text="main",
    ),
    Prereq("sshd", "openssh-server", "the tunnel user's restricted login", when=_rpc, when_text="rpc nodes"),
    Prereq(
        "glslc",
        "glslc",
        "compiles ggml's Vulkan shaders",
        when=lambda n: n.backend == "vulkan",
        when_text="llama_backend=vulkan",
    ),
    Prereq(
        "/usr/include/vulkan/vulkan.h",
        "libvulkan-dev",
        "the Vulkan headers and loader for ggml-vulkan",
        when=lambda n: n.backend == "vulkan",
        when_text="llama_backend=vulkan",
    ),
    Prereq(
        "/usr/include/spirv/unified1/spirv.hpp",
        "spirv-headers",
        "the SPIR-V headers ggml-vulkan's build requires (find_package(SPIRV-Headers), b11434)",
        when=lambda n: n.backend == "vulkan",
        when_text="llama_backend=vulkan",
    ),
    Prereq(
        "nvcc",
        None,
        "compiles ggml-cuda (install NVIDIA's CUDA toolkit, on the PATH or in /usr/local/cuda/bin; "
        "a release the tree supports for the GPU's architecture: llama/cuda_toolkit.py)",
        when=lambda n: n.backend == "cuda",
        when_text="llama_backend=cuda",
    ),
    Prereq(
        "hipcc",
        None,
        "compiles ggml-hip (install AMD's ROCm)",
        when=lambda n: n.backend == "hip",
        when_text="llama_backend=hip",
    ),
)

# The facts script looks for each file of the table: a file it does not look for would always be missing.
assert {p.what for p in TABLE if p.is_file} <= set(FILES), "facts/host.py FILES lacks a prerequisite file"


@dataclass(frozen=True)
class Runtime:
    """A GPU backend's runtime on the host (its driver): looked for in preflight, never installed."""

    backend: str
    what: str  # what is looked for, as the README and messages name it
    present: Callable[[HostFacts], bool]
    provides: str  # what brings it (a package, the vendor's driver)
    why: str
    refuse: bool = False  # missing: refused before any build (else a warning)


RUNTIME: tuple[Runtime, ...] = (
    Runtime(
        "cuda",
        "nvidia-smi",
        lambda f: "nvidia-smi" in f.tools,
        "the NVIDIA driver (Debian's non-free `nvidia-driver`, or NVIDIA's packages)",
        "the NVIDIA driver's tool: the CUDA build reads the GPUs' architectures from it and runs on the driver",
        refuse=True,
    ),
    Runtime(
        "vulkan",
        "a Vulkan driver (an ICD manifest in " + ", ".join(VULKAN_ICD_DIRS) + ")",
        lambda f: bool(f.vulkan_icds),
        "`mesa-vulkan-drivers` (AMD, Intel) or the GPU vendor's driver (NVIDIA's brings nvidia_icd.json)",
        "the Vulkan device ggml-vulkan serves; without one the node serves the CPU only",
    ),
    Runtime(
        "hip",
        "/dev/kfd",
        lambda f: "/dev/kfd" in f.files,
        "the amdgpu kernel driver (in Debian's and Ubuntu's kernels; AMD's amdgpu-dkms)",
        "ROCm's compute device node; without it ggml-hip finds no GPU",
    ),
    Runtime(
        "hip",
        "rocminfo",
        lambda f: "rocminfo" in f.tools or "/opt/rocm/bin/rocminfo" in f.files,
        "ROCm's runtime (`rocminfo`, which comes with it; Debian 12+ packages it, or AMD's ROCm)",
        "ROCm's runtime (HSA), which ggml-hip opens the GPU with",
    ),
)
assert {"/dev/kfd", "/opt/rocm/bin/rocminfo"} <= set(DEVICE_FILES), "facts/host.py DEVICE_FILES lacks a path"


def runtime_findings(backend: str, facts: HostFacts) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for the host's GPU runtime, each a sentence to follow "<host>: "."""
    refused: list[str] = []
    warned: list[str] = []
    if backend == "metal" and facts.is_linux:
        refused.append(
            "llama_backend=metal, but Metal exists on macOS only (Apple GPUs): on this Linux host "
            "set llama_backend to cuda, hip, vulkan or cpu"
        )
    for r in RUNTIME:
        if r.backend != backend or r.present(facts):
            continue
        provides = r.provides.replace("`", "")
        if r.refuse:
            refused.append(
                f"llama_backend={backend} but {r.what} is not installed ({r.why}). Install {provides}; "
                "tunnelspec never installs a GPU driver"
            )
        else:
            warned.append(
                f"llama_backend={backend} but {r.what} was not found ({r.why}). Install {provides} "
                "(tunnelspec never installs a GPU driver); an RPC node without it is refused once its "
                'server starts ("serves CPU only")'
            )
    return refused, warned


# Tools that tunnelspec's units and the tunnel key's forced command run by absolute path.
FIXED_PATHS = {
    "python3": "/usr/bin/python3",
    "setpriv": "/usr/bin/setpriv",
    "stdbuf": "/usr/bin/stdbuf",
    "sshd": "/usr/sbin/sshd",
    "nft": "/usr/sbin/nft",
    "haproxy": "/usr/sbin/haproxy",
}
assert set(FIXED_PATHS.values()) <= set(FIXED), "facts/host.py FIXED lacks a path"


def misplaced(need: Need, facts: HostFacts) -> list[str]:
    """Needed tools that are there but not where tunnelspec runs them from (a host whose python3 is
    only /usr/local/bin/python3, say): each a sentence naming both paths."""
    out = []
    for p in needed(need):
        path = FIXED_PATHS.get(p.what)
        if path and p.present(facts) and path not in facts.files:
            out.append(f"{p.what} is {facts.tools[p.what]}, but tunnelspec runs {path} (install {p.apt})")
    return out


def needed(need: Need) -> list[Prereq]:
    return [p for p in TABLE if p.when(need)]


def missing(need: Need, facts: HostFacts) -> list[Prereq]:
    return [p for p in needed(need) if not p.present(facts)]


def packages(prereqs: list[Prereq]) -> list[str]:
    """The apt packages for these, each once, in table order."""
    out: list[str] = []
    for p in prereqs:
        if p.apt and p.apt not in out:
            out.append(p.apt)
    return out


def apt_packages_all() -> list[str]:
    return packages(list(TABLE))


def markdown_table() -> str:
    """The README's "What each host needs" (tests/hosts/test_facts_prereqs.py keeps them equal)."""
    rows = ["| needs | on | Debian/Ubuntu package | why |", "|---|---|---|---|"]
    for p in TABLE:
        rows.append(
            f"| `{p.what}` | {p.when_text} | {('`' + p.apt + '`') if p.apt else '(not packaged: install it yourself)'} "
            f"| {p.why} |"
        )
    for r in RUNTIME:
        what = f"`{r.what}`" if " " not in r.what else r.what
        missing = "refused before any build" if r.refuse else "a warning before any build"
        rows.append(
            f"| {what} | llama_backend={r.backend} | (a driver, never installed by tunnelspec) {r.provides} "
            f"| {r.why} (missing: {missing}) |"
        )
    rows.append(
        "| macOS | llama_backend=metal | (none) | Metal exists on macOS only, where tunnelspec does not deploy: "
        "refused on a Linux host |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
