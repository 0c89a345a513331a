"""ansible_ssh_common_args / ansible_ssh_extra_args read into what the client does (core/ssh_args.py):
each argument carried out or refused with its reason, never accepted and ignored."""

from __future__ import annotations

import pytest

from tunnelspec.core.ssh_args import Hop, SshArgsError, combined, parse


@pytest.mark.parametrize("text,hops", [
    ("-o ProxyJump=bastion", (Hop("bastion"),)),
    ("-o ProxyJump=admin@10.0.0.1:2222", (Hop("10.0.0.1", 2222, "admin"),)),
    ("-oProxyJump=a,b@c:23", (Hop("a"), Hop("c", 23, "b"))),
    ("-J admin@jump", (Hop("jump", None, "admin"),)),
    ("-Jjump:2200", (Hop("jump", 2200),)),
    ("-o 'ProxyJump ssh://u@j:2022'", (Hop("j", 2022, "u"),)),
    ("-o ProxyJump=[fd00::1]:22", (Hop("fd00::1", 22),)),
    ("-o ProxyJump=none", ()),
    ('-o ProxyCommand="ssh -W %h:%p -q admin@bastion"', (Hop("bastion", None, "admin"),)),
    ("-o ProxyCommand='ssh -p 2222 -l ops -W %h:%p bastion'", (Hop("bastion", 2222, "ops"),)),
    # OpenSSH: the first value given for an option wins
    ("-J first -o ProxyJump=second", (Hop("first"),)),
])
def test_jump_hosts_are_read_as_openssh_reads_them(text, hops):
    assert parse(text).jump == hops


def test_the_other_options_carried_out():
    a = parse("-C -o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes "
              "-o ConnectTimeout=4 -o ServerAliveInterval=5 -o ServerAliveCountMax=2")
    assert (a.jump, a.connect_timeout, a.keepalive_interval, a.keepalive_count_max) == ((), 4.0, 5.0, 2)


@pytest.mark.parametrize("text,reason", [
    ("-o StrictHostKeyChecking=no", "refused: tunnelspec always checks host keys"),
    ("-o StrictHostKeyChecking=accept-new", "--accept-new-host-keys"),
    ("-o UserKnownHostsFile=/dev/null", "write tunnelspec_known_hosts instead"),
    ("-o ForwardAgent=yes", "-o ForwardAgent=yes: not an option tunnelspec carries out"),
    ("-A", "'-A': not an ssh argument tunnelspec carries out"),
    ("-o ProxyCommand='nc -X 5 -x proxy:1080 %h %p'", "runs no local command"),
    ("-o ProxyJump=-oProxyCommand=x", "not a host name"),
    ("-o ProxyJump=a:99999", "the port must be 1..65535"),
    ("-o ConnectTimeout=soon", "must be a number of seconds"),
    ("-o ServerAliveCountMax=1.5", "must be a whole number"),
    ("-o", "-o needs a value"),
    ("-o 'ProxyJump=a", "cannot split"),
])
def test_what_cannot_be_carried_out_is_refused_with_the_reason(text, reason):
    with pytest.raises(SshArgsError, match=reason) as err:
        parse(text)
    assert err.value.exit_code == 2


def test_common_args_come_before_extra_args():
    a = combined("-o ProxyJump=common -o ConnectTimeout=3", "-J extra -o ConnectTimeout=9 -o ServerAliveInterval=7")
    assert (a.jump, a.connect_timeout, a.keepalive_interval) == ((Hop("common"),), 3.0, 7.0)
    assert combined(None, "-J extra").jump == (Hop("extra"),)
    assert combined(None, None).jump == ()
