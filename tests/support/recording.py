"""A real local host (LocalConnection: commands run on this machine) that keeps every command it ran,
for tests that count what a check sends to a host."""

from __future__ import annotations

from tunnelspec.connection.local import LocalConnection


class RecordingConnection(LocalConnection):
    def __init__(self, name: str = "main") -> None:
        super().__init__(name)
        self.ran: list[list[str]] = []

    async def _exec(self, argv, input, timeout):
        self.ran.append(list(argv))
        return await super()._exec(argv, input, timeout)

    def programs(self) -> list[str]:
        return [a[0] for a in self.ran]
