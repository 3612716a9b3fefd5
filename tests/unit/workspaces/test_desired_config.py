"""Resource-set composition (vectors §V10) and its invariants; devfile validation errors name the field."""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest
import yaml

from tether.modules.remote_development.hub.desired_config import WorkspaceSpec, render, resources
from tether.modules.remote_development.hub.devfile import DEFAULT_DEVFILE, DevfileError, parse_devfile
from tether.modules.remote_development.hub.rules import Inclusion
from tether.modules.remote_development.hub.settings import WorkspacesSettings

DEVFILE = """schemaVersion: 2.2.0
components:
  - name: tooling
    container:
      image: quay.io/example/tools:1
      memoryLimit: 1Gi
      env: [{name: A, value: "1"}]
      endpoints: [{name: web, targetPort: 8080}]
  - name: data
    volume: {size: 5Gi}
commands:
  - id: setup
    exec: {component: tooling, commandLine: "echo hi"}
events:
  postStart: [setup]
"""


def spec(**changes: object) -> WorkspaceSpec:
    base = WorkspaceSpec(
        id=7,
        name="ws-a",
        namespace="gl-rd-ns-a",
        agent_id=3,
        desired_state="Running",
        actual_state="Starting",
        devfile=parse_devfile(DEVFILE),
        settings=WorkspacesSettings(enabled=True, dns_zone="ws.example.com"),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def kinds(objects: list[dict]) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


PARTIAL = [
    ("ConfigMap", "ws-a-workspace-inventory"),
    ("Deployment", "ws-a"),
    ("Service", "ws-a"),
    ("PersistentVolumeClaim", "ws-a-gl-workspace-data"),
    ("ServiceAccount", "ws-a"),
    ("NetworkPolicy", "ws-a"),
    ("ConfigMap", "ws-a-scripts-configmap"),
]


def test_v10_partial_and_all_sets() -> None:
    assert kinds(resources(spec(), Inclusion.PARTIAL)) == PARTIAL
    assert kinds(resources(spec(), Inclusion.ALL)) == [
        *PARTIAL,
        ("ConfigMap", "ws-a-secrets-inventory"),
        ("Secret", "ws-a-env-var"),
        ("Secret", "ws-a-file"),
    ]
    quota = replace(spec().settings, max_resources_per_workspace={"limits": {"cpu": "2", "memory": "4Gi"}})
    with_quota = kinds(resources(spec(settings=quota), Inclusion.ALL))
    assert with_quota[8] == ("ResourceQuota", "ws-a")
    shared = replace(quota, shared_namespace="shared")
    assert ("ResourceQuota", "ws-a") not in kinds(resources(spec(settings=shared), Inclusion.ALL))


def test_v10_optional_members() -> None:
    no_policy = replace(spec().settings, network_policy_enabled=False)
    plain = replace(spec(), devfile=parse_devfile(DEFAULT_DEVFILE), settings=no_policy)
    assert kinds(resources(plain, Inclusion.PARTIAL)) == [
        k for k in PARTIAL if k[0] != "NetworkPolicy" and k[1] != "ws-a-scripts-configmap"
    ]


@pytest.mark.parametrize("inclusion", [Inclusion.PARTIAL, Inclusion.ALL])
def test_v10_terminated_is_only_the_inventories(inclusion: Inclusion) -> None:
    assert kinds(resources(spec(desired_state="Terminated"), inclusion)) == [
        ("ConfigMap", "ws-a-workspace-inventory"),
        ("ConfigMap", "ws-a-secrets-inventory"),
    ]


def test_nothing_for_none() -> None:
    assert render(resources(spec(), Inclusion.NONE)) == ""


def test_v10_invariants() -> None:
    objects = resources(spec(), Inclusion.ALL)
    for obj in objects:
        meta = obj["metadata"]
        assert meta["labels"]["agent.gitlab.com/id"] == "3"
        assert meta["annotations"]["workspaces.gitlab.com/host-template"] == "{{.port}}-ws-a.ws.example.com"
        assert meta["annotations"]["workspaces.gitlab.com/id"] == "7"
        assert meta["namespace"] == "gl-rd-ns-a"
        inventory_id = meta["labels"].get("cli-utils.sigs.k8s.io/inventory-id")
        if inventory_id is not None:
            assert inventory_id == meta["name"] and "config.k8s.io/owning-inventory" not in meta["annotations"]
        elif obj["kind"] == "Secret":
            assert meta["annotations"]["config.k8s.io/owning-inventory"] == "ws-a-secrets-inventory"
        else:
            assert meta["annotations"]["config.k8s.io/owning-inventory"] == "ws-a-workspace-inventory"
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["template"]["metadata"]["labels"]["agent.gitlab.com/id"] == "3"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "quay.io/example/tools:1" and container["resources"]["limits"]["memory"] == "1Gi"
    file_secret = next(o for o in objects if o["metadata"]["name"] == "ws-a-file")
    assert base64.b64decode(file_secret["data"]["gl_workspace_reconciled_actual_state.txt"]).decode() == "Starting"
    for desired in ("Stopped", "RestartRequested"):
        stopped = next(
            o for o in resources(spec(desired_state=desired), Inclusion.PARTIAL) if o["kind"] == "Deployment"
        )
        assert stopped["spec"]["replicas"] == 0


def test_shared_namespace_labels_and_selector() -> None:
    shared = replace(spec().settings, shared_namespace="shared")
    objects = resources(spec(settings=shared), Inclusion.PARTIAL)
    assert all(o["metadata"]["labels"]["workspaces.gitlab.com/id"] == "7" for o in objects)
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"workspaces.gitlab.com/id": "7"}}


