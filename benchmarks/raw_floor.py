"""The floor a no-op run cannot beat: one Python process that opens asyncssh connections to every
host (in parallel, host keys verified) and runs 8 trivial commands per host, hosts in parallel.

    python benchmarks/raw_floor.py HOSTS.json
HOSTS.json: {"key": path, "known_hosts": path, "hosts": [{"address": ..., "port": ..., "user": ...}]}
Timed by benchmarks/noop.py as a whole process, so interpreter start and imports count.
"""

import asyncio
import json
import sys

import asyncssh

COMMANDS_PER_HOST = 8


async def one(h: dict, key: str, known_hosts: str) -> None:
    async with asyncssh.connect(h["address"], port=h["port"], username=h["user"], client_keys=[key],
                                known_hosts=known_hosts, config=None) as conn:
        for _ in range(COMMANDS_PER_HOST):
            res = await conn.run("true", check=True)
            assert res.exit_status == 0


async def main(spec: dict) -> None:
    await asyncio.gather(*(one(h, spec["key"], spec["known_hosts"]) for h in spec["hosts"]))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        asyncio.run(main(json.load(f)))
