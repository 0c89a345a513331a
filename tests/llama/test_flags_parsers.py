"""Pure parsers on captured output: the real output of the fixture build (tests/llama/data/) and the
older forms quoted in LLAMA_FACTS.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.errors import TaskFailed
from tunnelspec.llama import flags

DATA = Path(__file__).parent / "data"

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
    assert flags.draft_argv(h, "/m/d.gguf", "RPC[127.0.0.1:15052]") == [
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
