"""Host facts (one command + a pure parser), the refusals decided from them, and the prerequisites
table: facts in, decisions out (pyinfra's fact tests), on outputs captured from real hosts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tunnelspec.components.host import prereqs
from tunnelspec.facts.host import SCRIPT, facts_from_dict, parse_facts
from tunnelspec.components.host.host import refusals

DATA = Path(__file__).parent / "data"


def facts(name: str):
    return parse_facts((DATA / name).read_text())


def test_bookworm_host_parsed():
    f = facts("bookworm-root-toolchain.txt")
    assert (f.system, f.os_id, f.os_version, f.os_codename) == ("Linux", "debian", "12", "bookworm")
    assert f.has_systemd and f.systemd_version == 252
    assert f.openssh == (9, 2) and f.sshd_session_name == "sshd"
    assert f.gcc == (12, 2, 0) and f.cmake == (3, 25, 1)
    assert f.package_manager == "apt-get" and f.is_root
    assert f.tools["nft"] == "/usr/sbin/nft" and f.tools["sshd"] == "/usr/sbin/sshd"
    assert f.disk_free_kb > 0 and f.disk_dir == "/opt/tunnelspec"
    assert refusals(f, become=False, has_password=False, build=True) == []
    # The dict form travels between tasks (registered facts) and back without loss.
    assert facts_from_dict(f.to_dict()) == f


def test_openssh_98_sessions_are_sshd_session():
    text = (DATA / "bookworm-root-toolchain.txt").read_text().replace("OpenSSH_9.2", "OpenSSH_10.0")
    assert parse_facts(text).sshd_session_name == "sshd-session"


def test_mac_is_refused_naming_macos_and_what_works_instead():
    f = facts("macos-14-admin.txt")
    assert f.system == "Darwin" and f.package_manager == "brew" and not f.is_root
    why = refusals(f, become=True, has_password=True, build=True)
    assert len(why) == 1 and "macOS 14.6.1, not Linux" in why[0]
    assert "ggml-rpc-server" in why[0] and "ssh -L" in why[0]


@pytest.mark.parametrize("edit, reason", [
    (lambda t: t.replace("init=systemd", "init=sshd").replace("systemd_booted=yes\n", ""),
     "PID 1 is 'sshd', not systemd"),
    (lambda t: t.replace("tool:flock=/usr/bin/flock\n", ""), "flock not found (package util-linux)"),
    (lambda t: t.replace("gcc=12.2.0", "gcc=8.3.0"), "gcc 8.3.0 is too old for llama.cpp (C++17: gcc >= 9.0)"),
    (lambda t: t.replace("cmake version 3.25.1", "cmake version 3.13.4"), "cmake 3.13.4 is too old"),
    (lambda t: re.sub(r"disk_free_kb=\d+", "disk_free_kb=1048576", t), "1024 MiB free in /opt/tunnelspec"),
])
def test_each_refusal_names_what_was_found(edit, reason):
    f = parse_facts(edit((DATA / "bookworm-root-toolchain.txt").read_text()))
    why = refusals(f, become=False, has_password=False, build=True)
    assert len(why) == 1 and reason in why[0], why


def test_a_non_root_login_needs_working_sudo():
    base = (DATA / "bookworm-root-toolchain.txt").read_text().replace("uid=0", "uid=1000").replace("user=root", "user=ops")
    assert "ansible_become is not set" in refusals(parse_facts(base), become=False, has_password=False, build=True)[0]
    no_sudo = parse_facts(base.replace("tool:sudo=/usr/bin/sudo\n", ""))
    assert "sudo is not installed" in refusals(no_sudo, become=True, has_password=False, build=True)[0]
    asks = parse_facts(base + "sudo_nopasswd_rc=1\nsudo_nopasswd_msg=sudo: a password is required\n")
    why = refusals(asks, become=True, has_password=False, build=True)
    assert "a password is required" in why[0] and "ansible_become_password" in why[0]
    assert refusals(asks, become=True, has_password=True, build=True) == []
    nopw = parse_facts(base + "sudo_nopasswd_rc=0\nsudo_nopasswd_msg=\n")
    assert refusals(nopw, become=True, has_password=False, build=True) == []


def test_the_script_runs_here_and_parses():
    """The same script on this machine (not systemd as PID 1 here): a real run of the real command."""
    out = subprocess.run(["sh", "-c", SCRIPT, "sh", "/nonexistent/tunnelspec"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    f = parse_facts(out.stdout)
    assert f.system == "Linux" and f.tools.get("sh") is None and "flock" in f.tools
    assert f.disk_dir == "/" and f.disk_free_kb > 0
    assert not f.has_systemd and "not systemd" in refusals(f, become=False, has_password=False, build=False)[0]


# ---- the prerequisites table --------------------------------------------------------------------
def _bare(text: str) -> str:
    """A host before the deploy: the toolchain's lines removed from a captured output."""
    drop = ("tool:git=", "tool:cmake=", "tool:make=", "tool:cc=", "tool:c++=", "tool:gcc=", "tool:g++=",
            "tool:ccache=", "tool:python3=", "tool:nft=", "gcc=", "cmake=", "file:/usr/include")
    return "\n".join(l for l in text.splitlines() if not l.startswith(drop))


