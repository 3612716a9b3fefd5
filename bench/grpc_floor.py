"""What grpcio itself costs a server per idle connection and per idle stream, and what one huge message costs kas.

Usage: ``uv run python bench/grpc_floor.py [--connections 2000] [--part all|floor|huge|unauth]``

``floor``: a bare ``grpc.aio`` server (kas' pending-call options, a raw stream-stream method whose handler only
waits) and a client process that opens ``--connections`` channels, each on its own HTTP/2 connection, with 0, 1
and 3 streams each (3 is what an agent holds on kas: its configuration stream and two idle tunnels). The
server's ``VmRSS`` growth is read 5 s after every stream is open. It is the floor under
``kas_rss_10000_agents_mib`` (issue 9): what kas adds per agent on top of it is Tether's. Each figure is
measured side by side under three sets of channel arguments: grpcio's defaults; ``unlimited`` (no Core
message-size limit, channelz off: issue 9's kas, which checked the size in Python once Core had read the
message); and kas' (Core's receive limit from :mod:`tether.tool.grpc_size`, channelz off). Prints the figures.
A fourth variant, ``kas+traffic`` (3 streams only), is that server doing what kas does on an agent's streams: each
call carries an agent token in its metadata, the server reads the call's first message and answers with one
300-byte message (as a configuration stream or a tunnel's first exchange), then waits. It is the floor of the
``<= 80 KiB per agent`` target (issue 28 item 4): no agent holds a stream that never carried anything. Server and
client run gRPC Core with kas' I/O engine (:mod:`tether.tool.grpc_core`).

``huge`` (issue 27 item 1): a real hub and a real kas (default ``max_message_size``, 10 MiB, no Redis); a client
process sends one ``--huge-mib`` MiB ``GetConfiguration`` with a valid agent token to the agent listener. kas'
peak RSS over the call (``VmHWM`` reset before it, so no burst is missed) minus its RSS before is
``huge_message_kas_rss_growth_mib`` (target <= 64), written into ``bench/results/hardening.json``; the status
and kas' RSS 3 s later are printed.

``unauth`` (not in ``all``; prints only): the same kas; one client connection opens 1,000 ``GetConfiguration``
calls at once, each with its own unknown agent token (one hub lookup each), first with 10-byte requests, then
with 2 MiB ones; kas' peak RSS growth shows what Core holds of unauthenticated requests while their tokens are
checked (at most the 1 MiB stream window per call, docs/limits.md).
"""

from __future__ import annotations

from tether.tool.grpc_core import select_io_engine

select_io_engine()  # before grpcio is imported, as the ``tether`` command does

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import uvloop

from tether.tool.grpc_size import receive_limit_options

METHOD = "/floor.Floor/Wait"
#: The variant with kas' options whose streams carry a token and exchange one message each.
TRAFFIC = "kas+traffic"
GET_CONFIGURATION = "/gitlab.agent.agent_configuration.rpc.AgentConfiguration/GetConfiguration"
RESULTS = Path(__file__).parent / "results" / "hardening.json"
#: kas' default ``agent.listen.max_message_size`` (10 MiB), for the floor's kas variant.
KAS_MAX_MESSAGE_SIZE = 10 * 1024 * 1024


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def wait_forever(_requests: Any, _context: Any) -> None:
    """Hold the stream open, as kas holds an idle tunnel."""
    await asyncio.Event().wait()


async def answer_then_wait(_requests: Any, context: Any) -> None:
    """Read the first message, answer with one 300-byte message, then hold the stream (``kas+traffic``)."""
    await context.read()
    await context.write(b"c" * 300)
    await asyncio.Event().wait()


def _variant_options(variant: str) -> list[tuple[str, int]]:
    if variant == "default":
        return []
    if variant == "unlimited":
        limits = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    else:
        limits = receive_limit_options(KAS_MAX_MESSAGE_SIZE)  # as kas' listeners
    return [*limits, ("grpc.enable_channelz", 0)]


