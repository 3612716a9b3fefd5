"""Body size limits of the hub (issue 27 item 9: "hub-side limits have no test").

The internal reconcile route (``routes_workspaces_internal.py``) refuses a body over 64 MiB with 413, whether
the size is declared or the body is sent in chunks; the agent configuration route refuses a file over 128 KiB
with 400 naming the field, after reading no more than that. Each request here is written on a raw socket and
left unfinished, so the hub must answer before the client ends the body: a hub without the limit would wait for
the rest (or, for a finished oversize body, answer something other than the limit's error).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable

import pytest

from tests.fixtures.hub import RealHub
from tests.hub.helpers import project_with_agent
from tests.hub.workspace_helpers import workspace_setup
from tether.hub.agent_config import MAX_SIZE_BYTES
from tether.hub.api.routes_workspaces_internal import MAX_BODY_BYTES

RECONCILE = "/api/v4/internal/kubernetes/modules/remote_development/reconcile"
CHUNK = 1 << 20


def answer_before_the_end(hub: RealHub, method: str, path: str, headers: dict[str, str], body: Iterable[bytes]) -> str:
    """Send the request head and ``body`` (chunked unless ``Content-Length`` is given), never the body's end.

    Returns the hub's answer (status line, headers and body as text), read while the body is still unfinished.
    """
    host, port = hub.url.removeprefix("http://").split(":")
    chunked = "Content-Length" not in headers
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        try:
            for part in body:
                connection.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the hub answered and closed: read what it said
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + _length(answer):
            data = connection.recv(65536)  # times out (the test fails) while the hub waits for more body
            if not data:
                break
            answer += data
    return answer.decode(errors="replace")


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def status_and_body(answer: str) -> tuple[int, str]:
    head, _, body = answer.partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_reconcile_refuses_a_declared_oversize_body_unread(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    headers = {
        **hub.kas_headers(),
        "Gitlab-Agent-Api-Request": ws.agent_token,
        "Content-Type": "application/json",
        "Content-Length": str(MAX_BODY_BYTES + 1),
    }
    status, body = status_and_body(answer_before_the_end(hub, "POST", RECONCILE, headers, [b"["]))
    assert status == 413
    assert json.loads(body) == {
        "message": {"error": f"Workspace reconcile params validation failed: body larger than {MAX_BODY_BYTES} bytes"}
    }


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_reconcile_refuses_a_chunked_oversize_body(hub: RealHub) -> None:
    ws = workspace_setup(hub)
    headers = {**hub.kas_headers(), "Gitlab-Agent-Api-Request": ws.agent_token, "Content-Type": "application/json"}
    body = [b"[" + b" " * (CHUNK - 1)] + [b" " * CHUNK] * (MAX_BODY_BYTES // CHUNK)
    status, text = status_and_body(answer_before_the_end(hub, "POST", RECONCILE, headers, body))
    assert status == 413, text
    assert f"body larger than {MAX_BODY_BYTES} bytes" in text


@pytest.mark.parametrize("hub_backend", ["sqlite"], indirect=True)
def test_agent_configuration_size_limit(hub: RealHub) -> None:
    setup = project_with_agent(hub, roles=())
    path = f"/api/v4/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/configuration"
    headers = {"PRIVATE-TOKEN": hub.admin_token, "Content-Type": "application/yaml"}
    too_large = {"message": {"configuration": [f"is too large (maximum is {MAX_SIZE_BYTES} bytes)"]}}
    # Unfinished: refused once the hub has read more than the limit, without waiting for the end.
    status, body = status_and_body(answer_before_the_end(hub, "PUT", path, headers, [b"#" * (MAX_SIZE_BYTES + 1)]))
    assert (status, json.loads(body)) == (400, too_large)
    # Whole: one byte over is refused; the limit itself is accepted.
    admin = hub.api()
    answer = admin.put(path.removeprefix("/api/v4"), content=b"#" * MAX_SIZE_BYTES + b"\n")
    assert (answer.status_code, answer.json()) == (400, too_large)
    answer = admin.put(path.removeprefix("/api/v4"), content=b"#" * (MAX_SIZE_BYTES - 1) + b"\n")
    assert answer.status_code == 200, answer.text
    assert hub.db.rows("SELECT length(content) AS n FROM agent_configurations") == [{"n": MAX_SIZE_BYTES}]
