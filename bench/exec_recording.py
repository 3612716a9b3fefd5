"""Recorded exec sessions benchmark (issue 25 item 2): what recording adds to a keystroke's echo through kas.

Usage: ``uv run python bench/exec_recording.py [--keys 400] [--rounds 6]``

Real processes on loopback: redis-server, the real hub, two ``tether kas`` and two agentk connected to kas 2
only. Both agents reach a small ``v5.channel.k8s.io`` exec endpoint started here, which echoes each stdin
message (channel 0) back as stdout (channel 1), as a terminal does with a keystroke; one agent's configuration
has ``audit: {record_sessions: true}``, the other's not. A WebSocket client (the protocol kubectl uses) sends
one-byte keystrokes through kas 1 -> kas 2 -> agentk -> the endpoint and times each echo. Rounds alternate
between the two agents in the same run (each first in every other round); the figure is the median echo with
recording on minus off. Writes
``exec_recording_added_ms`` into ``bench/results/audit.json`` (other entries of that file are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.test_k8s_proxy_upgrade import agent_kubeconfig
from tests.fixtures.exec_endpoint import exec_endpoint
from tests.fixtures.hub import RunningHub
from tests.fixtures.system import KasProc, System, write_private_secret
from tether_devenv import pki
from tether_devenv.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results" / "audit.json"
PROJECT_ID = 1
AGENTS = {"off": 711, "on": 712}
EXEC_PATH = "api/v1/namespaces/bench/pods/shell/exec?command=sh&stdin=true&stdout=true&tty=true"


async def session_echoes(kas: KasProc, token: str, keys: int) -> list[float]:
    """One exec session: ``keys`` keystrokes, each echo's round trip in milliseconds."""
    context = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
    samples = []
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as client,
        client.ws_connect(
            kas.k8s_proxy_url + EXEC_PATH,
            headers={"Authorization": f"Bearer {token}"},
            protocols=("v5.channel.k8s.io",),
        ) as ws,
    ):
        await ws.send_bytes(b'\x04{"Width":80,"Height":24}')
        for index in range(keys + 20):
            key = bytes([97 + index % 26])
            began = time.perf_counter()
            await ws.send_bytes(b"\x00" + key)
            answer = await ws.receive_bytes(timeout=30)
            elapsed = (time.perf_counter() - began) * 1000
            assert answer == b"\x01" + key, answer
            if index >= 20:  # warm-up
                samples.append(elapsed)
    return samples


async def run(keys: int, rounds: int) -> dict[str, float]:
    async with exec_endpoint() as port:
        return await _run(port, keys, rounds)


async def _run(port: int, keys: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-rec-") as tmp:
        directory = Path(tmp)
        redis = RedisServer(directory / "redis").start()
        running = RunningHub(directory / "hub")
        hub = running.hub
        private = write_private_secret(directory / "private_secret")
        tls = pki.generate(directory / "proxy-tls")
        system = System(directory, hub, private, directory / "unused.kubeconfig", redis, tls)
        samples: dict[str, list[float]] = {"off": [], "on": []}
        try:
            kas1, kas2 = system.kas(), system.kas()
            tokens = {}
            for mode, agent_id in AGENTS.items():
                hub.add_agent(f"bench-rec-agent-{agent_id}", agent_id, PROJECT_ID, f"rec-{mode}")
                hub.grant_proxy_access(f"bench-rec-pat-{agent_id}", f"rec-{mode}", agent_id, PROJECT_ID)
                tokens[mode] = f"pat:{agent_id}:bench-rec-pat-{agent_id}"
                config = agent_kubeconfig(directory / f"{mode}.kubeconfig", f"http://127.0.0.1:{port}", "sa")
                system.agentk(f"bench-rec-agent-{agent_id}", kas2, f"rec-{mode}", kubeconfig=config)
            hub.record_sessions(AGENTS["on"])
            deadline = time.monotonic() + 60
            for agent_id in AGENTS.values():
                while kas2.private_url not in await system.tunnel_urls(agent_id):
                    if time.monotonic() > deadline:
                        raise RuntimeError("agentk did not connect")
                    await asyncio.sleep(0.2)
            for mode in ("off", "on"):  # warm both paths (tunnels, authorization caches)
                await session_echoes(kas1, tokens[mode], 20)
            for round_index in range(rounds):
                # Each mode goes first in every other round: the second session of a pair ran warmer.
                order = ("off", "on") if round_index % 2 == 0 else ("on", "off")
                for mode in order:
                    samples[mode] += await session_echoes(kas1, tokens[mode], keys)
            stored = hub.db.rows("SELECT count(*) AS n FROM audit_recordings WHERE agent_id = :a", a=AGENTS["on"])
            if stored[0]["n"] < rounds:
                raise RuntimeError(f"only {stored[0]['n']} recordings stored for {rounds} recorded sessions")
        finally:
            system.stop_all()
            running.stop()
            redis.stop()
    off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
    p99 = {mode: sorted(values)[int(len(values) * 0.99) - 1] for mode, values in samples.items()}
    print(
        f"keystroke echo via kas: off median {off:.3f} ms (p99 {p99['off']:.3f}), on {on:.3f} ms (p99 {p99['on']:.3f})"
    )
    return {"off": off, "on": on, "added": on - off, "p99_off": p99["off"], "p99_on": p99["on"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=400, help="keystrokes per session")
    parser.add_argument("--rounds", type=int, default=6, help="sessions per mode, alternating")
    args = parser.parse_args()
    figures = asyncio.run(run(args.keys, args.rounds))
    load = os.getloadavg()
    entries = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    entries = [e for e in entries if not str(e.get("metric", "")).startswith("exec_recording_")]
    note = f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.rounds} x {args.keys} keystrokes per mode"
    entries += [
        {"metric": "exec_recording_added_ms", "value": round(figures["added"], 3), "unit": "ms", "note": note},
        {"metric": "exec_recording_echo_off_ms", "value": round(figures["off"], 3), "unit": "ms"},
        {"metric": "exec_recording_echo_on_ms", "value": round(figures["on"], 3), "unit": "ms"},
    ]
    RESULTS.write_text(json.dumps(entries, indent=2) + "\n")
    print(f"exec_recording_added_ms = {figures['added']:.3f} (target <= 1); {note}")


if __name__ == "__main__":
    main()