def test_bare_host_needs_the_toolchain_by_role():
    f = parse_facts(_bare((DATA / "bookworm-root-toolchain.txt").read_text()))
    rpc = prereqs.Need(role="rpc", backend="cpu", isolation=True, https_repo=False)
    main = prereqs.Need(role="main", backend="cpu", isolation=True, https_repo=False)
    assert prereqs.packages(prereqs.missing(rpc, f)) == ["git", "cmake", "make", "g++", "ccache", "python3", "nftables"]
    main_pk = prereqs.packages(prereqs.missing(main, f))
    assert main_pk[-1] == "haproxy"  # the front of llama-server: main only (the rpc list above has none)
    vulkan = prereqs.Need(role="rpc", backend="vulkan", isolation=False, https_repo=True)
    pk = prereqs.packages(prereqs.missing(vulkan, f))
    assert "glslc" in pk and "libvulkan-dev" in pk and "nftables" not in pk
    cuda = prereqs.Need(role="rpc", backend="cuda", isolation=True, https_repo=False)
    assert [p.what for p in prereqs.missing(cuda, f) if p.apt is None] == ["nvcc"]


def test_readme_lists_what_each_host_needs_from_the_table():
    """The README's "What each host needs" is the table, rendered: it cannot drift from the code."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert prereqs.markdown_table() in readme, "README.md: paste the output of `python -m tunnelspec.components.host.prereqs`"


@pytest.mark.parametrize("capture, version, codename, systemd, openssh, session", [
    ("bullseye-ops-bare.txt", "11", "bullseye", 247, (8, 4), "sshd"),
    ("bookworm-ops-bare.txt", "12", "bookworm", 252, (9, 2), "sshd"),
    ("trixie-ops-bare.txt", "13", "trixie", 257, (10, 0), "sshd-session"),
])
def test_bare_hosts_of_three_releases_as_a_sudoer(capture, version, codename, systemd, openssh, session):
    """Captured from the lab's bare images (`lab up --release … --login-user ops` with a sudo password),
    as the login user: what the deploy's first play sees before it installs anything."""
    f = facts(capture)
    assert (f.os_version, f.os_codename, f.systemd_version, f.openssh) == (version, codename, systemd, openssh)
    assert f.has_systemd and f.sshd_session_name == session and f.user == "ops" and not f.is_root
    assert f.gcc is None and f.cmake is None and "git" not in f.tools        # bare: no toolchain
    assert f.sudo_nopasswd is False and "password is required" in f.sudo_msg
    assert "ansible_become_password" in refusals(f, become=True, has_password=False, build=True)[0]
    assert refusals(f, become=True, has_password=True, build=True) == []
    rpc = prereqs.Need(role="rpc", backend="cpu", isolation=True, https_repo=False)
    assert prereqs.packages(prereqs.missing(rpc, f)) == ["git", "cmake", "make", "g++", "ccache", "python3", "nftables"]
    assert prereqs.misplaced(rpc, f) == []
