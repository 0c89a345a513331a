"""TLS for llama-server's API when it leaves loopback: the inventory's CA (ca.py), a user's own
certificate files (own.py) and the pinned-CA client openers (client.py). See docs/tls.md."""
