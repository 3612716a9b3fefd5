"""Building blocks for workspace access tests and the benchmark: workspaces in the hub, their Service in the
cluster, kas' ``workspaces`` section, and an HTTP client that resolves the workspaces' zone to kas."""

from __future__ import annotations

import socket
import ssl
import uuid
from datetime import timedelta
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tests.fixtures.hub import RealHub
from tether.hub.db.types import utcnow
from tether.hub.db.workspaces import Workspace, WorkspacesAgentConfig
from tether.modules.remote_development.hub.settings import WorkspacesSettings

ZONE = "workspaces.test"
EDITOR_PORT = 60001
DEVFILE = """schemaVersion: 2.2.0
components:
  - name: tooling
    container:
      image: registry.example/editor:1
      endpoints: [{name: editor-server, targetPort: 60001}, {name: preview, targetPort: 3000}]
"""

SERVICE = """apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{agent.gitlab.com/id: "{agent_id}"}}
  annotations:
    workspaces.gitlab.com/id: "{workspace_id}"
    workspaces.gitlab.com/host-template: "{{{{.port}}}}-{name}.{zone}"
spec:
  ports: [{{name: editor-server, port: 60001, targetPort: 60001, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-editor
  namespace: {namespace}
  labels: {{kubernetes.io/service-name: {name}, endpointslice.kubernetes.io/managed-by: tether-tests}}
addressType: IPv4
ports: [{{name: editor-server, port: {port}, protocol: TCP}}]
endpoints: [{{addresses: ["{address}"], conditions: {{ready: true}}}}]
"""


def unique(prefix: str) -> str:
    """``prefix-<8 hex>``: names that never collide between tests sharing one hub or cluster."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def seed_workspace(
    hub: RealHub,
    *,
    agent_id: int,
    user_id: int,
    project_id: int,
    name: str,
    namespace: str,
    actual: str = "Running",
    desired: str = "Running",
    zone: str = ZONE,
    message: str = "",
) -> int:
    """A workspace row as the hub keeps it after reconciliation (with its agent's settings naming ``zone``)."""

    async def work(session: AsyncSession) -> int:
        row = await session.scalar(
            select(WorkspacesAgentConfig).where(
                WorkspacesAgentConfig.cluster_agent_id == agent_id, WorkspacesAgentConfig.dns_zone == zone
            )
        )
        if row is None:
            latest = await session.scalar(
                select(func.max(WorkspacesAgentConfig.version)).where(
                    WorkspacesAgentConfig.cluster_agent_id == agent_id
                )
            )
            settings = WorkspacesSettings(enabled=True, dns_zone=zone)
            row = WorkspacesAgentConfig(
                cluster_agent_id=agent_id,
                version=(latest or 0) + 1,
                enabled=True,
                dns_zone=zone,
                settings=settings.to_json(),
                created_at=utcnow(),
            )
            session.add(row)
            await session.flush()
        now = utcnow() - timedelta(seconds=1)
        ws = Workspace(
            user_id=user_id,
            project_id=project_id,
            cluster_agent_id=agent_id,
            name=name,
            namespace=namespace,
            desired_state=desired,
            desired_state_updated_at=now,
            actual_state=actual,
            actual_state_updated_at=now,
            actual_state_message=message,
            responded_to_agent_at=now,
            deployment_resource_version="1",
            force_include_all_resources=False,
            project_ref="main",
            devfile_path=None,
            devfile=DEVFILE,
            url_prefix=f"60001-{name}",
            workspaces_agent_config_version=row.version,
            created_at=now,
            updated_at=now,
        )
        session.add(ws)
        await session.flush()
        return ws.id

    return hub.db.session(work)


def set_workspace_state(hub: RealHub, workspace_id: int, actual: str) -> None:
    """Change a workspace's actual state in the database (as reconciliation would, without telling kas)."""
    hub.db.execute("UPDATE workspaces SET actual_state = :s WHERE id = :i", s=actual, i=workspace_id)


def service_manifest(
    *, name: str, namespace: str, agent_id: int, workspace_id: int, address: str, port: int, zone: str = ZONE
) -> str:
    """A workspace Service without selector, and an EndpointSlice sending its editor port to ``address:port``."""
    return SERVICE.format(
        name=name,
        namespace=namespace,
        agent_id=agent_id,
        workspace_id=workspace_id,
        address=address,
        port=port,
        zone=zone,
    )


def workspaces_section(port: int, zone: str = ZONE, **extra: Any) -> dict[str, Any]:
    """kas' ``workspaces`` section: host form in ``zone`` and path form on ``127.0.0.1:<port>``."""
    return {
        "listen": {"address": f"127.0.0.1:{port}", "listen_grace_period": "0s", "shutdown_grace_period": "2s"},
        "dns_zones": [zone],
        "path_url": f"http://127.0.0.1:{port}",
        **extra,
    }


class ZoneResolver(AbstractResolver):
    """Resolves every host of ``zone`` to 127.0.0.1 (where kas listens), as the zone's wildcard DNS would."""

    def __init__(self, zone: str = ZONE) -> None:
        self._zone = zone

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """127.0.0.1 for hosts of the zone, the host itself (an IP literal) otherwise."""
        address = "127.0.0.1" if host == self._zone or host.endswith("." + self._zone) else host
        return [
            ResolveResult(
                hostname=host, host=address, port=port, family=socket.AF_INET, proto=0, flags=socket.AI_NUMERICHOST
            )
        ]

    async def close(self) -> None:
        """Nothing to close."""


def browser(zone: str = ZONE, connector_ssl: ssl.SSLContext | None = None, **kwargs: Any) -> aiohttp.ClientSession:
    """A client with a cookie jar that reaches the zone's hosts at kas (``unsafe``: the hub is on 127.0.0.1).

    Args:
        zone: the zone resolved to 127.0.0.1.
        connector_ssl: the TLS context for https addresses (kas' CA), or None.
        kwargs: more ``aiohttp.ClientSession`` arguments.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(resolver=ZoneResolver(zone), ssl=connector_ssl or True),
        cookie_jar=aiohttp.CookieJar(unsafe=True),
        **kwargs,
    )


async def body_of(response: aiohttp.ClientResponse) -> Any:
    """The JSON body of ``response`` (any content type), or its text when it is not JSON."""
    text = await response.text()
    try:
        return await response.json(content_type=None)
    except ValueError:
        return text
