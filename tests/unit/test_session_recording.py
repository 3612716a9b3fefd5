"""Recorded exec/attach sessions, kas' pure parts (issue 25 item 2): the WebSocket and SPDY/3.1 demultiplexing,
the asciicast v2 file, the bounded buffer, storing after the session. Frames are made by the ``websockets``
library and zlib, as a peer would; the real kubectl's traffic is parsed in ``tests/node/test_recorded_sessions.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib

from websockets.protocol import Protocol, Side, State

from tether.modules.audit.recording.budget import RecordingBudget
from tether.modules.audit.recording.recorder import SessionRecorder
from tether.modules.audit.recording.spdy_dictionary import SPDY3_DICTIONARY
from tether.modules.audit.recording.store import store_after_session


def _ws_frames(side: Side, *messages: bytes) -> bytes:
    sender = Protocol(side, state=State.OPEN, max_size=None)
    for message in messages:
        sender.send_binary(message)
    return b"".join(sender.data_to_send())


def _cast(recorder: SessionRecorder) -> tuple[dict[str, object], list[list[object]]]:
    lines = recorder.encode().decode().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def test_websocket_v5_session_becomes_asciicast_with_input_output_and_resize() -> None:
    recorder = SessionRecorder("a" * 32, 7, 9)
    recorder.upgraded({"Upgrade": ["websocket"], "Sec-Websocket-Protocol": ["v5.channel.k8s.io"]})
    client = _ws_frames(Side.CLIENT, b'\x04{"Width":100,"Height":30}', b"\x00ls\r")
    # Split in odd places: a frame and a UTF-8 character across chunks.
    recorder.client(client[:5])
    recorder.client(client[5:])
    server = _ws_frames(Side.SERVER, b"\x01caf\xc3", b"\x01\xa9 \xe2\x9c\x93\r\n", b"\x02oops\n", b'\x03{"status":"x"}')
    recorder.server(server[:7])
    recorder.server(server[7:])
    header, events = _cast(recorder)
    assert header["version"] == 2 and (header["width"], header["height"]) == (100, 30)
    assert [(code, data) for _, code, data in events] == [
        ("r", "100x30"),
        ("i", "ls\r"),
        ("o", "caf"),
        ("o", "é ✓\r\n"),
        ("o", "oops\n"),
    ]
    assert recorder.complete


def _spdy_control(kind: int, payload: bytes, flags: int = 0) -> bytes:
    return (0x80030000 | kind).to_bytes(4, "big") + bytes([flags]) + len(payload).to_bytes(3, "big") + payload


def _spdy_syn(compressor: zlib._Compress, stream_id: int, headers: dict[str, str]) -> bytes:
    block = len(headers).to_bytes(4, "big")
    for name, value in headers.items():
        block += len(name).to_bytes(4, "big") + name.encode() + len(value).to_bytes(4, "big") + value.encode()
    compressed = compressor.compress(block) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return _spdy_control(1, stream_id.to_bytes(4, "big") + b"\x00\x00\x00\x00" + b"\x00\x00" + compressed)


def _spdy_data(stream_id: int, data: bytes) -> bytes:
    return stream_id.to_bytes(4, "big") + b"\x00" + len(data).to_bytes(3, "big") + data


def test_spdy_session_names_streams_from_their_compressed_headers() -> None:
    compressor = zlib.compressobj(zdict=SPDY3_DICTIONARY)
    client = b"".join(
        [
            _spdy_syn(compressor, 1, {"streamtype": "error"}),
            _spdy_syn(compressor, 3, {"streamtype": "stdin"}),
            _spdy_syn(compressor, 5, {"streamtype": "stdout"}),
            _spdy_syn(compressor, 7, {"streamtype": "resize"}),
            _spdy_data(7, b'{"Width":120,"Height":40}'),
            _spdy_data(3, b"echo hi\r"),
        ]
    )
    server = _spdy_data(5, b"hi\r\n") + _spdy_control(6, b"\x00\x00\x00\x01")  # data, then a PING
    recorder = SessionRecorder("b" * 32, 7, 9)
    recorder.upgraded({"Upgrade": ["SPDY/3.1"]})
    for index in range(0, len(client), 11):
        recorder.client(client[index : index + 11])
    recorder.server(server)
    header, events = _cast(recorder)
    assert (header["width"], header["height"]) == (120, 40)
    assert [(code, data) for _, code, data in events] == [("r", "120x40"), ("i", "echo hi\r"), ("o", "hi\r\n")]
    assert recorder.complete


def test_spdy_garbage_ends_the_recording_marked_incomplete() -> None:
    recorder = SessionRecorder("c" * 32, 7, 9)
    recorder.upgraded({"Upgrade": ["SPDY/3.1"]})
    recorder.client(_spdy_control(1, b"\x00\x00\x00\x01" + b"\x00" * 6 + b"not zlib at all"))
    _, events = _cast(recorder)
    assert events == [] and not recorder.complete


def test_full_buffer_keeps_what_came_before_and_marks_incomplete() -> None:
    recorder = SessionRecorder("d" * 32, 7, 9, max_bytes=64)
    recorder.upgraded({"Upgrade": ["websocket"], "Sec-Websocket-Protocol": ["v5.channel.k8s.io"]})
    recorder.server(_ws_frames(Side.SERVER, b"\x01first\n"))
    recorder.server(_ws_frames(Side.SERVER, b"\x01" + b"x" * 100))
    recorder.server(_ws_frames(Side.SERVER, b"\x01last\n"))  # after the cap: left out even though it would fit
    _, events = _cast(recorder)
    assert [data for _, _, data in events] == ["first\n"]
    assert not recorder.complete


def test_no_upgrade_means_no_recording() -> None:
    assert not SessionRecorder("e" * 32, 7, 9).switched


class _SlowHub:
    """Stands in for the hub's client: takes a recording after ``delay_s`` (pure logic around it is tested)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.stored: list[str] = []

    async def put_audit_recording(
        self, event_id: str, cast: bytes, complete: bool, agent_id: int, user_id: int
    ) -> None:
        await asyncio.sleep(self.delay_s)
        self.stored.append(event_id)


