"""Pure: the llama-server command line from a cluster, a build's --help and the RPC device map;
systemd quoting; journal evidence; ss parsing; the bench baseline."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from tunnelspec.commands.bench.command import baseline_argv, parse_exec_start
from tunnelspec.core.errors import TaskFailed
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.llama import flags
from tunnelspec.components.server.args import build_server_argv, draft_placement, last_acceptance, systemd_exec, systemd_quote, target_device_list
from tunnelspec.components.teardown import listening_ports
from tunnelspec.llama.served_plan import ServedPlan

SHA = "8c22f3ff082f60e8b97ed51afbf8e51e63208260"
# The new layout (llama.cpp after spring 2026): long spellings first, --spec-type mandatory.
NEW_HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
--rpc SERVERS                           comma separated list of RPC servers (host:port)
-dev,  --device <dev1,dev2,..>          comma-separated list of devices to use for offloading (none = don't
                                        offload)
--list-devices                          print list of available devices and exit
-m,    --model FNAME                    model path to load
-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)

----- example-specific params -----

--spec-type [none|draft-simple|draft-eagle3|draft-mtp|ngram-simple]
                                        type of speculative decoding to use (default: none)
--spec-draft-model, -md, --model-draft FNAME
                                        draft model for speculative decoding (default: unused)
--spec-draft-device, -devd, --device-draft <dev1,dev2,..>
                                        comma-separated list of devices to use for offloading the draft
                                        model (none = don't offload)
--spec-draft-ngl, -ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        max. number of draft model layers to store in VRAM, either an exact
                                        number, 'auto', or 'all' (default: auto)
--spec-draft-n-max N                    number of tokens to draft (default: 16)
--draft-max, --draft, --draft-n N       the argument has been removed; use --spec-draft-n-max
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
--api-key-file FNAME                    path to file containing API keys (default: none)
--metrics                               enable prometheus compatible metrics endpoint (default: disabled)
"""
OLD_HELP = """-dev,  --device <dev1,dev2,..>          devices
--rpc SERVERS                           comma separated list of RPC servers
-m,    --model FNAME                    model path
--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding (default: 16)
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
-devd, --device-draft <dev1,dev2,..>    comma-separated list of devices
-ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        number of layers to store in VRAM for the draft model
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
"""


def cluster(tmp_path: Path, main_vars: str = "", b_role: str = "target") -> Cluster:
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"""[main]
main ansible_host=10.77.0.10 {main_vars}

[rpc]
rpc-a ansible_host=10.77.0.11 rpc_role=draft
rpc-b ansible_host=10.77.0.12 rpc_role={b_role}

[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit={SHA}
llama_model=/m/target.gguf
llama_draft_model=/m/draft.gguf
""")
    return Cluster.from_inventory(load_inventory(inv))


BY_PORT = {15052: ["RPC0"], 15053: ["RPC1"]}


def test_new_build_argv_order_and_spellings(tmp_path):
    c = cluster(tmp_path)
    plan = build_server_argv(c, flags.parse_help(NEW_HELP, "new"), BY_PORT, "/opt/ts/bin/llama-server",
                             "/m/target.gguf", "/m/draft.gguf")
    a = plan.argv
    assert a[:3] == ["/opt/ts/bin/llama-server", "--rpc", "127.0.0.1:15052,127.0.0.1:15053"]
    # --rpc before any device name is used; the target-role node's device joins -dev (alone: no "none").
    assert a.index("--rpc") < a.index("-dev") < a.index("--spec-draft-device")
    assert a[a.index("-dev") + 1] == "RPC1"
    assert a[a.index("--spec-type") + 1] == "draft-simple"
    assert a[a.index("--spec-draft-device") + 1] == "RPC0"
    assert a[a.index("--spec-draft-ngl") + 1] == "all"
    # spec_draft_n_max unset: the build's own default, no flag.
    assert "--spec-draft-n-max" not in a
    # Behind the front: llama-server on loopback, on its own port (llama_server_port is the front's).
    assert a[a.index("--host") + 1] == "127.0.0.1" and a[a.index("--port") + 1] == "18080"
    assert "--draft-max" not in a and "--metrics" in a and "--api-key-file" not in a
    assert (plan.draft_node, plan.draft_devices, plan.draft_port) == ("rpc-a", ["RPC0"], 15052)


