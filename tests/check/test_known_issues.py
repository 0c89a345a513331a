"""Open upstream failure modes refused offline for the pinned build (llama/known_issues.py): `check`
names the llama.cpp issue and what to do when the inventory's topology triggers one on a build it was
reported on; a later build with no fix released (unconfirmed) or a build whose status is not known is a
warning; a build at or after the fix says nothing."""

from __future__ import annotations

import pytest

from tunnelspec.commands.check import check_inventory
from tunnelspec.llama import known_issues as ki

HEAD = """[main]
main-host ansible_host=192.0.2.10

[rpc]
{nodes}

[all:vars]
ansible_user=root
llama_repo=https://github.com/ggml-org/llama.cpp
llama_commit="0123456789abcdef0123456789abcdef01234567"
llama_model=/srv/models/target.gguf
llama_draft_model=/srv/models/draft.gguf
{more}
"""
TWO = "node-a ansible_host=192.0.2.11\nnode-b ansible_host=192.0.2.12 rpc_role=target"
THREE = TWO + "\nnode-c ansible_host=192.0.2.13 rpc_role=target"


def check(tmp_path, nodes: str, more: str = ""):
    path = tmp_path / "inventory.ini"
    path.write_text(HEAD.format(nodes=nodes, more=more))
    return path, check_inventory(str(path), controller_git=False)


def test_three_rpc_endpoints_on_a_build_reported_to_deadlock_are_refused_with_the_issue_and_the_way_out(tmp_path):
    path, report = check(tmp_path, THREE, "llama_build_number=10819")
    [err] = report.errors
    assert err.message.startswith(f"{path}:15: ") and err.host == "main-host" and err.var == "llama_build_number"
    assert ("llama.cpp issue 28487: llama-server deadlocks within minutes with 3 or more RPC endpoints "
            "(affected: reported on b10620–b10819, no fix released); b10819 is affected: use at most 2 rpc "
            "nodes, or pin a build after b10819 (rpc nodes: node-a, node-b, node-c") in err.message
    assert report.exit_code() == 2
    # The refused line is left out of the plan, but not read as "no build pinned": no second word on it.
    assert not [w for w in report.warnings if "28487" in w.message], report.warnings


@pytest.mark.parametrize("build", [10620, 10751, 10819])
def test_every_build_reported_is_refused(tmp_path, build):
    _, report = check(tmp_path, THREE, f"llama_build_number={build}")
    assert [e for e in report.errors if "issue 28487" in e.message and f"b{build} is affected" in e.message]


def test_three_rpc_endpoints_on_the_pinned_build_are_a_warning_with_the_labs_run(tmp_path):
    # b11434 (the build tunnelspec pins) is later than any report, with no fix released: served with 3
    # endpoints in the lab, so a warning that says so, not a refusal.
    path, report = check(tmp_path, THREE, "llama_build_number=11434")
    assert report.errors == [] and report.exit_code() == 0
    [warning] = [w for w in report.warnings if "issue 28487" in w.message]
    assert warning.message.startswith(f"{path}:15: ") and warning.var == "llama_build_number"
    assert ("llama.cpp issue 28487: llama-server deadlocks within minutes with 3 or more RPC endpoints "
            "(affected: reported on b10620–b10819, no fix released); b11434 is later than any build reported "
            "and not known to be fixed: not reproduced in tunnelspec's lab on b11434 (1454 completions with "
            "3 endpoints and 4 clients); a completion that makes no progress is reported naming this issue (verify, bench)"
            ) in warning.message


def test_two_endpoints_or_an_unpinned_or_older_build(tmp_path):
    for build in (10819, 11434):
        _, report = check(tmp_path, TWO, f"llama_build_number={build}")
        assert report.errors == [] and report.warnings == []
    _, report = check(tmp_path, THREE)  # no build number: not known, a warning
    assert report.errors == []
    assert [w for w in report.warnings if "issue 28487" in w.message and "is not known" in w.message]
    for build in (9093, 10000):  # older than any report: not known
        _, report = check(tmp_path, THREE, f"llama_build_number={build}")
        assert report.errors == []
        [warning] = [w for w in report.warnings if "issue 28487" in w.message]
        assert f"whether b{build} is affected is not known" in warning.message


def test_the_rpc_deadlocks_statuses_by_build():
    [issue] = [i for i in ki.ISSUES if i.number == 28487]
    builds = (None, 10000, 10619, 10620, 10751, 10819, 10820, 11434)
    assert [issue.status(b) for b in builds] == [ki.UNKNOWN, ki.UNKNOWN, ki.UNKNOWN, ki.AFFECTED, ki.AFFECTED,
                                                 ki.AFFECTED, ki.UNCONFIRMED, ki.UNCONFIRMED]


def test_a_completion_without_progress_names_the_issue_on_three_endpoints_only():
    assert ki.no_progress(2, "no answer within 120 s", "llama.service") == ""
    msg = ki.no_progress(3, "no answer within 120 s", "llama.service")
    assert msg.startswith("no answer within 120 s, with 3 RPC endpoints: this looks like llama.cpp issue 28487 ")
    assert "`systemctl restart llama.service` on main" in msg and "at most 2 rpc nodes" in msg


def test_draft_mtp_with_its_separate_head_is_not_refused_on_b11434(tmp_path):
    # The lab serves draft-mtp with a separate MTP file from -md on b11434: issue 27850 is a mixed
    # --spec-type list, which tunnelspec's one spec_type never passes.
    _, report = check(tmp_path, TWO, "llama_build_number=11434\nspec_type=draft-mtp")
    assert report.errors == [] and not [w for w in report.warnings if "27850" in w.message]


@pytest.mark.parametrize(("types", "triggered"), [
    (("draft-mtp",), False),
    (("draft-mtp", "draft-dflash"), True),
    (("draft-simple", "draft-mtp", "ngram-mod"), True),
    (("draft-dflash", "ngram-mod"), False),
])
def test_issue_27850_is_a_list_mixing_draft_mtp_with_a_draft_model_type(types, triggered):
    [issue] = [i for i in ki.ISSUES if i.number == 27850]
    assert issue.triggered(ki.Topology(rpc_endpoints=1, spec_types=types, draft_model=True)) is triggered
    assert not issue.triggered(ki.Topology(rpc_endpoints=1, spec_types=types, draft_model=False))
    # No build range is known: a warning at most, never a refusal.
    refused, warned = ki.findings(ki.Topology(1, types, True), 11434)
    assert refused == [] and bool(warned) is triggered


def test_a_build_at_or_after_the_fix_is_not_refused():
    issue = ki.KnownIssue(1, "x", "y", first_bad=100, fixed=200, instead="z")
    assert [issue.status(b) for b in (None, 99, 100, 199, 200)] == [ki.UNKNOWN, ki.UNKNOWN, ki.AFFECTED,
                                                                     ki.AFFECTED, ki.FIXED]
    # A range closed at the last build reported: later unfixed builds are unconfirmed, the fix still wins.
    issue = ki.KnownIssue(1, "x", "y", first_bad=100, fixed=200, instead="z", last_reported=150)
    assert [issue.status(b) for b in (99, 100, 150, 151, 199, 200)] == [ki.UNKNOWN, ki.AFFECTED, ki.AFFECTED,
                                                                         ki.UNCONFIRMED, ki.UNCONFIRMED, ki.FIXED]
