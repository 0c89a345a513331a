"""What the tests share, under one import name each (`from support.cli import tunnelspec`).

tests/conftest.py puts tests/ on sys.path; nothing else does, and no test module imports another.
- cli: run the real CLI in a subprocess and read its JSON events; failed_report for assertions.
- ci_cli: run the CLI the way CI does (no tty, no agent, an empty HOME).
- sshd_harness: real OpenSSH sshd hosts on 127.0.0.1.
- sudo_users: real non-root users with sudoers entries (the become tests).
- guarded: a loopback server that lets only uid 0 in, as the hosts' nftables rules do.
- hub_standin: a stand-in for the Hugging Face Hub on 127.0.0.1.
- files: the on-disk state of files (what a cached call must not touch).
- labdeploy: the lab tests' deploys, inventories and serving proofs.
- labtunnel: the tunnel's key, ports and the RPC HELLO probe run on a lab host.
- placement: llama.cpp's layer rule and the 1:3 placement check (lab and local tests).
"""