def test_render_is_a_yaml_stream_with_deep_sorted_keys() -> None:
    objects = resources(spec(), Inclusion.ALL)
    text = render(objects)
    assert text.startswith("--- ")
    documents = list(yaml.safe_load_all(text))
    assert documents == objects
    assert render([{"a": {"z": 1, "a": 1}}]) == '--- {"a":{"a":1,"z":1}}\n'


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("schemaVersion: 2.2.0\ncomponents: []\n", "devfile.components", "must be a non-empty list"),
        (
            "schemaVersion: 2.0.0\ncomponents: [{name: a, container: {image: x}}]",
            "devfile.schemaVersion",
            "not supported",
        ),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: a, container: {}}]",
            "devfile.components[0].container.image",
            "is missing",
        ),
        (
            "schemaVersion: 2.2.0\nbogus: 1\ncomponents: [{name: a, container: {image: x}}]",
            "devfile.bogus",
            "unknown field",
        ),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: a, container: {image: x, colour: red}}]",
            "devfile.components[0].container.colour",
            "unknown field",
        ),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: Bad_Name, container: {image: x}}]",
            "devfile.components[0].name",
            "not a DNS label",
        ),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: a, kubernetes: {uri: x}}]",
            "devfile.components[0].kubernetes",
            "not supported",
        ),
        ("schemaVersion: 2.2.0\ncomponents: [{name: a, volume: {}}]", "devfile.components", "at least one container"),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: a, container: {image: x, endpoints: "
            "[{name: w, targetPort: 0}]}}]",
            "devfile.components[0].container.endpoints[0].targetPort",
            "1-65535",
        ),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: a, container: {image: x, memoryLimit: lots}}]",
            "devfile.components[0].container.memoryLimit",
            "quantity",
        ),
        (
            "schemaVersion: 2.2.0\ncomponents: [{name: a, container: {image: x}}]\nevents: {postStart: [nope]}",
            "devfile.events.postStart[0]",
            "not a command id",
        ),
        ("[1, 2", "devfile", "not valid YAML"),
        ("- a list", "devfile", "must be a mapping"),
    ],
)
def test_devfile_errors_name_the_field(text: str, field: str, problem: str) -> None:
    with pytest.raises(DevfileError) as caught:
        parse_devfile(text)
    assert caught.value.field == field and problem in caught.value.problem


def test_devfile_size_limit() -> None:
    with pytest.raises(DevfileError, match="too large"):
        parse_devfile("schemaVersion: 2.2.0\n" + "#" * 70000)
