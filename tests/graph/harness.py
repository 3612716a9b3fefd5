"""A client-side model of the Graph API stream, as a client like ``glab cluster graph`` keeps it.

:class:`GraphModel` applies JSON messages (checking the wire invariants of seed 002 on every action);
:class:`EngineSession` runs a :class:`GraphEngine` in-process and feeds every batch through the same path
kas uses (engine -> protobuf -> JSON), so the tests see exactly what a WebSocket client would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.kube.client import KubeClient
from tether.modules.graph.engine.engine import EngineOptions, GraphEngine
from tether.modules.graph.engine.request import parse_request
from tether.modules.graph.rpc.wire import response_to_json, response_to_proto

VKey = tuple[str, str, str, str, str]
ArcK = tuple[VKey, VKey, str]

#: Upper bound for waiting on a condition; tests fail instead of hanging, they never assert on timing.
WAIT_S = 60.0


def vkey(vertex: dict[str, Any]) -> VKey:
    """Vertex identity from its JSON form, checking the field rules."""
    assert set(vertex) <= {"g", "v", "r", "ns", "n"}, vertex
    assert "g" in vertex and vertex["v"] and vertex["r"] and vertex["n"], vertex
    if "ns" in vertex:
        assert vertex["ns"], f"ns must be omitted when empty: {vertex}"
    return (vertex["g"], vertex["v"], vertex["r"], vertex.get("ns", ""), vertex["n"])


@dataclass
class GraphModel:
    """The client's picture of the graph."""

    vertices: dict[VKey, dict[str, Any]] = field(default_factory=dict)
    arcs: dict[ArcK, dict[str, bool]] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    messages: int = 0
    actions: list[dict[str, Any]] = field(default_factory=list)
    keep_actions: bool = True
    raw: list[bytes] = field(default_factory=list)

    def apply(self, message: bytes) -> None:
        """Apply one JSON message, asserting the wire rules."""
        if self.keep_actions:
            self.raw.append(message)
        data = json.loads(message)
        assert isinstance(data, dict) and set(data) <= {"actions", "warnings", "error"}, data
        self.messages += 1
        for action in data.get("actions", []):
            assert len(action) == 1, action
            if self.keep_actions:
                self.actions.append(action)
            ((kind, body),) = action.items()
            if kind == "svx":
                assert set(body) <= {"vx", "o", "j"}, body
                assert not ("o" in body and "j" in body), "o and j are never both set"
                if "o" in body:
                    assert body["o"], "empty o is omitted"
                if "j" in body:
                    assert isinstance(body["j"], list) and body["j"], "empty j is omitted"
                self.vertices[vkey(body["vx"])] = body
            elif kind == "dvx":
                assert set(body) == {"vx"}, body
                key = vkey(body["vx"])
                assert key in self.vertices, f"dvx for an unknown vertex {key}"
                del self.vertices[key]
            elif kind == "sarc":
                assert set(body) <= {"s", "d", "t", "a"}, body
                assert body["t"] in ("or", "r", "t"), body
                attrs = body.get("a", {})
                if "a" in body:
                    assert attrs and all(v is True for v in attrs.values()), f"a holds only true flags: {body}"
                    assert set(attrs) <= {"c", "b", "e"}, body
                self.arcs[(vkey(body["s"]), vkey(body["d"]), body["t"])] = attrs
            elif kind == "darc":
                assert set(body) == {"s", "d", "t"}, body
                key = (vkey(body["s"]), vkey(body["d"]), body["t"])
                assert key in self.arcs, f"darc for an unknown arc {key}"
                del self.arcs[key]
            else:
                raise AssertionError(f"unknown action {kind}")
        for warning in data.get("warnings", []):
            assert set(warning) <= {"t", "m", "a"} and warning["t"] and warning["m"], warning
            self.warnings.append(warning)

    # ---- queries used by tests ----

    def find(self, resource: str, name: str, namespace: str = "", group: str | None = None) -> VKey | None:
        for key in self.vertices:
            if key[2] == resource and key[4] == name and key[3] == namespace and (group is None or key[0] == group):
                return key
        return None

    def names(self, resource: str, namespace: str | None = None) -> set[str]:
        return {k[4] for k in self.vertices if k[2] == resource and (namespace is None or k[3] == namespace)}

    def arc(self, source: VKey | None, destination: VKey | None, arc_type: str) -> dict[str, bool] | None:
        if source is None or destination is None:
            return None
        return self.arcs.get((source, destination, arc_type))

    def arcs_from(self, source: VKey) -> dict[tuple[VKey, str], dict[str, bool]]:
        return {(d, t): a for (s, d, t), a in self.arcs.items() if s == source}

    def warning_types(self) -> set[str]:
        return {w["t"] for w in self.warnings}


class EngineSession:
    """Runs one engine for a request and applies its output to a :class:`GraphModel`."""

    def __init__(self, kube: KubeClient, request: dict[str, Any] | str, options: EngineOptions | None = None) -> None:
        text = request if isinstance(request, str) else json.dumps(request)
        self.engine = GraphEngine(kube, parse_request(text), options or EngineOptions(sync_timeout_s=20.0))
        self.model = GraphModel()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None

    async def __aenter__(self) -> EngineSession:
        self.engine.start()
        self._task = asyncio.create_task(self._pump())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.engine.close()

    async def _pump(self) -> None:
        try:
            while True:
                batch = await self.engine.next_batch()
                assert batch.actions or batch.warnings, "batches are never empty"
                self.model.apply(response_to_json(response_to_proto(batch.actions, batch.warnings)))
                self._changed.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc
            self._changed.set()
            raise

    async def wait(self, predicate: Callable[[GraphModel], Any], what: str = "condition") -> None:
        """Wait until ``predicate(model)`` is true (fails after :data:`WAIT_S`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            if self.failure is not None:
                raise AssertionError(f"engine failed: {self.failure!r}") from self.failure
            if predicate(self.model):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(
                    f"timed out waiting for {what}; vertices={sorted(self.model.vertices)[:50]} "
                    f"arcs={len(self.model.arcs)} warnings={self.model.warnings}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))

    async def settle(self) -> None:
        """Wait until the engine has nothing pending (every change so far has been delivered)."""
        await self.wait(lambda _: not self.engine.view.pending() and self.engine._ready.is_set(), "engine to settle")


def include(expression: str, **object_filter: str) -> dict[str, Any]:
    """An include query."""
    query: dict[str, Any] = {"resource_selector_expression": expression}
    if object_filter:
        query["object"] = object_filter
    return {"include": query}


def exclude(expression: str) -> dict[str, Any]:
    """An exclude query."""
    return {"exclude": {"resource_selector_expression": expression}}
