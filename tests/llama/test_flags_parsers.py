"""Pure parsers on captured output: the real output of the fixture build (tests/llama/data/) and the
older forms quoted in docs/llama-facts.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import flags

DATA = Path(__file__).parent / "data"
# The captured --help of the fixture build: one copy, next to the other builds' help texts.
HELP_FIXTURE = Path(__file__).resolve().parents[1] / "server" / "data" / "llama-server-help.txt"

# An older build's help, in llama.cpp's column layout: no --spec-type, -md enables speculation,
# --draft-max is still a live option and -ngld takes an int.
OLD_HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
--version                               show version and build info
--rpc SERVERS                           comma separated list of RPC servers
-dev,  --device <dev1,dev2,..>          comma-separated list of devices to use for offloading
--list-devices                          print list of available devices and exit

----- example-specific params -----

--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding (default: 16)
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
-devd, --device-draft <dev1,dev2,..>    comma-separated list of devices to use for offloading the draft
                                        model (none = don't offload)
-ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        number of layers to store in VRAM for the draft model
--host HOST                             ip address to listen (default: 127.0.0.1)
"""


def test_old_help_chooses_old_spellings():
    h = flags.parse_help(OLD_HELP, build="4589 (eb7cf15a)")
    f = flags.draft_flags(h)
    assert f.spec_type is None
    assert (f.model, f.device, f.ngl, f.n_max) == ("-md", "-devd", "-ngld", "--draft-max")
    assert f.ngl_all == "999"
    assert h.aliases("-ngld") == ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft")
    assert flags.draft_argv(h, "/m/d.gguf", "RPC[127.0.0.1:15052]", n_max=4) == [
        "-md", "/m/d.gguf", "-devd", "RPC[127.0.0.1:15052]", "-ngld", "999", "--draft-max", "4"]


def test_old_help_refuses_missing_option_naming_option_and_build():
    h = flags.parse_help(OLD_HELP, build="4589 (eb7cf15a)")
    with pytest.raises(TaskFailed, match=r"--api-key-file.*not supported.*4589 \(eb7cf15a\)"):
        h.require("--api-key-file")
    with pytest.raises(TaskFailed, match="--spec-type"):
        h.check_argv(["llama-server", "--rpc", "127.0.0.1:1", "--spec-type", "draft-simple"])
    h.check_argv(["llama-server", "--rpc", "127.0.0.1:1", "-ngld", "99", "--host", "127.0.0.1"])


def test_version_new_and_old_forms():
    v = flags.parse_version("version: 0.5.0-dev (build 9876, commit 0c1e57098)\nbuilt with GNU 12.2.0 for Linux x86_64\n")
    assert (v.version, v.build_number, v.commit) == ("0.5.0-dev", 9876, "0c1e57098")
    old = flags.parse_version("version: 4589 (eb7cf15a)\nbuilt with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n")
    assert (old.version, old.build_number, old.commit) == (None, 4589, "eb7cf15a")
    with pytest.raises(TaskFailed):
        flags.parse_version("llama-server: unknown option\n")


def test_version_build_zero_means_unknown():
    v = flags.parse_version("version: 0.5.0-dev (build 0, commit unknown)\n")
    assert v.build_number is None and v.commit is None


def test_list_devices_new_names_map_to_tunnel_ports():
    text = """Available devices:
  CPU: AMD EPYC (24105 MiB, 24105 MiB free)
  RPC0: 127.0.0.1:15052 (24105 MiB, 24000 MiB free)
  RPC1: 127.0.0.1:15053 (8000 MiB, 7000 MiB free)
  RPC2: 127.0.0.1:15053 (8000 MiB, 6000 MiB free)
"""
    devs = flags.parse_list_devices(text)
    assert [d.name for d in devs] == ["CPU", "RPC0", "RPC1", "RPC2"]
    assert devs[1] == flags.Device("RPC0", "127.0.0.1:15052", 24105, 24000)
    assert devs[0].endpoint_port is None
    assert flags.rpc_devices_by_port(devs) == {15052: ["RPC0"], 15053: ["RPC1", "RPC2"]}


def test_list_devices_old_bracket_names():
    text = """Available devices:
  RPC[127.0.0.1:15052]: RPC[127.0.0.1:15052] (24105 MiB, 24105 MiB free)
"""
    devs = flags.parse_list_devices(text)
    assert devs[0].name == "RPC[127.0.0.1:15052]"
    assert flags.rpc_devices_by_port(devs) == {15052: ["RPC[127.0.0.1:15052]"]}


# ---- real output of the llama.cpp 0c1e57098 build (the tree vendored by llama-cpp-python 0.3.36, the
# lab's default tree before b11434): one more real --help next to b9093's and b11434's


@pytest.fixture(scope="module")
def real_help():
    return flags.parse_help((HELP_FIXTURE).read_text(), build="0.5.0-dev (8c22f3ff0)")


def test_real_help_chooses_new_spellings(real_help):
    f = flags.draft_flags(real_help)
    assert (f.model, f.device, f.ngl, f.n_max, f.ngl_all, f.spec_type, f.spec_value) == (
        "--spec-draft-model", "--spec-draft-device", "--spec-draft-ngl", "--spec-draft-n-max", "all",
        "--spec-type", "draft-simple")
    assert f.n_max_default == 3 and f.p_min_default == 0.0
    # No --spec-draft-n-max unless asked for: the build's own default stays.
    assert flags.draft_argv(real_help, "/m/d.gguf", "RPC0") == [
        "--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf", "--spec-draft-device", "RPC0",
        "--spec-draft-ngl", "all"]
    assert flags.draft_argv(real_help, "/m/d.gguf", "RPC0", n_max=4)[-2:] == ["--spec-draft-n-max", "4"]


def test_real_help_aliases_and_values(real_help):
    assert real_help.aliases("-md") == ("--spec-draft-model", "-md", "--model-draft")
    assert real_help.aliases("-devd") == ("--spec-draft-device", "-devd", "--device-draft")
    assert "-ngld" in real_help.aliases("--spec-draft-ngl")
    assert "draft-simple" in real_help.values("--spec-type")
    assert real_help.values("--spec-type")[0] == "none"
    for opt in ("--api-key-file", "--rpc", "--list-devices", "-dev", "--host", "--port", "--metrics"):
        assert real_help.supports(opt), opt


def test_real_help_refuses_removed_draft_max(real_help):
    # Still listed in --help, but as "the argument has been removed": a hard error at start.
    assert not real_help.supports("--draft-max")
    with pytest.raises(TaskFailed, match=r"--draft-max is removed in this build \(0.5.0-dev \(8c22f3ff0\)\)"):
        real_help.check_argv(["llama-server", "--draft-max", "4"])
    with pytest.raises(TaskFailed, match="--no-such-flag is not supported"):
        real_help.require("--no-such-flag")


def test_real_version():
    v = flags.parse_version((DATA / "llama-server-version.txt").read_text())
    assert (v.version, v.build_number, v.commit) == ("0.5.0-dev", None, "8c22f3ff0")


def test_real_list_devices():
    devs = flags.parse_list_devices((DATA / "llama-server-list-devices-rpc.txt").read_text())
    assert devs == [flags.Device("RPC0", "127.0.0.1:60241", 24105, 24105)]
    assert flags.rpc_devices_by_port(devs) == {60241: ["RPC0"]}
    # `--list-devices` before `--rpc`: the RPC device is not registered yet.
    assert flags.parse_list_devices((DATA / "llama-server-list-devices-none.txt").read_text()) == []
