"""TLS for the API when it leaves loopback, terminated by the front (HAProxy) on main: the
inventory's CA (ca.py), a user's own certificate files (own.py), the pinned-CA client openers
(client.py) and how tunnelspec's own commands reach the API (reach.py). See docs/tls.md."""
