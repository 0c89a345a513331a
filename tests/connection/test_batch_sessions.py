"""A host whose sshd allows fewer sessions per connection than a batch's parts (connection/probes.py
`parts`): a real OpenSSH sshd on 127.0.0.1 with MaxSessions 2."""

from __future__ import annotations

import asyncio

from tunnelspec.connection import factory
from tunnelspec.connection.base import ConnectOptions
from tunnelspec.connection.probes import PER_SESSION, parts

from support.side_by_side import waiter_and_maker

FILLER = [["echo", str(i)] for i in range(PER_SESSION + 3)]


def test_a_host_that_refuses_a_third_session_gets_one_per_batch(tmp_path):
    """A real sshd allowing two sessions per connection (MaxSessions 2, where the default is 10): a
    batch of three parts has one refused, runs again in one session and answers every probe; the
    next batch asks for one session only."""
    from support.sshd_harness import SshdCluster

    c = SshdCluster(tmp_path / "sshd", 1, extra_config=("Match Address 127.0.0.1", "  MaxSessions 2"))
    hv = {"ansible_host": "127.0.0.1", "ansible_port": c.hosts[0].port, "ansible_user": "root",
          "ansible_ssh_private_key_file": str(c.key)}

    async def go():
        conn = await factory.connect("node0", hv, ConnectOptions(known_hosts=str(c.known_hosts), use_ssh_config=False))
        try:
            want = [await conn.run(a) for a in FILLER]
            more = [["echo", "more", str(i)] for i in range(PER_SESSION)]
            probes = [*waiter_and_maker(tmp_path / "flag", 4), *FILLER, *more]
            assert len(parts(len(probes))) == 3
            assert await conn.prefetch(probes) == len(probes)  # every probe answered
            got = [await conn.probe(a) for a in FILLER]
            for w, g in zip(want, got):
                assert (g.rc, g.stdout_bytes) == (w.rc, w.stdout_bytes)
            assert conn._batch_sessions == 1
            # The next batch: one session, its probes one after another.
            await conn.run(["true"])
            assert await conn.prefetch([*waiter_and_maker(tmp_path / "flag2", 4), *more]) == len(more) + 2
            return [await conn.probe(a) for a in waiter_and_maker(tmp_path / "flag2", 4)]
        finally:
            await conn.close()

    try:
        waited, made = asyncio.run(go())
    finally:
        c.stop()
    assert (waited.stdout, made.stdout) == ("never\n", "made\n")  # one session: one after another
