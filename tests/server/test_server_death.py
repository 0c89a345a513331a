"""Reading a dead llama-server's journal and unit state (pure parsers; the lab test kills a real one)."""

from __future__ import annotations

from tunnelspec.components.server import death as sd
from tunnelspec.components.build import upgrade as llama_upgrade

# The shape of a real abort on a dead RPC socket: ggml's assert, then systemd's report.
JOURNAL = """\
srv  update_slots: all slots are idle
/opt/tunnelspec/src/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:612: GGML_ASSERT(status) failed
[New LWP 4242]
tunnelspec-llama-server.service: Main process exited, code=dumped, status=6/ABRT
tunnelspec-llama-server.service: Failed with result 'core-dump'.
tunnelspec-llama-server.service: Scheduled restart job, restart counter is at 1.
"""
PROPS = {"ActiveState": "activating", "SubState": "auto-restart", "Result": "core-dump", "ExecMainCode": "3",
         "ExecMainStatus": "6", "NRestarts": "1"}


def test_abort_line_prefers_the_cause_over_the_signal():
    assert sd.abort_line(JOURNAL).endswith("GGML_ASSERT(status) failed")
    assert sd.abort_line("tunnelspec-llama-server.service: Main process exited, code=killed, status=9/KILL\n") \
        == "tunnelspec-llama-server.service: Main process exited, code=killed, status=9/KILL"
    assert sd.abort_line("srv  update_slots: all slots are idle\n") is None
    # GGML_ABORT("…") prints file:line: message (b9093's RPC_STATUS_ASSERT on a dead RPC socket).
    line = "/opt/t/src/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:576: Remote RPC server crashed or returned malformed response"
    assert sd.abort_line(f"x\n{line}\nsystemd: Main process exited, code=dumped, status=6/ABRT\n") == line


def test_describe_names_cause_state_and_exit():
    text = sd.describe_from("completion failed: not an HTTP response", PROPS, JOURNAL)
    assert text.startswith("completion failed: not an HTTP response: llama-server died: ")
    assert "GGML_ASSERT(status) failed" in text
    assert "unit tunnelspec-llama-server.service activating/auto-restart, result core-dump" in text
    assert "dumped core (status 6), restarted 1 time(s)" in text
    assert "code=dumped, status=6/ABRT" in text


def test_describe_without_abort_shows_the_journal_tail():
    props = {"ActiveState": "active", "SubState": "running", "Result": "success", "ExecMainCode": "0",
             "ExecMainStatus": "0", "NRestarts": "0"}
    text = sd.describe_from("not healthy", props, "line a\nline b\n")
    assert "died" not in text and text.endswith("line a\nline b") and "restarted" not in text


def test_quiesce_state_parser():
    assert llama_upgrade.parse_state("pid 0\ncurrent /opt/t/build/k2/bin/llama-server\n") == (
        None, "/opt/t/build/k2/bin/llama-server")
    run, cur = llama_upgrade.parse_state("pid 7\nrunning /opt/t/build/k1/bin/llama-server (deleted)\n"
                                         "current /opt/t/build/k2/bin/llama-server\n")
    assert (run, cur) == ("/opt/t/build/k1/bin/llama-server", "/opt/t/build/k2/bin/llama-server")


def test_issue_25719_warning_only_when_n_max_is_imposed_beyond_the_slots():
    from tunnelspec.llama import known_bugs as kb

    assert kb.draft_n_max_warnings(None, 1, "b11434") == []  # unset: the build's own default
    assert kb.draft_n_max_warnings(3, 4, "b11434") == []
    (w,) = kb.draft_n_max_warnings(16, 4, "b11434 (build 11434)")
    assert "llama.cpp issue 25719" in w and "spec_draft_n_max=16" in w and "4 parallel slot(s)" in w
    assert kb.draft_n_max_warnings(4, None, "b")[0].count("auto") == 1
    assert kb.n_parallel(["-c", "256", "-np", "2"], -1) == 2
    assert kb.n_parallel(["--parallel=3"], None) == 3
    assert kb.n_parallel([], -1) is None and kb.n_parallel([], 4) == 4


# ---- a llama-server that dies while loading ---------------------------------------------------------
ABORT_JOURNAL = """\
llama_model_loader: loaded meta data with 24 key-value pairs
tunnelspec-test: refusing to load the model (a deliberate abort)
tunnelspec-llama-server.service: Main process exited, code=killed, status=6/ABRT
tunnelspec-llama-server.service: Failed with result 'signal'.
tunnelspec-llama-server.service: Scheduled restart job, restart counter is at 4.
Started tunnelspec-llama-server.service - tunnelspec llama-server.
"""


def test_a_signal_death_is_told_with_the_process_last_line():
    assert sd.last_words(ABORT_JOURNAL) == "tunnelspec-test: refusing to load the model (a deliberate abort)"
    props = {"ActiveState": "activating", "SubState": "auto-restart", "Result": "signal", "ExecMainCode": "2",
             "ExecMainStatus": "6", "NRestarts": "4"}
    text = sd.describe_from("not healthy", props, ABORT_JOURNAL)
    assert "llama-server died: tunnelspec-test: refusing to load the model" in text
    assert "systemd: tunnelspec-llama-server.service: Main process exited, code=killed, status=6/ABRT" in text
    # A cause llama.cpp names itself still wins (GGML_ASSERT), as before.
    assert sd.last_words("x\ntunnelspec-llama-server.service: Main process exited, code=killed, status=9/KILL\n") == "x"
    assert sd.last_words("only systemd: Main process exited, code=killed, status=9/KILL\n") is None


def test_crash_loop_is_two_signal_deaths_or_three_restarts():
    base = {"NRestarts": "1", "ExecMainCode": "2"}
    assert not sd.crash_loop(base, {"NRestarts": "2", "ExecMainCode": "2"})
    assert sd.crash_loop(base, {"NRestarts": "3", "ExecMainCode": "2"})
    assert not sd.crash_loop(base, {"NRestarts": "3", "ExecMainCode": "1"})   # clean exits: the launcher waiting
    assert sd.crash_loop(base, {"NRestarts": "4", "ExecMainCode": "1"})
    assert not sd.crash_loop({}, {"NRestarts": "x"})
