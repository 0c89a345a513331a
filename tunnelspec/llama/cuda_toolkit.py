"""What a tree's CUDA backend needs from the host's CUDA toolkit, read from the tree itself (no build).

ggml-cuda's CMakeLists.txt states no minimum toolkit for the backend as a whole (b9093 and b11434:
`cmake_minimum_required(VERSION 3.18)` is CMake's, and the sources carry fallbacks for CUDA before
11.2). What it does state is per GPU architecture, where it builds its default architecture list:

    # 89     == RTX 4000, needs CUDA v11.8
    if (CUDAToolkit_VERSION VERSION_LESS "13")
        list(APPEND CMAKE_CUDA_ARCHITECTURES 50-virtual 61-virtual 70-virtual)
    endif ()
    if (CUDAToolkit_VERSION VERSION_GREATER_EQUAL "11.8")
        list(APPEND CMAKE_CUDA_ARCHITECTURES 89-real 90-virtual)

tunnelspec builds for explicit architectures (the GPUs nvidia-smi reports, or the inventory's), so
the tree's default list is never built — but its statements are what the tree's authors know about
each architecture and toolkit: an architecture the host's nvcc is too old for (an RTX 4090, 8.9,
with Ubuntu 22.04's CUDA 11.5) or too new for (a Pascal GPU, 6.1, with CUDA 13) is refused before
cmake configures, naming both versions and the tree's line. An architecture the tree says nothing
about is not judged here (nvcc itself then answers at configure time)."""

from __future__ import annotations

import re
from dataclasses import dataclass


def parse_nvcc(text: str) -> tuple[int, ...] | None:
    """The toolkit release `nvcc --version` reports ("Cuda compilation tools, release 12.4, V12.4.131");
    the one parser of that line (the host facts read it too)."""
    m = re.search(r"release (\d+)\.(\d+)", text or "")
    return tuple(int(g) for g in m.groups()) if m else None


CMAKELISTS = "ggml/src/ggml-cuda/CMakeLists.txt"

_NEEDS_COMMENT = re.compile(r"#\s*(\d+)\s*==\s*[^#]*?\bneeds CUDA v?(\d+(?:\.\d+)?)", re.I)
_GUARD = re.compile(
    r'^\s*if\s*\(\s*CUDAToolkit_VERSION\s+VERSION_(GREATER_EQUAL|LESS)\s+"?(\d+(?:\.\d+)?)"?\s*\)\s*$', re.I
)
_IF = re.compile(r"^\s*if\s*\(", re.I)
_ELSE = re.compile(r"^\s*else(if)?\s*\(", re.I)
_ENDIF = re.compile(r"^\s*endif\s*\(", re.I)
_APPEND = re.compile(r"^\s*list\s*\(\s*APPEND\s+CMAKE_CUDA_ARCHITECTURES\s+([^)]*)\)", re.I)
_ARCH = re.compile(r"^(\d+)[af]?(?:-real|-virtual)?$")


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _s(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


@dataclass(frozen=True)
class ArchRule:
    """The tree builds `arch` only with a toolkit `op` `version` (op: ">=" or "<"), per line `line`."""

    arch: int
    op: str
    version: tuple[int, ...]
    line: int
    text: str

    def allows(self, nvcc: tuple[int, ...]) -> bool:
        return nvcc >= self.version if self.op == ">=" else nvcc < self.version

    def where(self) -> str:
        return f"{CMAKELISTS}:{self.line}: {self.text}"


def tree_rules(cmake_text: str) -> list[ArchRule]:
    """The tree's statements about architectures and toolkits, in file order: its "NN == …, needs CUDA
    vX" comments and its `if (CUDAToolkit_VERSION VERSION_GREATER_EQUAL|VERSION_LESS "X")` guards
    around `list(APPEND CMAKE_CUDA_ARCHITECTURES …)`. An `else()` branch is not inverted: nothing in
    it is judged."""
    rules: list[ArchRule] = []
    stack: list[tuple[str, tuple[int, ...], int, str] | None] = []
    for n, raw in enumerate(cmake_text.splitlines(), 1):
        line = " ".join(raw.split())
        m = _NEEDS_COMMENT.search(line)
        if m and line.startswith("#"):
            rules.append(ArchRule(int(m.group(1)), ">=", _v(m.group(2)), n, line))
            continue
        code = line.split("#", 1)[0]
        if g := _GUARD.match(code):
            op = ">=" if g.group(1).upper() == "GREATER_EQUAL" else "<"
            stack.append((op, _v(g.group(2)), n, code.strip()))
        elif _IF.match(code):
            stack.append(None)
        elif _ELSE.match(code):
            if stack:
                stack[-1] = None
        elif _ENDIF.match(code):
            if stack:
                stack.pop()
        elif a := _APPEND.match(code):
            guard = next((s for s in reversed(stack) if s is not None), None)
            if guard is None:
                continue
            op, version, gline, gtext = guard
            for token in a.group(1).split():
                am = _ARCH.match(token)
                if am:
                    rules.append(ArchRule(int(am.group(1)), op, version, gline, f"{gtext} around {code.strip()}"))
    return rules


def architectures(value: str) -> list[int]:
    """The numbered architectures of a CMAKE_CUDA_ARCHITECTURES value (`86;89`, `120a-real`, `90a`);
    `native`, `all` and `all-major` name none (nothing to judge before nvcc resolves them)."""
    out = []
    for token in re.split(r"[;,\s]+", value or ""):
        m = _ARCH.match(token.strip())
        if m and int(m.group(1)) not in out:
            out.append(int(m.group(1)))
    return out


def refusal(
    host: str, nvcc: tuple[int, ...] | None, nvcc_text: str, archs: str, cmake_text: str, where: str
) -> str | None:
    """Why the host's nvcc cannot build this tree for these architectures, or None. `where` names the
    tree (its path and commit) for the message."""
    if nvcc is None:
        return None
    rules = tree_rules(cmake_text)
    for arch in architectures(archs):
        failed = [r for r in rules if r.arch == arch and not r.allows(nvcc)]
        if not failed:
            continue
        said = f"nvcc {_s(nvcc)}" + (f" ({nvcc_text.strip()})" if nvcc_text.strip() else "")
        floors = [r.version for r in failed if r.op == ">="]
        if floors:
            v = _s(max(floors))
            need = f"CUDA {v} or newer"
            todo = (
                f"install CUDA toolkit {v} or newer (NVIDIA's) and put its nvcc first on the PATH, or set "
                "llama_cuda_architectures to an older architecture this toolkit has"
            )
        else:
            v = _s(min(r.version for r in failed))
            need = f"a CUDA toolkit older than {v}"
            todo = (
                f"install a CUDA toolkit older than {v} (NVIDIA's) and put its nvcc first on the PATH, or "
                "build this node for another backend (vulkan)"
            )
        return (
            f"{host}: {said} cannot build {where} for CUDA architecture {arch}: the tree builds {arch} with "
            f"{need} only ({'; '.join(r.where() for r in failed)}). What to do: {todo}"
        )
    return None
