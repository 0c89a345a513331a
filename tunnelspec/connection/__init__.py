"""Connections to hosts: one interface, asyncssh for remote hosts, subprocess for local."""

from tunnelspec.connection.base import Connection, ConnectOptions, ConnectSession, Result
from tunnelspec.connection.factory import connect

__all__ = ["Connection", "ConnectOptions", "ConnectSession", "Result", "connect"]