def test_target_device_list():
    assert target_device_list("none", []) == "none"
    assert target_device_list("CUDA0,CUDA1", ["RPC1"]) == "CUDA0,CUDA1,RPC1"
    assert target_device_list("none", ["RPC1", "RPC2"]) == "RPC1,RPC2"


def test_old_build_spellings_and_old_device_names(tmp_path):
    c = cluster(tmp_path)
    old_map = {15052: ["RPC[127.0.0.1:15052]"], 15053: ["RPC[127.0.0.1:15053]"]}
    plan = build_server_argv(c, flags.parse_help(OLD_HELP, "4589 (eb7cf15a)"), old_map, "ls", "/t", "/d")
    assert "--draft-max" not in plan.argv
    c = cluster(tmp_path, "spec_draft_n_max=4")
    plan = build_server_argv(c, flags.parse_help(OLD_HELP, "4589 (eb7cf15a)"), old_map, "ls", "/t", "/d")
    a = plan.argv
    assert "--spec-type" not in a  # did not exist: -md alone enabled speculation
    assert a[a.index("-devd") + 1] == "RPC[127.0.0.1:15052]"
    assert a[a.index("-ngld") + 1] == "999" and a[a.index("--draft-max") + 1] == "4"


def test_api_key_file_refused_when_build_lacks_it(tmp_path):
    c = cluster(tmp_path, "llama_server_api_key_file=/etc/tunnelspec/api-key")
    with pytest.raises(TaskFailed, match=r"--api-key-file.*4589 \(eb7cf15a\)"):
        build_server_argv(c, flags.parse_help(OLD_HELP, "4589 (eb7cf15a)"), BY_PORT, "x", "/t", "/d")
    plan = build_server_argv(c, flags.parse_help(NEW_HELP, "new"), BY_PORT, "x", "/t", "/d")
    assert plan.argv[plan.argv.index("--api-key-file") + 1] == "/etc/tunnelspec/api-key"


def test_extra_args_validated_against_the_build(tmp_path):
    c = cluster(tmp_path, 'llama_server_extra_args="-c 256"')
    plan = build_server_argv(c, flags.parse_help(NEW_HELP, "new"), BY_PORT, "x", "/t", "/d")
    assert plan.argv[-2:] == ["-c", "256"]
    c = cluster(tmp_path, 'llama_server_extra_args="--flash-attn on"')
    with pytest.raises(TaskFailed, match=r"llama_server_extra_args: .*--flash-attn.*not supported.*\(new\)"):
        build_server_argv(c, flags.parse_help(NEW_HELP, "new"), BY_PORT, "x", "/t", "/d")


def test_missing_device_for_a_tunnel_names_the_node(tmp_path):
    with pytest.raises(TaskFailed, match=r"127.0.0.1:15053 \(the tunnel to rpc-b\)"):
        build_server_argv(cluster(tmp_path), flags.parse_help(NEW_HELP), {15052: ["RPC0"]}, "x", "/t", "/d")


def test_no_draft_node_is_refused(tmp_path):
    inv = tmp_path / "i.ini"
    inv.write_text(f"[main]\nm\n[rpc]\nr rpc_role=target\n[all:vars]\nllama_repo=/r\nllama_commit={SHA}\n")
    c = Cluster.from_inventory(load_inventory(inv))
    with pytest.raises(TaskFailed, match="rpc_role=draft"):
        build_server_argv(c, flags.parse_help(NEW_HELP), {15052: ["RPC0"]}, "x", "/t", "/d")


