"""Helpers for workspace tests: GraphQL calls, agent set-up with workspaces enabled, reconcile requests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from tests.fixtures.hub import RealHub
from tests.hub.helpers import Setup, kas_config, project_with_agent

RD_CONFIG = """remote_development:
  enabled: true
  dns_zone: workspaces.example.com
  partial_sync_interval: 1s
  full_sync_interval: 60s
"""

DEVFILE = """schemaVersion: 2.2.0
components:
  - name: tooling
    container:
      image: registry.example/tools:1
      endpoints: [{name: web, targetPort: 8080}]
"""

#: An image kwok is told to fail (tether_devenv.kwok_failures): the pod waits in ImagePullBackOff.
FAILING_DEVFILE = """schemaVersion: 2.2.0
components:
  - name: tooling
    container:
      image: registry.tether.invalid/image-pull-fails:1
"""
#: Valid for the hub, refused by the API server: a container port name longer than 15 characters.
REFUSED_DEVFILE = """schemaVersion: 2.2.0
components:
  - name: tooling
    container:
      image: registry.example/tools:1
      endpoints: [{name: an-endpoint-name-too-long-for-a-port, targetPort: 8080}]
"""

CREATE = """mutation($input: WorkspaceCreateInput!) {
  workspaceCreate(input: $input) { errors workspace { id name namespace desiredState actualState actualStateMessage
    url clusterAgent { id name } user { username } } }
}"""
UPDATE = """mutation($id: ID!, $state: String!) {
  workspaceUpdate(input: {id: $id, desiredState: $state}) { errors workspace { id desiredState actualState } }
}"""
LIST = (
    """query { workspaces { count nodes { id name desiredState actualState actualStateMessage user { username } } } }"""
)


def graphql(hub: RealHub, token: str, query: str, variables: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(
        hub.url + "/api/graphql",
        json={"query": query, "variables": variables or {}},
        headers={"PRIVATE-TOKEN": token} if token else {},
        timeout=30,
    )


@dataclass
class WorkspaceSetup:
    setup: Setup
    agent_token: str

    def create_input(self, **extra: Any) -> dict[str, Any]:
        return {
            "clusterAgentId": f"gid://gitlab/Clusters::Agent/{self.setup.agent_id}",
            "projectId": f"gid://gitlab/Project/{self.setup.project_id}",
            "desiredState": "Running",
            "devfile": DEVFILE,
            **extra,
        }


def workspace_setup(hub: RealHub, config: str = RD_CONFIG) -> WorkspaceSetup:
    setup = project_with_agent(hub)
    kas_config(hub, setup, config)
    token = hub.api().post(
        f"/projects/{setup.project_id}/cluster_agents/{setup.agent_id}/tokens", json={"name": "agentk"}
    )
    assert token.status_code == 201, token.text
    return WorkspaceSetup(setup, token.json()["token"])


def create(hub: RealHub, ws: WorkspaceSetup, role: str = "developer", **extra: Any) -> dict[str, Any]:
    response = graphql(hub, ws.setup.tokens[role], CREATE, {"input": ws.create_input(**extra)})
    assert response.status_code == 200, response.text
    payload = response.json()["data"]["workspaceCreate"]
    assert payload["errors"] == [], payload
    return dict(payload["workspace"])


def reconcile(hub: RealHub, ws: WorkspaceSetup, body: Any, token: str | None = None) -> httpx.Response:
    return httpx.post(
        hub.api_url + "/internal/kubernetes/modules/remote_development/reconcile",
        json=body,
        headers={**hub.kas_headers(), "Gitlab-Agent-Api-Request": token or ws.agent_token},
        timeout=60,
    )


def deployment(name: str, namespace: str, rv: str, replicas: int, available: int, progress: str) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "reason": progress, "status": "True"}]
    if progress == "NewReplicaSetAvailable":
        reason = "MinimumReplicasAvailable" if available == replicas else "MinimumReplicasUnavailable"
        conditions.insert(0, {"type": "Available", "reason": reason, "status": "True"})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv},
        "spec": {"replicas": replicas},
        "status": {"conditions": conditions, "availableReplicas": available},
    }


def info(name: str, namespace: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, **fields}


PV = """apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
  labels: {{tether.test/workspace-volume: "true"}}
spec:
  capacity: {{storage: 50Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {{path: /tmp/{name}}}
"""


def volumes(kubectl: Any, count: int) -> list[str]:
    """Static PersistentVolumes for ``count`` workspaces: the test cluster has no storage provisioner, and the
    PV binder of kube-controller-manager binds a workspace's data claim to one of these."""
    names = [f"ws-pv-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    kubectl.run("apply", "-f", "-", input_text="---\n".join(PV.format(name=n) for n in names))
    return names


def bulk_create(hub: RealHub, setup: Setup, agent_id: int, count: int, prefix: str) -> None:
    """Create ``count`` workspaces for the developer directly through the hub's service layer (fast set-up)."""
    from tether.hub.service.principal import Principal  # noqa: PLC0415 - only the bulk helpers need it
    from tether.hub.workspaces import operations  # noqa: PLC0415

    principal = Principal(
        user_id=setup.user_ids["developer"], username="developer", admin=False, scopes=frozenset({"api"})
    )

    async def work(session: Any) -> None:
        for i in range(count):
            request = operations.CreateRequest(
                agent_id, setup.project_id, "Running", devfile=DEVFILE, name=f"{prefix}-{i}"
            )
            await operations.create(session, principal, request, user_limit=-1)  # set-up: no per-user limit

    hub.db.session(work)
