from __future__ import annotations

import pytest

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import advisories, versions

HEADER = """#pragma once
#define RPC_PROTO_MAJOR_VERSION    7
#define RPC_PROTO_MINOR_VERSION    0
#define RPC_PROTO_PATCH_VERSION    0
"""


def test_rpc_proto_version_from_header_text():
    assert versions.rpc_proto_version(HEADER) == (7, 0, 0)
    assert versions.rpc_proto_version(HEADER.replace("MINOR_VERSION    0", "MINOR_VERSION 12")) == (7, 12, 0)


def test_rpc_proto_version_missing_part_is_an_error():
    with pytest.raises(TaskFailed, match="PATCH"):
        versions.rpc_proto_version(HEADER.replace("#define RPC_PROTO_PATCH_VERSION    0", ""))


def test_rpc_server_target_old_and_new_names():
    assert versions.rpc_server_target("set(TARGET ggml-rpc-server)\nadd_executable(${TARGET} x.cpp)") == "ggml-rpc-server"
    assert versions.rpc_server_target("set(TARGET rpc-server)\n") == "rpc-server"
    with pytest.raises(TaskFailed):
        versions.rpc_server_target("set(TARGET llama-cli)\n")


def ids(build):
    return {(f.advisory.id, f.verdict) for f in advisories.check(build).findings}


@pytest.mark.parametrize("build, expected", [
    (3560, {("GHSA-j8rj-fmpv-wcxw", "affected"), ("CVE-2024-42477/8/9", "affected")}),
    (3561, {("GHSA-j8rj-fmpv-wcxw", "affected")}),
    (8491, {("GHSA-j8rj-fmpv-wcxw", "affected")}),
    (8492, {("PR-21030-regression", "possible")}),
    (8840, {("PR-21030-regression", "possible")}),
    (8841, {("CVE-2026-118375", "mitigated")}),
    (11449, {("CVE-2026-118375", "mitigated")}),
    (11450, {("CVE-2026-118375", "mitigated"), ("CVE-2026-137567", "affected")}),
    (11864, {("CVE-2026-118375", "mitigated"), ("CVE-2026-137567", "affected")}),
    (11865, {("CVE-2026-137567", "affected")}),
    (12657, {("CVE-2026-137567", "affected")}),
    (12658, set()),
])
def test_boundaries(build, expected):
    assert ids(build) == expected


def test_rdma_enabled_build_is_affected_not_mitigated():
    found = advisories.check(9000, rdma=True)
    assert found.verdict == advisories.AFFECTED
    assert [a.id for a in found.advisories] == ["CVE-2026-118375"]


def test_verdicts():
    assert advisories.check(12658).verdict == advisories.CLEAN
    assert advisories.check(8500).verdict == advisories.POSSIBLE
    assert advisories.check(9000).verdict == advisories.MITIGATED
    assert advisories.check(12000).verdict == advisories.AFFECTED


def test_unknown_build_is_unknown_not_clean():
    res = advisories.check(None)
    assert res.verdict == advisories.UNKNOWN
    assert res.findings == []
    assert "unknown" in res.message


def test_table_lists_every_advisory():
    table = advisories.format_table()
    for adv in advisories.ADVISORIES:
        assert adv.id in table
    assert "< b8492" in table and "b11450 to < b12658" in table
