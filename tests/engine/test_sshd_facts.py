"""facts/sshd.py's pure parsers (moved out of the lab file: they need no lab)."""

from __future__ import annotations


def test_sshd_includes_only_unconditional_ones():
    from tunnelspec.facts.sshd import sshd_includes

    text = ("# Include /etc/ssh/commented/*.conf\n  include sshd_config.d/*.conf other.conf # trailing\n"
            "Port 22\nMatch User x\nInclude /etc/ssh/conditional/*.conf\n")
    assert sshd_includes(text) == ["/etc/ssh/sshd_config.d/*.conf", "/etc/ssh/other.conf"]
    assert sshd_includes("PermitRootLogin no\n") == []


def test_parse_sshd_T_keeps_the_first_value():
    from tunnelspec.facts.sshd import parse_sshd_T

    got = parse_sshd_T("clientaliveinterval 5\npermitlisten none\nsubsystem sftp /usr/lib/sftp\nclientaliveinterval 9\n")
    assert got == {"clientaliveinterval": "5", "permitlisten": "none", "subsystem": "sftp /usr/lib/sftp"}
