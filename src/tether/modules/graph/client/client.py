"""A Graph API client: connects to ``<kas proxy>/graph`` and keeps the live graph the server streams.

The protocol is the one ``glab cluster graph`` speaks (``../shared/reference/graph.md`` §1-4): a WebSocket
with subprotocol ``gitlab-agent-graph-api``, ``Authorization: Bearer pat:<agent id>:<token>``, one request
message, then JSON messages of ``actions`` (``svx``/``dvx``/``sarc``/``darc``), ``warnings`` and ``error``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

SUBPROTOCOL = "gitlab-agent-graph-api"
#: Vertex identity: (group, version, resource, namespace, name).
VertexKey = tuple[str, str, str, str, str]
ArcKey = tuple[VertexKey, VertexKey, str]


class GraphClientError(RuntimeError):
    """The server refused the session or closed it with an error; the message says why."""


def vertex_key(vertex: dict[str, Any]) -> VertexKey:
    """Identity of a vertex from its wire form (``ns`` is omitted for cluster-scoped objects)."""
    return (vertex.get("g", ""), vertex.get("v", ""), vertex.get("r", ""), vertex.get("ns", ""), vertex.get("n", ""))


@dataclass
class GraphView:
    """The client's picture of the graph, updated by :meth:`apply`.

    Attributes:
        vertices: vertex key to its last ``svx`` body (``vx`` plus ``o`` or ``j`` when requested).
        arcs: (source, destination, type) to attribute flags (``c``, ``b``, ``e``).
        warnings: every warning received, in order.
    """

    vertices: dict[VertexKey, dict[str, Any]] = field(default_factory=dict)
    arcs: dict[ArcKey, dict[str, bool]] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, message: dict[str, Any]) -> None:
        """Apply one decoded server message.

        Raises:
            GraphClientError: the message carries an ``error``.
        """
        for action in message.get("actions", []):
            for kind, body in action.items():
                if kind == "svx":
                    self.vertices[vertex_key(body["vx"])] = body
                elif kind == "dvx":
                    self.vertices.pop(vertex_key(body["vx"]), None)
                elif kind == "sarc":
                    self.arcs[(vertex_key(body["s"]), vertex_key(body["d"]), body["t"])] = body.get("a", {})
                elif kind == "darc":
                    self.arcs.pop((vertex_key(body["s"]), vertex_key(body["d"]), body["t"]), None)
        self.warnings.extend(message.get("warnings", []))
        if message.get("error"):
            raise GraphClientError(f"server error: {message['error']}")

    def snapshot(self) -> dict[str, Any]:
        """The whole graph as JSON-compatible data (for the browser page)."""
        return {
            "vertices": [{"key": list(k), **v} for k, v in sorted(self.vertices.items())],
            "arcs": [{"s": list(s), "d": list(d), "t": t, "a": a} for (s, d, t), a in sorted(self.arcs.items())],
            "warnings": self.warnings[-20:],
        }


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect.

    Attributes:
        url: the kas Kubernetes API proxy URL ending in ``/`` (``graph`` is appended).
        token: ``pat:<agent id>:<personal access token>``.
        ca_file: CA of the proxy's certificate, or None for the system roots.
    """

    url: str
    token: str
    ca_file: Path | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Endpoint:
        """Read server, token and CA from a kubeconfig whose server is kas' proxy (as ``tether up`` prints).

        Raises:
            GraphClientError: the kubeconfig lacks a current context, server or token.
        """
        config = yaml.safe_load(path.read_text())
        try:
            context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
            cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
            user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        except (KeyError, StopIteration, TypeError) as exc:
            raise GraphClientError(f"{path}: no usable current context ({exc})") from exc
        if "token" not in user or "server" not in cluster:
            raise GraphClientError(f"{path}: the current context needs a server and a token")
        ca = cluster.get("certificate-authority")
        return cls(cluster["server"].rstrip("/") + "/", user["token"], Path(ca) if ca else None)


def build_request(resources: list[str], namespaces: list[str], roots: list[str]) -> dict[str, Any]:
    """A watch request from simple flags: CEL resource selectors, namespace names, CEL root selectors."""
    request: dict[str, Any] = {
        "queries": [{"include": {"resource_selector_expression": expr}} for expr in (resources or ["true"])]
    }
    if namespaces:
        request["namespaces"] = {"names": namespaces}
    if roots:
        request["roots"] = {"object_selector_expressions": roots}
    return request


async def watch_graph(endpoint: Endpoint, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """Open a session and yield every decoded server message until the server closes.

    Raises:
        GraphClientError: HTTP refusal (with the Status message), or a close with an error code.
    """
    context = ssl.create_default_context(cafile=str(endpoint.ca_file) if endpoint.ca_file else None)
    headers = {"Authorization": f"Bearer {endpoint.token}"}
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(
                endpoint.url + "graph", protocols=[SUBPROTOCOL], headers=headers, ssl=context, max_msg_size=4 << 20
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise GraphClientError(f"kas refused the session: HTTP {exc.status} {exc.message}") from exc
        async with ws:
            await ws.send_str(json.dumps(request))
            while True:
                message = await ws.receive()
                if message.type == aiohttp.WSMsgType.TEXT:
                    yield json.loads(message.data)
                elif message.type == aiohttp.WSMsgType.ERROR:
                    raise GraphClientError(f"connection failed: {ws.exception()}")
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    if ws.close_code not in (None, 1000):
                        reason = message.extra or ""
                        raise GraphClientError(f"session closed with code {ws.close_code}: {reason}".strip())
                    return