def test_store_after_the_session_outlives_the_handlers_cancellation() -> None:
    # aiohttp cancels a relay's handler when it notices the client's connection closed, which for an upgraded
    # session is right after it ended: the recording must still be stored and the answer reach the audit event.
    async def scenario() -> tuple[list[str], list[str], bool]:
        hub = _SlowHub(0.2)
        recorder = SessionRecorder("f" * 32, 7, 9)
        recorder.upgraded({"Upgrade": ["websocket"], "Sec-Websocket-Protocol": ["v5.channel.k8s.io"]})
        recorder.server(_ws_frames(Side.SERVER, b"\x01bye\n"))
        answers: list[str] = []

        async def handler() -> None:
            answers.append(await store_after_session(hub, recorder, 5.0))  # type: ignore[arg-type]
            await asyncio.sleep(5)  # the cancellation, requested again, lands here

        task = asyncio.ensure_future(handler())
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return hub.stored, answers, task.cancelled()

    stored, answers, cancelled = asyncio.run(scenario())
    assert stored == ["f" * 32] and answers == ["complete"] and cancelled


def test_slow_hub_makes_the_recording_incomplete_without_waiting_longer() -> None:
    async def scenario() -> tuple[str, float]:
        recorder = SessionRecorder("9" * 32, 7, 9)
        recorder.upgraded({"Upgrade": ["websocket"], "Sec-Websocket-Protocol": ["v5.channel.k8s.io"]})
        began = time.monotonic()
        answer = await store_after_session(_SlowHub(30), recorder, 0.2)  # type: ignore[arg-type]
        return answer, time.monotonic() - began

    answer, waited_s = asyncio.run(scenario())
    assert answer == "incomplete" and waited_s < 20  # a bound, not a measurement: the hub would take 30 s


def test_recordings_share_the_process_budget_and_give_it_back_once_stored() -> None:
    """Many sessions held open cannot make kas buffer more than the budget (docs/limits.md): the recording that
    would go beyond it stops there, marked incomplete; stored or given up, a recording's bytes come back."""
    budget = RecordingBudget(11_000)
    first, second = SessionRecorder("g" * 32, 7, 9, budget=budget), SessionRecorder("h" * 32, 7, 9, budget=budget)
    for recorder in (first, second):
        recorder.upgraded({"Upgrade": ["websocket"], "Sec-Websocket-Protocol": ["v5.channel.k8s.io"]})
    big, small = _ws_frames(Side.SERVER, b"\x01" + b"a" * 4000), _ws_frames(Side.SERVER, b"\x01" + b"b" * 3000)
    first.server(big)
    second.server(small)
    second.server(small)
    second.server(small)  # 4,005 + 3 x 3,005 > 11,000: left out
    assert (first.complete, second.complete) == (True, False)
    assert budget.used == len(big) + 2 * len(small)

    async def store_both() -> list[str]:
        return [
            await store_after_session(_SlowHub(0), first, 5.0),  # type: ignore[arg-type]
            await store_after_session(_SlowHub(30), second, 0.1),  # type: ignore[arg-type]
        ]

    assert asyncio.run(store_both()) == ["complete", "incomplete"]
    assert budget.used == 0, "stored or given up, a recording holds nothing"
    third = SessionRecorder("i" * 32, 7, 9, budget=budget)
    third.server(b"x" * 100)
    assert third.complete and budget.used == 100
    assert asyncio.run(store_after_session(_SlowHub(0), third, 5.0)) == ""  # type: ignore[arg-type]
    assert budget.used == 0, "a session the cluster refused gives its bytes back too"


def test_a_file_of_tiny_frames_stops_at_its_share_of_the_budget() -> None:
    """One byte per frame makes a JSON line of some 20 bytes per 4 bytes kept: the file may not grow past what the
    recording holds and the budget can still give; the recording is then incomplete, the file well formed."""
    budget = RecordingBudget(64 * 1024)
    recorder = SessionRecorder("j" * 32, 7, 9, budget=budget)
    recorder.upgraded({"Upgrade": ["websocket"], "Sec-Websocket-Protocol": ["v5.channel.k8s.io"]})
    frame = _ws_frames(Side.SERVER, b"\x01x")
    for _ in range(10_000):
        recorder.server(frame)
    kept = budget.used
    limit = recorder.reserve_file()
    assert limit == budget.used == budget.max_bytes > kept
    cast = recorder.encode(limit)
    recorder.hold_encoded(len(cast))
    assert not recorder.complete and len(cast) <= limit + 200  # the header is outside the bound
    assert all(json.loads(line) for line in cast.decode().splitlines())
    assert budget.used == len(cast)
    recorder.release()
    assert budget.used == 0