@pytest.mark.parametrize("arg,quoted", [
    ("/opt/x/llama-server", "/opt/x/llama-server"),
    ("127.0.0.1:15052,127.0.0.1:15053", "127.0.0.1:15052,127.0.0.1:15053"),
    ("/m/my model.gguf", '"/m/my model.gguf"'),
    ("100%", "100%%"),
    ("$HOME", '"$$HOME"'),
    ('a"b\\c', '"a\\"b\\\\c"'),
])
def test_systemd_quote(arg, quoted):
    assert systemd_quote(arg) == quoted


def test_exec_start_round_trip_through_bench_parser():
    argv = ["/opt/b/llama-server", "-m", "/m/my model.gguf", "--alias", "50% $x \"q\""]
    assert parse_exec_start(f"[Service]\nExecStart={systemd_exec(argv)}\n") == argv


def test_bench_baseline_drops_draft_and_rpc():
    argv = shlex.split("/b/llama-server --rpc 127.0.0.1:15052 -dev RPC1 -m /t --spec-type draft-simple "
                       "--spec-draft-model /d --spec-draft-device RPC0 --spec-draft-ngl all "
                       "--spec-draft-n-max 4 --host 127.0.0.1 --port 8080 --metrics -c 256")
    assert baseline_argv(argv, "none", 8081) == shlex.split(
        "/b/llama-server -m /t --host 127.0.0.1 --metrics -c 256 -dev none --port 8081")


JOURNAL = """load_tensors: loading model tensors, this can take a while... (mmap = true)
load_tensors:   CPU_Mapped model buffer size =     0.50 MiB
load_tensors: RPC1[127.0.0.1:15053] model buffer size =     0.38 MiB
llama_kv_cache: RPC0[127.0.0.1:15052] KV buffer size =     0.25 MiB
load_tensors: RPC0[127.0.0.1:15052] model buffer size =     0.38 MiB
slot print_timing: id  0 | task 0 | draft acceptance = 1.00000 (   24 accepted /    24 generated)
slot print_timing: id  0 | task 3 | draft acceptance = 0.50000 (    4 accepted /     8 generated)
"""
PLAN = ServedPlan(argv=("llama-server",), kind="speculative", draft_devices=("RPC0",), draft_port=15052,
                  draft_node="rpc-a")


def test_draft_placement_found_on_the_draft_device():
    b = draft_placement(JOURNAL, PLAN)
    assert (b.device, b.port, b.size) == ("RPC0", 15052, "0.38 MiB")
    old = "load_tensors: RPC[127.0.0.1:15052] model buffer size =     0.38 MiB\n"
    assert draft_placement(old, dataclasses.replace(PLAN, draft_devices=("RPC[127.0.0.1:15052]",))).device == "RPC"


def test_draft_placement_missing_says_where_buffers_went():
    only_target = "\n".join(l for l in JOURNAL.splitlines() if "RPC0" not in l)
    with pytest.raises(TaskFailed, match=r"not on the remote device RPC0.*RPC1\[127.0.0.1:15053\] model buffer"):
        draft_placement(only_target, PLAN)
    with pytest.raises(TaskFailed, match="no RPC model buffer at all"):
        draft_placement("load_tensors: CPU_Mapped model buffer size = 1 MiB\n", PLAN)


def test_last_acceptance():
    assert last_acceptance(JOURNAL) == {"rate": 0.5, "accepted": 4, "generated": 8}
    assert last_acceptance("draft acceptance rate = 0.75000 (  3 accepted /   4 generated)")["accepted"] == 3
    assert last_acceptance("nothing") is None


def test_listening_ports_from_ss():
    out = ("LISTEN 0      128        127.0.0.1:15052      0.0.0.0:*\n"
           "LISTEN 0      511        127.0.0.1:8080       0.0.0.0:*\n"
           "LISTEN 0      128          0.0.0.0:22         0.0.0.0:*\n"
           "LISTEN 0      128             [::]:22            [::]:*\n")
    assert listening_ports(out) == {15052: "127.0.0.1", 8080: "127.0.0.1", 22: "[::]"}


