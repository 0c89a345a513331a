"""Pure: speculative type, draft tuning flags and target placement turned into llama-server argv,
against the real `--help` of every build captured in tests/*/data: the lab's trees (b11434, the
default; b9093) and the 0c1e57098 tree the lab deployed before; more builds join when their help
text is captured there as llama-server-help-<build>.txt."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError, TaskFailed
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.llama import flags
from tunnelspec.components.server.args import build_server_argv
from tunnelspec.llama.speculative import DRAFT_TYPES, spec_support, split_modes

SHA = "8c22f3ff082f60e8b97ed51afbf8e51e63208260"
DATA = Path(__file__).resolve().parents[1]
# Real `llama-server --help` texts captured from built binaries: name → (path, build label).
HELPS = {"0c1e57098": (DATA / "server/data/llama-server-help.txt", "0.5.0-dev (build 0, commit 8c22f3ff0)")}
for extra in sorted(DATA.glob("*/data/llama-server-help-b*.txt")):
    # The build's label as `--version` printed it (captured next to the help), as a deploy names it.
    version = extra.with_name(extra.name.replace("-help-", "-version-"))
    label = flags.parse_version(version.read_text()).label if version.is_file() else extra.stem
    HELPS.setdefault(extra.stem.removeprefix("llama-server-help-"), (extra, label))


def real_help(name: str) -> flags.ServerHelp:
    path, label = HELPS[name]
    return flags.parse_help(path.read_text(), build=label)


def make_cluster(tmp_path: Path, main_vars: str = "", a_vars: str = "rpc_role=draft",
                 b_vars: str = "rpc_role=target", rest: str = "") -> Cluster:
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"""[main]
main ansible_host=10.77.0.10 {main_vars}

[rpc]
rpc-a ansible_host=10.77.0.11 {a_vars}
rpc-b ansible_host=10.77.0.12 {b_vars}

