"""bench's pure parts: the baseline's argv for each kind of deployed command line, the fit decision
with its figures, the sampler's /proc parsers on captured text, its result, the load time from
captured llama-server journal lines, and both output forms."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tunnelspec.commands.bench import sampler
from tunnelspec.commands.bench.command import SCHEMA, exit_code, no_progress, render
from tunnelspec.commands.bench.argv import baseline_argv, context_size, deployed_kind, describe_placement, local_devices, rpc_ports
from tunnelspec.commands.bench.figures import device_figures, fit_on_main, journal_n_ctx, load_time, meminfo_figure, parse_unit_run, side_figures
from tunnelspec.commands.bench.netwait import summarize
from tunnelspec.core import http
from tunnelspec.llama import memory_fit

DATA = Path(__file__).parent / "data"
GIB = 2**30

SPECULATIVE = shlex.split(
    "/b/llama-server --rpc 127.0.0.1:15052,127.0.0.1:15053 -dev RPC1 -m /t --spec-type draft-simple "
    "--spec-draft-model /d --spec-draft-device RPC0 --spec-draft-ngl all --spec-draft-n-max 4 "
    "--host 127.0.0.1 --port 8080 --metrics -lv 4")
# A target split over two nodes and main's CPU, no draft (seed 003).
SPLIT = shlex.split("/b/llama-server --rpc 127.0.0.1:15052,127.0.0.1:15053 -dev RPC0,RPC1 -ts 1,3 -ngl 8 "
                    "-m /m/big.gguf --host 127.0.0.1 --port 8080 --metrics -c 4096")


# ---- argv --------------------------------------------------------------------------------------
def test_kinds_from_the_deployed_command_line():
    assert deployed_kind(SPECULATIVE) == "speculative"
    assert deployed_kind(SPLIT) == "split"
    assert deployed_kind(shlex.split("/b/llama-server -m /t --port 8080")) == "local"
    assert rpc_ports(SPLIT) == [15052, 15053] and rpc_ports(shlex.split("/b/llama-server -m /t")) == []


def test_a_deployed_completion_without_answer_on_three_endpoints_names_llama_cpp_issue_28487():
    three = shlex.split("/b/llama-server --rpc 127.0.0.1:15052,127.0.0.1:15053,127.0.0.1:15054 -dev RPC1,RPC2 "
                        "-m /t --spec-draft-model /d --spec-draft-device RPC0 --port 8080")
    msg = no_progress(http.NoAnswer(300.0), three)
    assert msg.startswith("the deployed llama-server gave no answer to a bench completion within 300 s, with 3 RPC "
                          "endpoints: this looks like llama.cpp issue 28487 "), msg
    assert "`systemctl restart tunnelspec-llama-server.service` on main" in msg and "at most 2 rpc nodes" in msg
    # Two endpoints, or a failure that is not a timeout (a refused connection, a 500): not named.
    assert no_progress(http.NoAnswer(300.0), SPLIT) == ""
    assert no_progress(http.HttpError("cannot connect: refused"), three) == ""


def test_baseline_of_a_split_without_draft_is_the_model_on_main_alone():
    base = baseline_argv(SPLIT, local_devices(SPLIT, "none"), 8081)
    assert base == shlex.split("/b/llama-server -m /m/big.gguf --host 127.0.0.1 --metrics -c 4096 "
                               "-dev none --port 8081")
    assert "-ngl" not in base  # main alone: every layer on main's devices
    assert not any(f in base for f in ("--rpc", "-ts", "--spec-type", "--spec-draft-model"))
    assert context_size(SPLIT) == 4096 and context_size(SPECULATIVE) is None


def test_baseline_of_a_speculative_cluster_drops_draft_and_rpc():
    base = baseline_argv(SPECULATIVE, local_devices(SPECULATIVE, "none"), 8081)
    assert base == shlex.split("/b/llama-server -m /t --host 127.0.0.1 --metrics -lv 4 -dev none --port 8081")
    same = baseline_argv(SPECULATIVE, "none", 8081, same_placement=True)
    assert same == shlex.split("/b/llama-server --rpc 127.0.0.1:15052,127.0.0.1:15053 -dev RPC1 -m /t "
                               "--host 127.0.0.1 --metrics -lv 4 --port 8081")


@pytest.mark.parametrize("dev, default, local", [
    ("RPC0,RPC1,CPU", "none", "none"),        # main's share on its CPU
    ("CUDA0,RPC0,RPC1", "CUDA0", "CUDA0"),    # main's share on its GPU
    ("RPC1", "Vulkan0", "Vulkan0"),           # every target layer remote: main's configured devices
    ("RPC[127.0.0.1:15052]", "none", "none"),  # the device name of builds before RPC protocol 3
])
def test_main_devices_for_the_baseline(dev, default, local):
    assert local_devices(["/b/llama-server", "-dev", dev, "-m", "/t"], default) == local


def test_placement_lines_name_what_runs_where():
    assert describe_placement(SPECULATIVE) == "target on RPC1, draft on RPC0"
    assert describe_placement(shlex.split("/b/llama-server --rpc 127.0.0.1:15052 -dev none -m /t -md /d "
                                          "-devd RPC0")) == "target on main's CPU (-dev none), draft on RPC0"
    assert describe_placement(SPLIT) == "target on RPC0,RPC1 (-ts 1,3) and main's CPU (-ngl 8), no draft"


# ---- fit ---------------------------------------------------------------------------------------
MEMINFO = "MemTotal:       16314444 kB\nMemFree:         1000000 kB\nMemAvailable:    8388608 kB\n"


def test_a_model_too_big_for_main_is_not_run_and_both_figures_are_said():
    fig = meminfo_figure(MEMINFO)
    assert fig == ("RAM (MemAvailable)", 8 * GIB, 16314444 * 1024)
    fit = fit_on_main(30 * GIB, memory_fit.ModelShape(n_layer=64, n_embd=5120, n_head=40, n_head_kv=8,
                                                   n_vocab=152064), 4096, [fig])
    assert fit["fits"] is False and fit["level"] == "refuse"
    assert fit["free_mib"] == 8192 and fit["need_mib"] > 30 * 1024
    assert f"needs {fit['need_mib']} MiB" in fit["message"] and "8192 MiB free" in fit["message"]
    assert fit["message"].startswith("main: the target does not fit")


def test_a_small_model_fits_main():
    fit = fit_on_main(512 * 2**20, None, None, [meminfo_figure(MEMINFO)])
    assert fit["fits"] is True and fit["level"] == "ok" and fit["need_mib"] < 1024


def test_gpu_figures_come_from_main_s_device_listing():
    listing = "Available devices:\n  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23600 MiB free)\n"
    found, missing = device_figures(listing, "CUDA0,CUDA1")
    assert found == [("CUDA0", 23600 * 2**20, 24080 * 2**20)] and missing == ["CUDA1"]
    assert fit_on_main(30 * GIB, None, None, found)["fits"] is False


# ---- load time and context from the journal (captured: the lab's b11434 llama-server) ----------
JOURNAL = (DATA / "journal-b11434-speculative.txt").read_text()


def test_load_time_from_llama_server_s_own_timestamp():
    text = ("MainPID=3486\nInvocationID=0123abcd\nExecMainStartTimestampMonotonic=8061441490\n"
            "-- journal --\n" + JOURNAL)
    run = parse_unit_run(text)
    assert (run["pid"], run["invocation"], run["start_us"]) == (3486, "0123abcd", 8061441490)
    assert load_time(run["journal"], run["start_us"]) == {"seconds": 0.335, "source": "llama-server's log timestamp"}
    assert journal_n_ctx(run["journal"]) == 512


def test_load_time_falls_back_to_the_journal_clock_then_unknown():
    # The same line without llama-server's own timestamp (a build logging without it).
    line = "[ 8061.878293] main llama-server[3486]: srv  llama_server: model loaded\n"
    assert load_time(line, 8061441490) == {"seconds": 0.437, "source": "journal: main process start to 'model loaded'"}
    unknown = load_time("[ 8061.1] main llama-server[3486]: loading\n", 8061441490)
    assert unknown["seconds"] is None and "no 'model loaded'" in unknown["why"]
    assert parse_unit_run("MainPID=0\n")["pid"] == 0


def test_side_figures_are_medians_and_sums_of_the_timings():
    rows = [{"prompt_per_second": 100.0, "predicted_per_second": 10.0, "prompt_ms": 200, "predicted_ms": 3000,
             "draft_n": 10, "draft_n_accepted": 8, "predicted_n": 32, "prompt_n": 20},
            {"prompt_per_second": 300.0, "predicted_per_second": 30.0, "prompt_ms": 100, "predicted_ms": 1000,
             "draft_n": 12, "draft_n_accepted": 12, "predicted_n": 32, "prompt_n": 20},
            {"prompt_per_second": 200.0, "predicted_per_second": 20.0, "prompt_ms": 100, "predicted_ms": 1600}]
    s = side_figures(rows)
    assert (s["prompt_per_second"], s["predicted_per_second"]) == (200.0, 20.0)
    assert (s["draft_n"], s["draft_n_accepted"], s["completion_seconds"]) == (22, 20, 6.0)


# ---- the sampler's parsers on captured /proc text -----------------------------------------------
def _captured_threads() -> dict[str, str]:
    lines = [l for l in (DATA / "proc-task-syscall.txt").read_text().splitlines() if not l.startswith("#")]
    return dict(l.split(" ", 1) for l in lines)


def test_syscall_lines_blocked_in_recv_only():
    threads = _captured_threads()
    fd, link = (DATA / "proc-fd-link.txt").read_text().split("\n")[0].split()
    assert sampler.parse_syscall(threads["0"], "x86_64") == ("recvfrom", int(fd))
    assert sampler.parse_syscall(threads["10"], "x86_64") is None  # futex: a lock, not the network
    assert sampler.parse_syscall(threads["11"], "x86_64") is None  # running
    assert sampler.parse_syscall("-1 0x7ffd 0x7f5a", "x86_64") is None
    assert sampler.parse_syscall(threads["0"], "riscv64") is None  # unknown numbers: never guessed
    assert sampler.parse_syscall("207 0x9 0x0 0x0 0x0 0x0 0x0 0x0 0x0", "aarch64") == ("recvfrom", 9)


def test_net_tcp_maps_the_socket_to_its_remote_port():
    fd_line, port_line = (DATA / "proc-fd-link.txt").read_text().splitlines()[:2]
    inode = sampler.socket_inode(fd_line.split()[1])
    remote = int(port_line.split()[-1])
    table = sampler.parse_net_tcp((DATA / "proc-net-tcp.txt").read_text())
    assert table[inode][1] == remote
    assert sampler.socket_inode("pipe:[123]") is None and sampler.socket_inode("/dev/null") is None


def test_sampler_result_becomes_seconds_share_and_nodes():
    out = "ready\n" + json.dumps({"samples": 2000, "waiting": 600, "waiting_s": 0.6, "elapsed_s": 2.0,
                                  "by_port": {"15052": 0.5, "15053": 0.1}, "stopped": "eof", "error": None})
    w = summarize(out, {15052: "rpc-a", 15053: "rpc-b"}, 1.5)
    assert (w["seconds"], w["share"], w["of_seconds"]) == (0.6, 0.4, 1.5)
    assert w["by_node"] == {"rpc-a": 0.5, "rpc-b": 0.1} and w["interval_s"] == 0.001
    assert summarize("ready\n" + json.dumps({"error": "cannot read"}), {}, 1.0) == {"seconds": None, "why": "cannot read"}
    lost = summarize("Traceback (most recent call last):\n  boom", {}, 1.0)
    assert lost["seconds"] is None and "boom" in lost["why"]


# ---- output --------------------------------------------------------------------------------------
def _side(**kw):
    base = {"runs": 3, "prompt_per_second": 410.5, "predicted_per_second": 42.25, "draft_n": 0, "draft_n_accepted": 0,
            "completion_seconds": 2.0, "load": {"seconds": 1.5, "source": "llama-server's log timestamp"},
            "network_wait": {"seconds": 0.0, "share": 0.0, "why": "no --rpc: no tunnel to wait on"}}
    return {**base, **kw}


def _result(baseline: dict) -> dict:
    deployed = _side(kind="split", placement="target on RPC0,RPC1 (-ts 1,3) and main's CPU (-ngl 8), no draft",
                     predicted_per_second=21.0, network_wait={"seconds": 0.8, "share": 0.4, "of_seconds": 2.0, "by_node": {"rpc-a": 0.3, "rpc-b": 0.5}})
    return {"schema": SCHEMA, "prompt": "Write a story", "n_predict": 64, "runs": 3, "deployed": deployed,
            "baseline": baseline, "speedup": 0.5 if baseline.get("ran") else None}


def test_human_table_puts_both_sides_side_by_side():
    b = {"kind": "main_alone", "title": "main alone", "ran": True, **_side(placement="-dev none, no RPC"),
         "ready_seconds": 2.25}
    text = render(_result(b))
    lines = text.splitlines()
    header = lines[1]
    assert "as deployed (split)" in header and "main alone" in header
    row = {l.split("  ")[0].strip(): l for l in lines[2:8]}
    assert "1.50 s" in row["load time"] and "/health 2.25 s" in row["load time"]
    assert "21.0" in row["generation tok/s"] and "42.2" in row["generation tok/s"]
    assert "0.80 s (40% of 2.00 s)" in row["network wait"] and "0 (no RPC)" in row["network wait"]
    assert "rpc-a 0.30 s, rpc-b 0.50 s" in text and "0.50x" in text


def test_human_and_json_say_why_main_alone_did_not_run():
    msg = "main: the target does not fit: the target needs 31000 MiB (…); main reports 8192 MiB free (…)"
    b = {"kind": "main_alone", "title": "main alone", "ran": False, "why": msg,
         "fit": {"fits": False, "level": "refuse", "need_mib": 31000, "free_mib": 8192, "message": msg}}
    r = _result(b)
    text = render(r)
    assert "not run (see below)" in text and f"main alone not run: {msg}" in text
    doc = json.loads(json.dumps(r, sort_keys=True))
    assert doc["schema"] == 2 and doc["baseline"]["fit"]["need_mib"] == 31000 and doc["baseline"]["ran"] is False
    assert exit_code(r) == 0 and exit_code({**r, "baseline": {**b, "error": "did not load"}}) == 1