def _render_unit(**over):
    from tunnelspec.core.templating import render_file

    text = (Path(__file__).resolve().parents[2] / "templates" / "tunnelspec-llama-server.service.j2").read_text()
    from tunnelspec.components.front import model as front

    v = {"exec_start": front.draftwatch_exec(), "rpc_wait_timeout": 90, "grace": front.START_GRACE,
         "state_dir": front.STATE_DIR_NAME, "llama_user": "tunnelspec-llama", "draft_node": "rpc-a",
         "draft_devices": ["RPC0"],
         "tunnel_units": ["tunnelspec-tunnel-rpc-a.service", "tunnelspec-tunnel-rpc-b.service"],
         "required_tunnel_units": ["tunnelspec-tunnel-rpc-b.service"],
         "backend": "cpu", "public_bind": False, **over}
    return render_file(text, v)


def test_unit_orders_after_tunnels_restarts_and_stays_on_loopback():
    unit = _render_unit()
    units = "tunnelspec-tunnel-rpc-a.service tunnelspec-tunnel-rpc-b.service"
    # Part of the tunnel of the node with target layers only: the draft node's tunnel may come and go
    # (reconnecting every second while it is away) without restarting llama-server each time.
    for key in ("After=network.target " + units, "Wants=" + units, "PartOf=tunnelspec-tunnel-rpc-b.service",
                "Restart=always", "User=tunnelspec-llama",
                "ExecStart=/usr/bin/python3 /usr/local/lib/tunnelspec/tunnelspec-draftwatch launch "
                "/etc/tunnelspec/llama-server.json", "RuntimeDirectory=tunnelspec-llama",
                "RuntimeDirectoryPreserve=yes",
                "IPAddressDeny=any", "IPAddressAllow=localhost", "PrivateDevices=yes", "NoNewPrivileges=yes"):
        assert key in unit.splitlines(), key
    assert "ExecStartPre" not in unit
    assert "TimeoutStartSec=130" in unit  # longer than the launcher's wait and grace


def test_unit_gpu_and_public_variants():
    unit = _render_unit(backend="cuda", public_bind=True, required_tunnel_units=[])
    assert "PrivateDevices=yes" not in unit
    # Public bind is the front's: llama-server stays on loopback.
    assert "IPAddressDeny=any" in unit.splitlines()
    assert not any(l.startswith("PartOf=") for l in unit.splitlines())


def test_captured_real_help_of_the_fixture_build(tmp_path):
    # `llama-server --help` of the fixture build (llama.cpp 0.5.0-dev, RPC proto 7.0.0).
    text = (Path(__file__).parent / "data" / "llama-server-help.txt").read_text()
    plan = build_server_argv(cluster(tmp_path), flags.parse_help(text, "fixture"), BY_PORT, "ls", "/t", "/d")
    a = plan.argv
    assert a[a.index("--spec-type") + 1] == "draft-simple"
    assert a[a.index("--spec-draft-device") + 1] == "RPC0" and a[a.index("--spec-draft-ngl") + 1] == "all"
    assert a[a.index("-lv") + 1] == "4"  # buffer placement lines need trace verbosity in this build
    assert "--metrics" in a
    c = cluster(tmp_path, 'llama_server_extra_args="-lv 3"')
    a = build_server_argv(c, flags.parse_help(text, "fixture"), BY_PORT, "ls", "/t", "/d").argv
    assert a.count("-lv") == 1 and a[-2:] == ["-lv", "3"]


def test_bench_same_placement_keeps_rpc_and_dev():
    argv = shlex.split("/b/llama-server --rpc 127.0.0.1:15052,127.0.0.1:15053 -dev RPC1 -m /t --spec-type draft-simple "
                       "--spec-draft-model /d --spec-draft-device RPC0 --spec-draft-ngl all "
                       "--spec-draft-n-max 4 --host 127.0.0.1 --port 8080")
    assert baseline_argv(argv, "none", 8081, same_placement=True) == shlex.split(
        "/b/llama-server --rpc 127.0.0.1:15052,127.0.0.1:15053 -dev RPC1 -m /t --host 127.0.0.1 --port 8081")
