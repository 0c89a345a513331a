"""`-e KEY=VALUE` reaches every variable, the typed cluster model included: Inventory.host_vars is
the one merge (inventory layers, then -e on top, Ansible's precedence), and Cluster reads it.

For every variable the cluster model reads, the test gives it another value with -e and checks
that the model changes exactly as it does when the same value is written in the inventory; a
`deploy --check` renders its units from this model, so a changed model is reported as drift
(tests/deploy/test_server_lifecycle.py checks that on the lab with rpc_threads and
llama_server_port)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.cluster.fields import KNOWN_VARS

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "fedcba9876543210fedcba9876543210fedcba98"

# variable -> (-e values as the command line gives them: text, how to read the result from the model)
OWN_TLS = {"llama_server_public_bind": "true", "llama_server_tls_cert_file": "own.crt",
           "llama_server_tls_key_file": "own.key", "llama_server_tls_ca_file": "ca.crt"}
CASES = {
    "rpc_port": ({"rpc_port": "50100"}, lambda c: c.rpc[0].rpc_port),
    "tunnel_port": ({"tunnel_port": "15100"}, lambda c: c.rpc[0].tunnel_port),
    "rpc_role": ({"rpc_role": "target"}, lambda c: c.rpc[0].role),
    "rpc_devices": ({"rpc_devices": "CPU,Vulkan0"}, lambda c: c.rpc[0].devices),
    "rpc_threads": ({"rpc_threads": "3"}, lambda c: c.rpc[0].threads),
    "rpc_cache": ({"rpc_cache": "false"}, lambda c: c.rpc[0].cache),
    "llama_repo": ({"llama_repo": "/srv/other"}, lambda c: c.source.repo),
    "llama_commit": ({"llama_commit": OTHER_SHA}, lambda c: c.source.commit),
    "llama_patches": ({"llama_patches": '[{"pr": 5, "commit": "' + "abcdef1" * 5 + 'abcde"}]'}, lambda c: c.source.patches),
    "llama_build_number": ({"llama_build_number": "7000"}, lambda c: c.source.build_number),
    "llama_force_clean": ({"llama_force_clean": "true"}, lambda c: c.rpc[0].build.force_clean),
    "llama_backend": ({"llama_backend": "vulkan"}, lambda c: c.main.build.backend),
    "llama_cmake_args": ({"llama_cmake_args": "-DGGML_NATIVE=OFF"}, lambda c: c.rpc[0].build.cmake_args),
    "llama_cuda_architectures": ({"llama_cuda_architectures": "89"}, lambda c: c.rpc[0].build.cuda_architectures),
    "llama_build_jobs": ({"llama_build_jobs": "2"}, lambda c: c.main.build.jobs),
    "tunnelspec_root": ({"tunnelspec_root": "/srv/ts"}, lambda c: (c.main.root, c.rpc[0].root)),
    "llama_model": ({"llama_model": "/m/other.gguf"}, lambda c: c.main.model),
    "llama_draft_model": ({"llama_draft_model": "/m/other-draft.gguf"}, lambda c: c.main.draft_model),
    "llama_server_host": ({"llama_server_host": "10.77.0.10", "llama_server_public_bind": "true",
                           "llama_server_api_key_file": "/etc/tunnelspec/key"}, lambda c: c.main.server_host),
    "llama_server_port": ({"llama_server_port": "8081"}, lambda c: c.main.server_port),
    "llama_server_start_timeout": ({"llama_server_start_timeout": "900"}, lambda c: c.main.start_timeout),
    "llama_server_internal_port": ({"llama_server_internal_port": "18090"}, lambda c: c.main.front.internal_port),
    "llama_server_hold_timeout": ({"llama_server_hold_timeout": "600"}, lambda c: c.main.front.hold_timeout),
    "draft_rejoin_after": ({"draft_rejoin_after": "45"}, lambda c: c.main.front.rejoin_after),
    "front_user": ({"front_user": "llm-front"}, lambda c: c.main.front.user),
    "metrics": ({"metrics": "true"}, lambda c: c.main.front.metrics),
    "metrics_port": ({"metrics": "true", "metrics_port": "9500"},
                     lambda c: c.main.front.metrics and c.main.front.metrics.port),
    "metrics_readers": ({"metrics": "true", "metrics_readers": "prometheus"},
                        lambda c: c.main.front.metrics and c.main.front.metrics.readers),
    "bench_port": ({"bench_port": "18090"}, lambda c: c.main.front.bench_port),
    "metrics_token_file": ({"metrics": "true", "llama_server_public_bind": "true",
                            "llama_server_api_key_file": "/etc/tunnelspec/key",
                            "metrics_token_file": "/etc/tunnelspec/metrics-token"},
                           lambda c: c.main.front.metrics and c.main.front.metrics.token_file),
    "llama_server_public_bind": ({"llama_server_public_bind": "true"}, lambda c: c.main.public_bind),
    "llama_server_api_key_file": ({"llama_server_api_key_file": "/etc/tunnelspec/key"},
                                  lambda c: c.main.api_key_file),
    "llama_server_extra_args": ({"llama_server_extra_args": "--ctx-size 512"}, lambda c: c.main.extra_args),
    "llama_target_devices": ({"llama_target_devices": "CPU"}, lambda c: c.main.target_devices),
    "spec_draft_n_max": ({"spec_draft_n_max": "6"}, lambda c: c.main.spec_draft_n_max),
    "spec_draft_ngl": ({"spec_draft_ngl": "10"}, lambda c: c.main.spec_draft_ngl),
    "spec_draft_p_min": ({"spec_draft_p_min": "0.3"}, lambda c: c.main.spec_draft_p_min),
    "spec_type": ({"spec_type": "draft-eagle3"}, lambda c: c.main.spec_type),
    "llama_split_mode": ({"llama_split_mode": "row"}, lambda c: c.placement.split_mode),
    "llama_tensor_split": ({"llama_tensor_split": "r1=1"}, lambda c: c.placement.weights),
    "rpc_target_share": ({"rpc_target_share": "2"}, lambda c: c.rpc[0].target_share),
    "rpc_env": ({"rpc_env": "GGML_VK_VISIBLE_DEVICES=0"}, lambda c: c.rpc[0].env),
    "rpc_user": ({"rpc_user": "other-rpc"}, lambda c: c.rpc[0].users.rpc),
    "tunnel_user": ({"tunnel_user": "other-tunnel"}, lambda c: c.main.users.tunnel),
    "llama_user": ({"llama_user": "other-llama"}, lambda c: c.main.users.llama),
    "llama_server_tls_names": ({"llama_server_public_bind": "true", "llama_server_tls_names": "llm.example.org,10.0.0.5"},
                               lambda c: c.main.tls and c.main.tls.names),
    "llama_server_tls_cert_file": (OWN_TLS, lambda c: c.main.tls and c.main.tls.own_cert.name),
    "llama_server_tls_key_file": (OWN_TLS, lambda c: c.main.tls and c.main.tls.own_key.name),
    "llama_server_tls_ca_file": (OWN_TLS, lambda c: c.main.tls and c.main.tls.own_ca.name),
    "tunnelspec_tls_dir": ({"llama_server_public_bind": "true", "tunnelspec_tls_dir": "ca"},
                           lambda c: c.main.tls and c.main.tls.ca_dir.name),
}
# Read by the connection layer, the run lock and the pending-handler record, not the cluster model
# (templates and those readers get -e through Inventory.host_vars like every variable).
NOT_IN_THE_MODEL = {"tunnelspec_known_hosts", "tunnelspec_lock_dir", "tunnelspec_pending_dir",
                    "rpc_local_isolation",  # read by playbooks/isolation*.yml and status
                    "tunnelspec_install_packages",  # read by playbooks/hosts.yml, prerequisites.yml
                    "tunnel_ssh_host", "tunnel_ssh_port",  # read by inventory/addresses.py
                    "llama_keep_builds", "tunnel_from",  # read by playbooks/build.yml, tunnel.yml
                    "tunnelspec_keep_generations",  # read by playbooks/server.yml (generation_record)
                    "tunnel_nodes", "tunnel_key_rotation", "tunnelspec_purge",  # set by commands (-e)
                    "rollback_to", "rollback_after_failed_deploy", "rollback_event"}
# rpc_bind has one allowed value: -e with another one is refused, naming -e (test below).
REFUSED_OTHERWISE = {"rpc_bind"}


def write(tmp_path: Path, all_vars: dict | None = None) -> Path:
    lines = ["[main]", "m1 ansible_host=10.77.0.10", "", "[rpc]", "r1 ansible_host=10.77.0.11", "",
             "[all:vars]", "llama_repo=/srv/llama.cpp", f'llama_commit="{SHA}"',
             *(f"{k}={v}" for k, v in (all_vars or {}).items()), ""]
    path = tmp_path / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_cluster_variable_has_a_case():
    # A new variable of the model must be added above, so -e is proven to reach it too.
    assert set(CASES) | NOT_IN_THE_MODEL | REFUSED_OTHERWISE == set(KNOWN_VARS)


@pytest.mark.parametrize("var", sorted(CASES))
def test_extra_var_changes_the_cluster_model_like_the_inventory_does(tmp_path, var):
    extra, read = CASES[var]
    base = Cluster.from_inventory(load_inventory(write(tmp_path)))
    with_e = Cluster.from_inventory(load_inventory(write(tmp_path)).with_extra_vars(extra))
    assert read(with_e) != read(base), f"-e {var}=… did not reach the cluster model"
    # The same value written in the inventory gives the same model value.
    (tmp_path / "ini").mkdir()
    in_file = Cluster.from_inventory(load_inventory(write(tmp_path / "ini", extra)))
    assert read(with_e) == read(in_file)


def test_extra_var_wins_over_a_host_line(tmp_path):
    path = write(tmp_path)
    path.write_text(path.read_text().replace("r1 ansible_host=10.77.0.11", "r1 ansible_host=10.77.0.11 rpc_threads=1"))
    inv = load_inventory(path)
    assert Cluster.from_inventory(inv).rpc[0].threads == 1
    assert Cluster.from_inventory(inv.with_extra_vars({"rpc_threads": "3"})).rpc[0].threads == 3


def test_a_bad_extra_var_is_an_error_naming_e(tmp_path):
    inv = load_inventory(write(tmp_path)).with_extra_vars({"rpc_bind": "0.0.0.0"})
    with pytest.raises(ClusterError) as info:
        Cluster.from_inventory(inv)
    assert str(info.value).startswith("-e rpc_bind: host r1: variable rpc_bind:"), str(info.value)
    assert info.value.exit_code == 2 and info.value.file == "-e"


def test_the_run_and_the_cluster_read_the_same_view(tmp_path):
    extra = {"rpc_threads": "3", "llama_commit": OTHER_SHA}
    inv = load_inventory(write(tmp_path)).with_extra_vars(extra)  # the one merge, as the runner does it
    run = Run(inv, RunOptions(extra_vars=extra), lambda e: None)
    assert run.hosts["r1"].vars["rpc_threads"] == "3"          # templates see the -e text, as in Ansible
    assert run.template_vars("m1")["llama_commit"] == OTHER_SHA
    assert Cluster.from_inventory(run.inventory).rpc[0].threads == 3
    # `inventory list` shows the file, never the command line.
    assert "rpc_threads" not in run.inventory.to_ansible_list()["_meta"]["hostvars"].get("r1", {})
