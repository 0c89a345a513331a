"""llama_server_links: which of llama-server's RPC connections the other end has closed (pure parts;
the restart itself is exercised in the lab, tests/deploy/test_resilience.py)."""

from tunnelspec.facts.sockets import parse_close_wait
from tunnelspec.components.server.links import dead_links

SS = """\
1      0      127.0.0.1:41234 127.0.0.1:15052 users:(("llama-server",pid=2211,fd=17))
0      0      127.0.0.1:41240 127.0.0.1:15053 users:(("llama-server",pid=2211,fd=18))
0      0      127.0.0.1:50000 127.0.0.1:15054 users:(("llama-server",pid=999,fd=3))
0      0      [::1]:40000     [::1]:15052     users:(("curl",pid=2211,fd=3))
0      0      10.77.0.2:41000 10.77.0.3:22    users:(("ssh",pid=300,fd=3))
"""


def test_close_wait_lines_parsed_with_their_processes():
    rows = parse_close_wait(SS)
    assert [(r.peer, r.peer_port, r.pids) for r in rows[:2]] == [("127.0.0.1", 15052, (2211,)),
                                                                  ("127.0.0.1", 15053, (2211,))]
    assert rows[3].peer == "::1"
    assert parse_close_wait("") == []


def test_only_llama_servers_own_connections_to_its_tunnel_ports_count():
    rows = parse_close_wait(SS)
    assert dead_links(rows, 2211, [15052]) == [15052]
    assert dead_links(rows, 2211, [15052, 15053, 15054]) == [15052, 15053]  # 15054 is another process's
    assert dead_links(rows, 4242, [15052, 15053]) == []                     # not the running llama-server
    assert dead_links(rows, 2211, [22]) == []                               # ssh to a node is not an RPC link
