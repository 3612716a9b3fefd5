"""No secret in any log line or error body (issue 9 item 7): malformed credentials on every HTTP listener.

aiohttp's HTTP parser refuses a control character in a header value; by default it then logs the whole
header line and echoes it in the 400 body, token included. Each listener a client can reach is tried with a
real token of the real hub, and the reply and every log of the run are searched for it.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System
from tether_devenv import pki
from tether_devenv.redis_server import RedisServer

pytestmark = [pytest.mark.redis]

#: Characters aiohttp's parser refuses in a header value.
CONTROL = ("\x00", "\x01", "\x1b", "\x7f")


async def raw_request(host: str, port: int, head: bytes, tls: ssl.SSLContext | None = None) -> bytes:
    """Send ``head`` (request line and headers) as is and return everything the server answers."""
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1 << 20), 30)
    finally:
        writer.close()


def read_logs(directory: Path) -> dict[Path, str]:
    """Every ``*.log`` file under ``directory`` (the processes the test started write there)."""
    return {p: p.read_text(errors="replace") for p in directory.rglob("*.log")}


def malformed_heads(path: str, token: str) -> list[bytes]:
    heads = []
    for char in CONTROL:
        for header in (
            f"Authorization: Bearer pat:1:{token}{char}x",
            f"Authorization: Bearer {char}{token}",
            f"Cookie: _gitlab_kas={token}{char}",
            f"PRIVATE-TOKEN: {token}{char}",
        ):
            heads.append(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{header}\r\n\r\n".encode())
    heads.append(f"GET {path}?private_token={token}\x01 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return heads


async def test_control_characters_in_credentials_leak_nothing(
    hub_launcher: HubLauncher,
    redis_server: RedisServer,
    private_secret_file: Path,
    proxy_tls: pki.ClusterPki,
    tmp_path: Path,
) -> None:
    hub = hub_launcher.launch()
    (tmp_path / "system").mkdir()
    system = System(tmp_path / "system", hub, private_secret_file, None, redis_server, proxy_tls)  # type: ignore[arg-type]
    try:
        kas = system.kas(use_redis=False)
        _, token = hub.user("mallory", ("k8s_proxy", "api"))
        assert kas.k8s_proxy_ca is not None
        tls = ssl.create_default_context(cafile=str(kas.k8s_proxy_ca))
        targets = [
            (kas.ports["k8s_proxy"], "/k8s-proxy/api/v1/namespaces", tls),
            (kas.ports["observability"], "/metrics", None),
            (int(hub.url.rsplit(":", 1)[1]), "/api/v4/user", None),
        ]
        for port, path, context in targets:
            for head in malformed_heads(path, token):
                reply = await raw_request("127.0.0.1", port, head, context)
                assert reply.startswith(b"HTTP/1.") and b" 400 " in reply.split(b"\r\n", 1)[0], (port, reply[:300])
                assert token.encode() not in reply, f"port {port} echoed the token: {reply[:400]!r}"
        assert kas.readiness()[0] == 200
    finally:
        system.stop_all()
    logs = read_logs(tmp_path)
    assert logs, "the kas log was written"
    for path, text in logs.items():
        assert token not in text, f"{path} holds the token"
    assert token not in hub.log.text, "the hub logged the token"
