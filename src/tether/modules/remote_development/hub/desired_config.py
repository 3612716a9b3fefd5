"""The Kubernetes objects that make a workspace (reference §4.2-§4.3; vectors §V10).

Objects are built as plain JSON in upstream's order and rendered as one YAML stream, each document a JSON
flow mapping with deep-sorted keys (valid YAML, stable, and fast for a thousand workspaces).

The editor is injected as GitLab does it (§4.2) into the container whose component has ``gl/inject-editor:
true``: an init container of the tools-injector image (``tether_devenv.tools_image``) copies the editor into
the data volume, and the container runs it on port 60001 (``editor-server``), beside its own command if the
devfile gives one. The editor brings its own interpreter and libraries, so any image works.

Differences from GitLab, on purpose: the editor is JupyterLab, not VS Code (code-server does not install from
the registries reachable here); no SSH port; the editor's port has a readiness probe, so ``Running`` means the
editor answers; the Deployment's ``progressDeadlineSeconds`` is short so that a stuck rollout is reported as
``Failed`` in minutes, not ten.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tether import __version__
from tether.modules.remote_development import AGENT_ID_LABEL, WORKSPACE_ID_LABEL
from tether.modules.remote_development.hub.devfile import Devfile
from tether.modules.remote_development.hub.rules import Inclusion, replicas_for
from tether.modules.remote_development.hub.settings import WorkspacesSettings
from tether.modules.remote_development.protocol import INVENTORY_ID_LABEL, OWNING_INVENTORY
from tether.modules.remote_development.states import State

HOST_TEMPLATE = "workspaces.gitlab.com/host-template"
WORKSPACE_ID_ANNOTATION = "workspaces.gitlab.com/id"
MAX_RESOURCES_SHA = "workspaces.gitlab.com/max-resources-per-workspace-sha256"
ACTUAL_STATE_FILE = "gl_workspace_reconciled_actual_state.txt"
DATA_VOLUME = "gl-workspace-data"
DATA_MOUNT = "/projects"
VARIABLES_VOLUME = "gl-workspace-variables"
VARIABLES_MOUNT = "/.workspace-data/variables/file"
SCRIPTS_VOLUME = "gl-workspace-scripts"
SCRIPTS_MOUNT = "/workspace-scripts"
RUN_AS_USER = 5001
DEFAULT_DATA_SIZE = "15Gi"
PROGRESS_DEADLINE_S = 120
#: The editor's port and its name (reference §4.2).
EDITOR_PORT = 60001
EDITOR_PORT_NAME = "editor-server"
#: The tools-injector image (``python -m tether_devenv.tools_image`` builds it; ``make images``).
TOOLS_INJECTOR_IMAGE = f"localhost/tether/workspace-tools:{__version__}"
TOOLS_INJECTOR_NAME = "gl-tools-injector"
#: Where the injector copies the editor: the data volume (GitLab's ``GL_TOOLS_DIR``).
TOOLS_DIR = f"{DATA_MOUNT}/.gl-tools"


@dataclass(frozen=True)
class WorkspaceSpec:
    """What the generator needs about one workspace.

    Attributes:
        id, name, namespace, agent_id: identity.
        desired_state, actual_state: the persisted states (actual goes into the actual-state file).
        devfile: the validated devfile.
        settings: the agent settings version the workspace was created with.
        env_variables, file_variables: workspace variables by type.
        editor_base_path: the path at which users' browsers reach the editor: ``/`` in the host form,
            ``/-/workspaces/<name>/60001/`` (under ``kas.workspaces_url``'s path) in the path form.
    """

    id: int
    name: str
    namespace: str
    agent_id: int
    desired_state: str
    actual_state: str
    devfile: Devfile
    settings: WorkspacesSettings
    env_variables: Mapping[str, str] = field(default_factory=dict)
    file_variables: Mapping[str, str] = field(default_factory=dict)
    editor_base_path: str = "/"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _metadata(ws: WorkspaceSpec, name: str, owner: str | None) -> dict[str, Any]:
    labels = {**ws.settings.labels, AGENT_ID_LABEL: str(ws.agent_id)}
    if ws.settings.shared_namespace:
        labels[WORKSPACE_ID_LABEL] = str(ws.id)
    annotations = {
        **ws.settings.annotations,
        HOST_TEMPLATE: f"{{{{.port}}}}-{ws.name}.{ws.settings.dns_zone}",
        WORKSPACE_ID_ANNOTATION: str(ws.id),
        MAX_RESOURCES_SHA: ws.settings.max_resources_sha256,
    }
    if owner is not None:
        annotations[OWNING_INVENTORY] = owner
    return {"name": name, "namespace": ws.namespace, "labels": labels, "annotations": annotations}


def _inventory(ws: WorkspaceSpec, name: str) -> dict[str, Any]:
    meta = _metadata(ws, name, None)
    meta["labels"][INVENTORY_ID_LABEL] = name
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def _resources(ws: WorkspaceSpec, limits: tuple[str, str], requests: tuple[str, str]) -> dict[str, dict[str, str]]:
    """The agent's default resources per container, overridden by the devfile's (cpu, memory) values."""
    defaults = ws.settings.default_resources_per_workspace_container
    resources: dict[str, dict[str, str]] = {}
    for kind, (cpu, memory) in (("limits", limits), ("requests", requests)):
        merged = dict(defaults.get(kind, {}))
        merged.update({key: value for key, value in (("cpu", cpu), ("memory", memory)) if value})
        if merged:
            resources[kind] = merged
    return resources


def _security_context(ws: WorkspaceSpec) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": ws.settings.allow_privilege_escalation,
        "privileged": False,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
    }


def _tools_injector(ws: WorkspaceSpec) -> dict[str, Any]:
    """The init container that copies the editor into the data volume (reference §4.2)."""
    return {
        "name": TOOLS_INJECTOR_NAME,
        "image": TOOLS_INJECTOR_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "GL_TOOLS_DIR", "value": TOOLS_DIR}],
        "resources": _resources(ws, ("", ""), ("", "")),
        "securityContext": _security_context(ws),
        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": DATA_MOUNT}],
    }


def _inject_editor(ws: WorkspaceSpec, container: dict[str, Any]) -> None:
    """Run the editor in ``container``: its own command (command then args, if any) runs beside it."""
    own = [*container.pop("command", []), *container.pop("args", [])]
    container["command"] = [f"{TOOLS_DIR}/bin/gl-editor", *(["--", *own] if own else [])]
    container["env"] += [
        {"name": "GL_TOOLS_DIR", "value": TOOLS_DIR},
        {"name": "GL_EDITOR_PORT", "value": str(EDITOR_PORT)},
        {"name": "GL_EDITOR_BASE_PATH", "value": ws.editor_base_path},
    ]
    container["ports"].append({"name": EDITOR_PORT_NAME, "containerPort": EDITOR_PORT, "protocol": "TCP"})
    container["readinessProbe"] = {
        "tcpSocket": {"port": EDITOR_PORT},
        "periodSeconds": 1,
        "failureThreshold": 3,
    }


def _container(ws: WorkspaceSpec, index: int) -> dict[str, Any]:
    spec = ws.devfile.containers[index]
    resources = _resources(ws, (spec.cpu_limit, spec.memory_limit), (spec.cpu_request, spec.memory_request))
    mounts = [{"name": DATA_VOLUME, "mountPath": DATA_MOUNT}, {"name": VARIABLES_VOLUME, "mountPath": VARIABLES_MOUNT}]
    mounts += [{"name": volume, "mountPath": path} for volume, path in spec.volume_mounts]
    container: dict[str, Any] = {
        "name": spec.name,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": name, "value": value} for name, value in spec.env],
        "envFrom": [{"secretRef": {"name": f"{ws.name}-env-var"}}],
        "ports": [{"name": e.name, "containerPort": e.target_port, "protocol": "TCP"} for e in spec.endpoints],
        "resources": resources,
        "securityContext": _security_context(ws),
        "volumeMounts": mounts,
    }
    if spec.command:
        container["command"] = spec.command
    if spec.args:
        container["args"] = spec.args
    if spec.inject_editor:
        _inject_editor(ws, container)
    if any(component == spec.name for _id, _line, component in ws.devfile.post_start):
        mounts.append({"name": SCRIPTS_VOLUME, "mountPath": SCRIPTS_MOUNT})
        container["lifecycle"] = {
            "postStart": {"exec": {"command": ["/bin/sh", "-c", f"{SCRIPTS_MOUNT}/gl-run-poststart-commands.sh"]}}
        }
    return container


def _deployment(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    meta = _metadata(ws, ws.name, owner)
    volumes: list[dict[str, Any]] = [
        {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": f"{ws.name}-{DATA_VOLUME}"}},
        {
            "name": VARIABLES_VOLUME,
            "projected": {"defaultMode": 0o774, "sources": [{"secret": {"name": f"{ws.name}-file"}}]},
        },
    ]
    volumes += [{"name": name, "emptyDir": {}} for name in ws.devfile.volumes]
    if ws.devfile.post_start:
        volumes.append(
            {
                "name": SCRIPTS_VOLUME,
                "projected": {
                    "defaultMode": 0o555,
                    "sources": [{"configMap": {"name": f"{ws.name}-scripts-configmap"}}],
                },
            }
        )
    pod_spec: dict[str, Any] = {
        "serviceAccountName": ws.name,
        "containers": [_container(ws, i) for i in range(len(ws.devfile.containers))],
        "volumes": volumes,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "fsGroup": 0,
            "fsGroupChangePolicy": "OnRootMismatch",
        },
    }
    if ws.devfile.editor_injected:
        pod_spec["initContainers"] = [_tools_injector(ws)]
    if ws.settings.use_kubernetes_user_namespaces:
        pod_spec["hostUsers"] = False
    if ws.settings.default_runtime_class:
        pod_spec["runtimeClassName"] = ws.settings.default_runtime_class
    selector = dict(meta["labels"])
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas_for(ws.desired_state),
            "progressDeadlineSeconds": PROGRESS_DEADLINE_S,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": dict(meta["labels"]), "annotations": dict(meta["annotations"])},
                "spec": pod_spec,
            },
        },
    }


def _service(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    meta = _metadata(ws, ws.name, owner)
    ports = [
        {"name": e.name, "port": e.target_port, "targetPort": e.target_port, "protocol": "TCP"}
        for c in ws.devfile.containers
        for e in c.endpoints
    ]
    if ws.devfile.editor_injected:
        ports.append({"name": EDITOR_PORT_NAME, "port": EDITOR_PORT, "targetPort": EDITOR_PORT, "protocol": "TCP"})
    spec: dict[str, Any] = {"selector": dict(meta["labels"]), "ports": ports}
    if not ports:
        # A Service needs a port; without endpoints it is headless and selects the pod for DNS only.
        spec = {"selector": dict(meta["labels"]), "clusterIP": "None"}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def _pvc(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    size = next((s for s in ws.devfile.volumes.values() if s), DEFAULT_DATA_SIZE)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(ws, f"{ws.name}-{DATA_VOLUME}", owner),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def _service_account(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(ws, ws.name, owner),
        "automountServiceAccountToken": False,
        "imagePullSecrets": [{"name": secret["name"]} for secret in ws.settings.image_pull_secrets],
    }


def _network_policy(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    egress: list[dict[str, Any]] = [
        {
            "ports": [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
        }
    ]
    egress += [
        {"to": [{"ipBlock": {"cidr": rule["allow"], "except": list(rule.get("except", []))}}]}
        for rule in ws.settings.network_policy_egress
    ]
    selector = {"matchLabels": {WORKSPACE_ID_LABEL: str(ws.id)}} if ws.settings.shared_namespace else {}
    proxy_namespace = ws.settings.gitlab_workspaces_proxy_namespace
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(ws, ws.name, owner),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": proxy_namespace}},
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "gitlab-workspaces-proxy"}},
                        }
                    ]
                }
            ],
            "egress": egress,
        },
    }


def _scripts(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    data = {command_id: line for command_id, line, _component in ws.devfile.post_start}
    data["gl-run-poststart-commands.sh"] = "#!/bin/sh\n" + "".join(
        f"sh -c {json.dumps(line)} || echo 'postStart {command_id} failed' >&2\n"
        for command_id, line, _component in ws.devfile.post_start
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ws, f"{ws.name}-scripts-configmap", owner),
        "data": data,
    }


def _quota(ws: WorkspaceSpec, owner: str) -> dict[str, Any]:
    limits = ws.settings.max_resources_per_workspace
    hard = {f"{kind}.{key}": value for kind in ("limits", "requests") for key, value in limits.get(kind, {}).items()}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _metadata(ws, ws.name, owner),
        "spec": {"hard": hard},
    }


def _secret(ws: WorkspaceSpec, name: str, owner: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(ws, name, owner),
        "data": {key: _b64(value) for key, value in data.items()},
    }


def resources(ws: WorkspaceSpec, inclusion: Inclusion) -> list[dict[str, Any]]:
    """The objects for ``ws`` in upstream order (reference §4.2 table; vectors §V10).

    ``Terminated`` gives only the two inventories (applying them empty prunes everything, §4.3);
    :attr:`Inclusion.NONE` gives nothing; :attr:`Inclusion.PARTIAL` the partial set; :attr:`Inclusion.ALL`
    the partial set plus the secrets inventory, the ResourceQuota (when configured and the namespace is not
    shared) and the two Secrets.
    """
    workspace_inventory = f"{ws.name}-workspace-inventory"
    secrets_inventory = f"{ws.name}-secrets-inventory"
    if inclusion is Inclusion.NONE:
        return []
    if ws.desired_state == State.TERMINATED:
        return [_inventory(ws, workspace_inventory), _inventory(ws, secrets_inventory)]
    objects = [
        _inventory(ws, workspace_inventory),
        _deployment(ws, workspace_inventory),
        _service(ws, workspace_inventory),
        _pvc(ws, workspace_inventory),
        _service_account(ws, workspace_inventory),
    ]
    if ws.settings.network_policy_enabled:
        objects.append(_network_policy(ws, workspace_inventory))
    if ws.devfile.post_start:
        objects.append(_scripts(ws, workspace_inventory))
    if inclusion is Inclusion.ALL:
        objects.append(_inventory(ws, secrets_inventory))
        if ws.settings.max_resources_per_workspace and not ws.settings.shared_namespace:
            objects.append(_quota(ws, workspace_inventory))
        objects.append(_secret(ws, f"{ws.name}-env-var", secrets_inventory, ws.env_variables))
        files = {**ws.file_variables, ACTUAL_STATE_FILE: ws.actual_state}
        objects.append(_secret(ws, f"{ws.name}-file", secrets_inventory, files))
    return objects


def render(objects: list[dict[str, Any]]) -> str:
    """One YAML stream: each object a ``---`` document with deep-sorted keys; ``""`` for no objects.

    Each document is a JSON object on one line (JSON is YAML), encoded by msgspec: a full sync of a thousand
    workspaces renders ten thousand objects.
    """
    return "".join(f"--- {msgspec.json.encode(obj, order='sorted').decode()}\n" for obj in objects)
