"""kas' tunnel tracker under a connection storm: N agents' first tunnels registered at once (issue 28 item 5).

Usage: ``uv run python bench/tracker_registrations.py [--agents 10000] [--rounds 3]``

One ``TunnelTracker`` on a real ``redis-server`` (started here) registers ``--agents`` new agents concurrently, as
kas does when that many agents connect at once: each registration is the tracker write and its
``TunnelsAvailable`` event. Prints, per round, the wall time and this process' CPU time (the kas side of the
work; Redis runs in its own process). Nothing is recorded: the figure compares two trees in one sitting, e.g.
``PYTHONPATH=<export>/src:<export>:<export>/devenv/src`` for the tree before a change (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tether.tool.events import EventBus
from tether.tool.expiring_hash import EntryTtl
from tether.tool.redis_backend import RedisBackend
from tether.tunnel.server.tracker import TunnelTracker
from tether_devenv.redis_server import RedisServer


async def rounds(url: str, agents: int, count: int) -> None:
    """Register ``agents`` new agent ids at once, ``count`` times; print wall and CPU seconds of each round."""
    backend = RedisBackend.from_url(url)
    tracker = TunnelTracker(backend, EventBus(backend, "bench"), "grpc://kas:8155", ttl=EntryTtl(300))
    try:
        for number in range(1, count + 1):
            first = number * 10_000_000
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(tracker.register(first + offset) for offset in range(agents)))
            print(
                f"round {number}: {agents:,} registrations in {time.perf_counter() - wall:.2f} s, "
                f"{time.process_time() - cpu:.2f} s of CPU",
                flush=True,
            )
    finally:
        await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-tracker-") as tmp:
        redis = RedisServer(Path(tmp) / "redis").start()
        try:
            uvloop.run(rounds(redis.url, args.agents, args.rounds))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