[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit={SHA}
llama_model=/m/target.gguf
llama_draft_model=/m/draft.gguf
{rest}
""")
    return Cluster.from_inventory(load_inventory(inv))


BY_PORT = {15052: ["RPC0"], 15053: ["RPC1"]}


def argv_of(c: Cluster, build: str = "b11434", by_port=None) -> list[str]:
    return build_server_argv(c, real_help(build), by_port or BY_PORT, "/b/llama-server",
                             "/m/target.gguf", "/m/draft.gguf").argv


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---- speculative type ------------------------------------------------------------------------
@pytest.mark.parametrize("build", ["b11434", "0c1e57098"])
def test_new_builds_offer_every_draft_type(build):
    s = spec_support(real_help(build))
    assert s.types == DRAFT_TYPES and not s.implicit and s.flag == "--spec-type"


@pytest.mark.parametrize("build", sorted(HELPS))
def test_default_type_is_draft_simple_where_the_build_has_it(tmp_path, build):
    a = argv_of(make_cluster(tmp_path), build)
    s = spec_support(real_help(build))
    if s.implicit:
        assert "--spec-type" not in a  # the draft model alone speculates; draft-simple is rejected there
    else:
        assert value(a, "--spec-type") == "draft-simple"
    # The draft model and its device follow the type (where the build spells them so).
    dev_flag = next(f for f in ("--spec-draft-device", "-devd") if f in a)
    assert value(a, dev_flag) == "RPC0"


@pytest.mark.parametrize("build", sorted(HELPS))
@pytest.mark.parametrize("spec_type", DRAFT_TYPES)
def test_every_type_on_every_build(tmp_path, build, spec_type):
    c = make_cluster(tmp_path, f"spec_type={spec_type}")
    s = spec_support(real_help(build))
    if spec_type not in s.types:
        # Refused naming the build and what it has (the preflight turns this into exit 2).
        with pytest.raises(TaskFailed) as e:
            argv_of(c, build)
        assert HELPS[build][1] in str(e.value) and s.describe() in str(e.value)
        return
    a = argv_of(c, build)
    if s.implicit:
        assert "--spec-type" not in a
    else:
        assert value(a, "--spec-type") == spec_type and a.count("--spec-type") == 1
    # The draft (EAGLE-3 head, DFlash/DSpark draft, separate MTP file) loads from -md onto the remote device.
    model_flag = next(f for f in ("--spec-draft-model", "-md") if f in a)
    dev_flag = next(f for f in ("--spec-draft-device", "-devd") if f in a)
    assert value(a, model_flag) == "/m/draft.gguf" and value(a, dev_flag) == "RPC0"
    assert a.index("--rpc") < a.index(dev_flag)


def test_type_the_build_lacks_names_build_and_types(tmp_path):
    # b11434's own help with draft-dspark missing from the --spec-type list: the shape of b10001.
    text = HELPS["b11434"][0].read_text().replace("draft-dflash,draft-dspark,", "draft-dflash,")
    h = flags.parse_help(text, build="b10001-like")
    c = make_cluster(tmp_path, "spec_type=draft-dspark")
    with pytest.raises(TaskFailed) as e:
        build_server_argv(c, h, BY_PORT, "x", "/t", "/d")
    msg = str(e.value)
    assert "draft-dspark" in msg and "b10001-like" in msg
    assert "draft-simple, draft-eagle3, draft-mtp, draft-dflash" in msg


def test_unknown_type_refused_at_parse_with_file_line(tmp_path):
    with pytest.raises(ClusterError) as e:
        make_cluster(tmp_path, "spec_type=ngram-simple")
    assert e.value.var == "spec_type" and e.value.line == 2
    assert "draft-simple, draft-eagle3" in str(e.value)


def test_mtp_without_separate_file_refused_with_reason(tmp_path):
    with pytest.raises(ClusterError) as e:
        make_cluster(tmp_path, "spec_type=draft-mtp llama_draft_model=/m/target.gguf")
    assert "ignores the draft device" in str(e.value) and e.value.var == "spec_type"
    inv = tmp_path / "mtp.ini"
    inv.write_text(f"""[main]
main spec_type=draft-mtp llama_model=/m/t.gguf
[rpc]
rpc-a
[all:vars]
llama_repo=/r
llama_commit={SHA}
""")
    c = Cluster.from_inventory(load_inventory(inv))
    with pytest.raises(ClusterError, match="separate MTP GGUF.*ignores the draft device"):
        c.require_models()


# ---- draft tuning flags ----------------------------------------------------------------------
@pytest.mark.parametrize("extra", ["--spec-draft-p-min 0.5", "--spec-draft-n-min 1", "--spec-draft-type-k q8_0",
                                   "--spec-draft-type-v q8_0", "--spec-draft-threads 1", "-ctkd q8_0",
                                   "--draft-p-min 0.2"])
def test_tuning_flags_pass_through(tmp_path, extra):
    a = argv_of(make_cluster(tmp_path, f'llama_server_extra_args="{extra}"'))
    assert a[-len(extra.split()):] == extra.split()


@pytest.mark.parametrize("extra,var", [
    ("--spec-type draft-eagle3", "spec_type"), ("--spec-draft-n-max 8", "spec_draft_n_max"),
    ("-md /x.gguf", "llama_draft_model"), ("--spec-draft-device RPC1", "rpc_role=draft"),
    ("-ngld 3", "spec_draft_ngl"), ("-sm row", "llama_split_mode"), ("--tensor-split 1,1", "llama_tensor_split"),
    ("--draft-max 3", "spec_draft_n_max"), ("--device CPU", "llama_target_devices"),
])
def test_owned_flags_refused_naming_the_variable(tmp_path, extra, var):
    with pytest.raises(ClusterError) as e:
        make_cluster(tmp_path, f'llama_server_extra_args="{extra}"')
    assert e.value.var == "llama_server_extra_args" and f"use {var}" in str(e.value)


def test_tuning_flag_the_build_lacks_refused_naming_the_build(tmp_path):
    c = make_cluster(tmp_path, 'llama_server_extra_args="--spec-draft-ctx-size 256"')  # removed after b10001
    with pytest.raises(TaskFailed, match=r"llama_server_extra_args: --spec-draft-ctx-size .*build 11434"):
        argv_of(c)


def test_named_p_min_and_its_conflict(tmp_path):
    a = argv_of(make_cluster(tmp_path, "spec_draft_p_min=0.25 spec_draft_n_max=3"))
    assert value(a, "--spec-draft-p-min") == "0.25" and value(a, "--spec-draft-n-max") == "3"
    with pytest.raises(ClusterError, match="keep one of the two"):
        make_cluster(tmp_path, 'spec_draft_p_min=0.25 llama_server_extra_args="--spec-draft-p-min 0.5"')
    with pytest.raises(ClusterError, match="between 0 and 1"):
        make_cluster(tmp_path, "spec_draft_p_min=2")


# ---- target placement ------------------------------------------------------------------------
@pytest.mark.parametrize("build", sorted(HELPS))
@pytest.mark.parametrize("mode", ["none", "layer", "row", "tensor"])
def test_split_modes_each_build_offers(tmp_path, build, mode):
    c = make_cluster(tmp_path, f"llama_split_mode={mode}")
    if mode not in split_modes(real_help(build)):
        with pytest.raises(TaskFailed, match=f"llama_split_mode {mode} is not offered"):
            argv_of(c, build)
        return
    a = argv_of(c, build)
    assert value(a, "-sm") == mode and a.index("-dev") < a.index("-sm")


@pytest.mark.parametrize("build", sorted(HELPS))
def test_proportions_by_name_on_every_build(tmp_path, build):
    c = make_cluster(tmp_path, a_vars="rpc_role=draft rpc_target_share=1", b_vars="rpc_role=target rpc_target_share=3")
    a = argv_of(c, build)
    assert value(a, "-dev") == "RPC0,RPC1" and value(a, "-ts") == "1,3"


def test_split_mode_the_build_lacks(tmp_path):
    text = HELPS["b11434"][0].read_text().replace("{none,layer,row,tensor}", "{none,layer,row}")
    c = make_cluster(tmp_path, "llama_split_mode=tensor")
    with pytest.raises(TaskFailed, match=r"llama_split_mode tensor .*old-tree.*none, layer, row"):
        build_server_argv(c, flags.parse_help(text, "old-tree"), BY_PORT, "x", "/t", "/d")


def test_shares_per_node_follow_the_discovered_device_order(tmp_path):
    # Three nodes, draft on rpc-a, target layers on rpc-b and rpc-c; the tunnels were discovered
    # in --rpc order, so rpc-c is RPC2 even though it is listed with a smaller share.
    inv = tmp_path / "three.ini"
    inv.write_text(f"""[main]
main
[rpc]
rpc-a rpc_role=draft
rpc-b rpc_role=target rpc_target_share=1
rpc-c rpc_role=target rpc_target_share=3
[all:vars]
llama_repo=/r
llama_commit={SHA}
llama_model=/m/t.gguf
llama_draft_model=/m/d.gguf
""")
    c = Cluster.from_inventory(load_inventory(inv))
    a = argv_of(c, by_port={15052: ["RPC0"], 15053: ["RPC1"], 15054: ["RPC2"]})
    assert value(a, "-dev") == "RPC1,RPC2" and value(a, "-ts") == "1,3"


def test_tensor_split_by_name_with_local_gpus_and_a_two_device_node(tmp_path):
    # Seed 004's shape plus a node with two devices: names, not positions; a node's weight is shared
    # by its devices; CPU=0 is accepted (not an offload device).
    c = make_cluster(tmp_path, 'llama_target_devices=CUDA0,CUDA1 llama_split_mode=tensor '
                     'llama_tensor_split="rpc-b=2,CUDA1=3,CUDA0=3,CPU=0"')
    a = argv_of(c, by_port={15052: ["RPC0"], 15053: ["RPC1", "RPC2"]})
    assert value(a, "-dev") == "CUDA0,CUDA1,RPC1,RPC2"
    assert value(a, "-ts") == "3,3,1,1"
    assert value(a, "-sm") == "tensor" and value(a, "--spec-draft-device") == "RPC0"


def test_multi_gpu_local_target_with_remote_draft(tmp_path):
    # Seed 004: the target tensor-parallel on the main host's two GPUs, the DFlash draft alone on RPC0.
    inv = tmp_path / "tp.ini"
    inv.write_text(f"""[main]
main llama_target_devices=CUDA0,CUDA1 llama_split_mode=tensor spec_type=draft-dflash
[rpc]
coal rpc_role=draft
[all:vars]
llama_repo=/r
llama_commit={SHA}
llama_model=/m/t.gguf
llama_draft_model=/m/d.gguf
""")
    a = argv_of(Cluster.from_inventory(load_inventory(inv)), by_port={15052: ["RPC0"]})
    assert value(a, "-dev") == "CUDA0,CUDA1" and value(a, "-sm") == "tensor" and "-ts" not in a
    assert value(a, "--spec-type") == "draft-dflash" and value(a, "--spec-draft-device") == "RPC0"


def test_draft_node_with_a_share_also_carries_target_layers(tmp_path):
    c = make_cluster(tmp_path, a_vars="rpc_role=draft rpc_target_share=1", b_vars="rpc_role=target rpc_target_share=3")
    a = argv_of(c)
    assert value(a, "-dev") == "RPC0,RPC1" and value(a, "-ts") == "1,3"
    assert value(a, "--spec-draft-device") == "RPC0"


@pytest.mark.parametrize("main_vars,b_vars,needle,var", [
    ('llama_tensor_split="rpc-a=1,rpc-z=3"', "rpc_role=target", "'rpc-z' is neither", "llama_tensor_split"),
    ('llama_tensor_split="rpc-a=1"', "rpc_role=target", "no proportion for target device(s) rpc-b", "llama_tensor_split"),
    ('llama_tensor_split="1,3"', "rpc_role=target", "not by position", "llama_tensor_split"),
    ('llama_tensor_split="rpc-b=1,3"', "rpc_role=target", "not by position", "llama_tensor_split"),
    ('llama_tensor_split="rpc-b=1"', "rpc_role=target rpc_target_share=2", "use one of the two", "rpc_target_share"),
    ("llama_split_mode=diagonal", "rpc_role=target", "must be one of none, layer, row, tensor", "llama_split_mode"),
    ("", "rpc_role=target rpc_target_share=-1", "0 or more", "rpc_target_share"),
])
def test_bad_placement_exit_2_with_file_line(tmp_path, main_vars, b_vars, needle, var):
    with pytest.raises(ClusterError) as e:
        make_cluster(tmp_path, main_vars, b_vars=b_vars)
    assert needle in str(e.value) and e.value.var == var
    assert e.value.line is not None and f"inventory.ini:{e.value.line}:" in str(e.value)
