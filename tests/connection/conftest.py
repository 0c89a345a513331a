"""Fixtures of the connection tests: sshd hosts that real non-root users can log in to, and those
users (support/sudo_users.py), removed at teardown."""

from __future__ import annotations

import pytest


@pytest.fixture
def user_cluster(tmp_path):
    """Factory: user_cluster(**kw) → an SshdCluster of one host that also reads ~/.ssh/authorized_keys."""
    from support.sshd_harness import SshdCluster

    made = []

    def make(**kw):
        c = SshdCluster(tmp_path / f"sshd-{len(made)}", 1, user_keys=True, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def sudo_user():
    """Factory: sudo_user(policy, client_pub, password=None) → a real user (support/sudo_users.py)."""
    from support.sudo_users import make_user, remove_user

    made = []

    def make(policy, client_pub=None, password=None):
        u = make_user(policy, client_pub, password)
        made.append(u)
        return u

    yield make
    for u in made:
        remove_user(u)