async def serve(connections: int, streams: int, variant: str) -> float:
    """KiB of server RSS per connection holding ``streams`` idle streams (``variant``: see the module docstring)."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.server.max_pending_requests", 20_000),
            ("grpc.server.max_pending_requests_hard_limit", 50_000),
            *_variant_options(variant),
        ]
    )
    handler = grpc.stream_stream_rpc_method_handler(answer_then_wait if variant == TRAFFIC else wait_forever)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("floor.Floor", {"Wait": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.sleep(1)
    before = rss_mib()
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--client",
        str(port),
        str(connections),
        str(streams),
        variant,
        stdout=subprocess.PIPE,
    )
    assert client.stdout is not None
    await client.stdout.readline()  # every stream open
    await asyncio.sleep(5)
    growth = rss_mib() - before
    client.kill()
    await client.wait()
    await server.stop(None)
    return growth * 1024 / connections


async def hold(port: int, connections: int, streams: int, variant: str) -> None:
    """The client: ``connections`` channels (distinct arguments, so distinct connections) with open streams."""
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) for i in range(connections)
    ]
    calls = []
    for channel in channels:
        await channel.channel_ready()
        for _ in range(streams):
            token = f"agent-token-{len(calls):08d}-0123456789abcdefghijklmnopqrstuv"  # an agent token's length
            metadata = (("authorization", f"Bearer {token}"),) if variant == TRAFFIC else None
            call = channel.stream_stream(METHOD)(metadata=metadata)
            await call.write(b"x")
            if variant == TRAFFIC:
                await call.read()
            calls.append(call)
    await asyncio.sleep(2)
    print("open", flush=True)
    await asyncio.Event().wait()


async def send_huge(target: str, token: str, size: int) -> str:
    """The huge-message client: one ``size``-byte ``GetConfiguration``; returns the status it got."""
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as channel:
        call = channel.unary_stream(GET_CONFIGURATION)(
            b"\x00" * size, metadata=(("authorization", f"Bearer {token}"),), timeout=300
        )
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return "OK"


@contextlib.contextmanager
def real_kas(token: str) -> Iterator[tuple[str, int]]:
    """A real hub that knows agent ``token`` and a real kas (defaults, no Redis): (agent listener target, kas pid)."""
    # Imported here: the floor's server and client processes stay bare grpcio (no hub, no SQLAlchemy loaded).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.fixtures.hub import RunningHub  # noqa: PLC0415
    from tests.fixtures.system import System, write_private_secret  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="tether-bench-kas-") as tmp:
        directory = Path(tmp)
        running = RunningHub(directory / "hub")
        system = System(directory, running.hub, write_private_secret(directory / "private_secret"), None, None)
        try:
            running.hub.add_agent(token, 900_001, 900_002)
            kas = system.kas(use_redis=False)
            assert kas.process is not None
            time.sleep(2)  # settle after start-up
            yield kas.agent_address.removeprefix("grpc://"), kas.process.pid
        finally:
            system.stop_all()
            running.stop()


def huge_message(size_mib: int) -> float:
    """kas' peak RSS growth in MiB while it receives one ``size_mib`` MiB message with a valid agent token."""
    from tests.support.peak_rss import peak_rss_mib, reset_peak_rss  # noqa: PLC0415
    from tests.support.peak_rss import rss_mib as process_rss_mib  # noqa: PLC0415

    token = "huge-message-agent-token-0123456789"
    with real_kas(token) as (target, pid):
        before = reset_peak_rss(pid)
        began = time.monotonic()
        command = [sys.executable, __file__, "--huge-client", target, token, str(size_mib << 20)]
        status = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()
        took = time.monotonic() - began
        peak = peak_rss_mib(pid)
        time.sleep(3)
        after = process_rss_mib(pid)
    print(
        f"kas, one {size_mib} MiB GetConfiguration with a valid token: {status!r}, client done after {took:.1f} s; RSS "
        f"{before:.1f} MiB before, peak {peak:.1f} (+{peak - before:.1f}), {after:.1f} 3 s later",
        flush=True,
    )
    return peak - before


async def unauthenticated_calls(target: str, calls: int, size: int) -> dict[str, int]:
    """``calls`` concurrent calls on one connection, each with its own unknown token: status name -> count."""
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as channel:
        method = channel.unary_stream(GET_CONFIGURATION)
        payload = b"\x00" * size

        async def one(index: int) -> str:
            metadata = (("authorization", f"Bearer unknown-agent-token-{index:06d}"),)
            try:
                async for _ in method(payload, metadata=metadata, timeout=120):
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return "OK"

        statuses = await asyncio.gather(*(one(i) for i in range(calls)))
    return {status: statuses.count(status) for status in sorted(set(statuses))}


def unauthenticated(calls: int) -> None:
    """Print kas' peak RSS growth for ``calls`` concurrent unauthenticated calls, with small and 2 MiB requests."""
    from tests.support.peak_rss import peak_rss_mib, reset_peak_rss  # noqa: PLC0415

    with real_kas("unauth-bench-agent-token-0123456789") as (target, pid):
        for size in (10, 2 << 20):
            before = reset_peak_rss(pid)
            statuses = uvloop.run(unauthenticated_calls(target, calls, size))
            print(
                f"kas, {calls} calls at once on one connection with unknown tokens, {size} B each: {statuses}; "
                f"peak +{peak_rss_mib(pid) - before:.1f} MiB",
                flush=True,
            )


def record(metric: str, value: float, unit: str) -> None:
    """Set ``metric`` in ``bench/results/hardening.json``, keeping the other figures and the file's format."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    results = [r for r in results if r["metric"] != metric]
    results.append({"metric": metric, "value": round(value, 2), "unit": unit})
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        uvloop.run(hold(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
        return
    if sys.argv[1:2] == ["--huge-client"]:
        print(uvloop.run(send_huge(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
        return
    if sys.argv[1:2] == ["--server"]:  # a fresh process per figure: freed memory of an earlier one is not reused
        per = uvloop.run(serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
        print(
            f"{sys.argv[4]:>9} options, {sys.argv[2]} connections x {sys.argv[3]} streams: "
            f"{per:.1f} KiB per connection",
            flush=True,
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--part", choices=["all", "floor", "huge", "unauth"], default="all")
    parser.add_argument("--huge-mib", type=int, default=1024, help="size of the huge message, MiB")
    args = parser.parse_args()
    if args.part in ("all", "floor"):
        for streams in (0, 1, 3):
            for variant in ("default", "unlimited", "kas", *([TRAFFIC] if streams == 3 else [])):
                command = [sys.executable, __file__, "--server", str(args.connections), str(streams), variant]
                subprocess.run(command, check=True)
    if args.part in ("all", "huge"):
        record("huge_message_kas_rss_growth_mib", huge_message(args.huge_mib), "MiB")
    if args.part == "unauth":
        unauthenticated(1000)


if __name__ == "__main__":
    main()
