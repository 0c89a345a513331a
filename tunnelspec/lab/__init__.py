"""The systemd-nspawn lab: real hosts on one Linux machine (see lab.py)."""

from tunnelspec.lab.host import HostStatus
from tunnelspec.lab.lab import DEFAULT_BRIDGE, DEFAULT_HOSTS, DEFAULT_SUBNET, Lab

__all__ = ["Lab", "HostStatus", "DEFAULT_HOSTS", "DEFAULT_SUBNET", "DEFAULT_BRIDGE"]
