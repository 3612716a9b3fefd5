"""The Helm charts in deploy/helm: lint, the values schemas, what they render, and the real API server's verdict.

helm is the one ``make bootstrap`` builds from its Go module; ``kubectl apply --dry-run=server`` sends the
rendered objects to the test cluster's kube-apiserver, which validates them as it would on install.
Every flag, environment variable and configuration key the charts give Tether is checked against the real CLI
and configuration schemas.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.k8s import Kubectl
from tether import __version__
from tether.agentk.command import agentk_command
from tether.hub.config import ENV_OVERRIDES
from tether.hub.config import load_config as load_hub_config
from tether.kas.config import load_config
from tether_devenv.assets import K8S_VERSION
from tether_devenv.front_proxy import TEMPLATE, FrontProxyParameters, haproxy_binary, render_config
from tether_devenv.helm import helm_path
from tether_devenv.pki import generate, issue

CHARTS = Path(__file__).resolve().parents[2] / "deploy" / "helm"
AGENT = CHARTS / "tether-agent"
SERVER = CHARTS / "tether"
TOKEN = ["--set", "config.token=glagent-test-token"]


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    helm = helm_path()
    if not helm.is_file():
        pytest.fail(f"{helm} is missing: run `bash scripts/bootstrap.sh` (it builds helm from its Go module)")
    return subprocess.run([str(helm), *args], capture_output=True, text=True, check=False, timeout=120)


def render(chart: Path, *values: str, namespace: str = "tether") -> list[dict[str, Any]]:
    result = _helm("template", "t", str(chart), "--namespace", namespace, "--kube-version", K8S_VERSION, *values)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(chart: Path, *values: str) -> str:
    result = _helm("template", "t", str(chart), "--kube-version", K8S_VERSION, *values)
    assert result.returncode != 0, "rendering should have failed"
    return result.stderr


def kinds(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        found.setdefault(doc["kind"], []).append(doc)
    return found


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in kinds(docs).get(kind, []) if d["metadata"]["name"] == name]
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a ``matchLabels`` (or a Service's) selector selects a pod with ``labels``."""
    return all(labels.get(key) == value for key, value in selector.items())


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def container(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for deployment in kinds(docs)["Deployment"]:
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            if c["name"] == name:
                return c  # type: ignore[no-any-return]
    raise AssertionError(f"no container {name}")


@pytest.mark.parametrize("chart", [AGENT, SERVER], ids=lambda c: c.name)
def test_helm_lint(chart: Path) -> None:
    result = _helm("lint", "--strict", str(chart), *(TOKEN if chart == AGENT else []))
    assert result.returncode == 0, result.stdout + result.stderr


# --- tether-agent --------------------------------------------------------------------------------------------


def test_agent_without_a_token_says_what_to_set() -> None:
    assert "set config.token" in render_error(AGENT)


def test_agent_defaults_are_restricted_and_probed() -> None:
    docs = render(AGENT, *TOKEN)
    deployment = kinds(docs)["Deployment"][0]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 65532
    agentk = container(docs, "agentk")
    sc = agentk["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert agentk["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "observability"}
    assert agentk["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "observability"}
    assert agentk["ports"] == [{"name": "observability", "containerPort": 8080, "protocol": "TCP"}]
    assert {e["name"] for e in agentk["env"]} >= {"POD_NAMESPACE", "POD_NAME"}
    # The root is read-only; agentk's internal server binds its socket in a temporary directory.
    assert {"name": "tmp", "mountPath": "/tmp"} in agentk["volumeMounts"]
    assert kinds(docs)["PodDisruptionBudget"][0]["spec"]["maxUnavailable"] == 1
    assert kinds(docs)["Pod"][0]["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_agent_args_are_real_agentk_flags() -> None:
    docs = render(AGENT, *TOKEN, "--set-string", "config.kasCaCert=PEM", "--set", "config.kasHeaders[0]=X-A: b")
    known = {opt for param in agentk_command.params for opt in getattr(param, "opts", [])}
    args = container(docs, "agentk")["args"]
    assert args[0] == "--kas-address=grpcs://kas.example.com:443"
    assert {a.split("=", 1)[0] for a in args} <= known
    assert "--ca-cert-file=/etc/agentk/kas-ca/ca.crt" in args
    assert "--observability-listen-address=:8080" in args


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (role,) = kinds(docs)["ClusterRole"]
    return role["rules"]  # type: ignore[no-any-return]


def test_least_privilege_preset_has_no_wildcards_and_reads_no_secrets() -> None:
    docs = render(AGENT, *TOKEN)
    rules = _rules(docs)
    for rule in rules:
        for key in ("verbs", "resources", "apiGroups", "nonResourceURLs"):
            assert "*" not in rule.get(key, []), rule
    secrets = [r for r in rules if "secrets" in r.get("resources", [])]
    assert all(not {"get", "list", "watch"} & set(r["verbs"]) for r in secrets)
    impersonation = {res for r in rules if "impersonate" in r["verbs"] for res in r["resources"]}
    assert {"users", "groups", "userextras/agent.gitlab.com/id"} <= impersonation
    (binding,) = kinds(docs)["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "t-tether-agent"
    (lease_role,) = kinds(docs)["Role"]
    # The Lease, and the pod and ReplicaSet agentk reads to make its Deployment the Lease's owner.
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get"]},
    ]


def test_least_privilege_parts_can_be_turned_off() -> None:
    docs = render(
        AGENT, *TOKEN, "--set", "rbac.leastPrivilege.workspaces=false,rbac.leastPrivilege.impersonation=false"
    )
    verbs = {v for r in _rules(docs) for v in r["verbs"]}
    assert verbs == {"get", "list", "watch"}


@pytest.mark.parametrize(
    ("values", "role"),
    [(["--set", "rbac.preset=clusterAdmin"], "cluster-admin"), (["--set", "rbac.useExistingRole=mine"], "mine")],
)
def test_agent_binds_cluster_admin_or_an_existing_role_instead(values: list[str], role: str) -> None:
    docs = render(AGENT, *TOKEN, *values)
    assert "ClusterRole" not in kinds(docs)
    assert kinds(docs)["ClusterRoleBinding"][0]["roleRef"]["name"] == role
    assert "Role" in kinds(docs), "the Lease Role comes with every RBAC choice"


def test_agent_rbac_create_false_creates_no_rbac() -> None:
    found = kinds(render(AGENT, *TOKEN, "--set", "rbac.create=false"))
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & set(found)


def test_agent_token_from_an_existing_secret() -> None:
    docs = render(AGENT, "--set", "config.secretName=my-agent-token")
    assert "Secret" not in kinds(docs)
    volumes = kinds(docs)["Deployment"][0]["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["secret"]["secretName"] == "my-agent-token"


@pytest.mark.parametrize(
    ("address", "port"), [("grpc://kas.tether:8150", 8150), ("grpcs://kas.example.com", 443), ("grpc://kas", 80)]
)
def test_network_policy_allows_dns_kas_and_the_api_server_only(address: str, port: int) -> None:
    docs = render(AGENT, *TOKEN, "--set", f"config.kasAddress={address}")
    (policy,) = kinds(docs)["NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress = policy["spec"]["egress"]
    assert [p["port"] for p in egress[0]["ports"]] == [53, 53]
    assert egress[1]["ports"] == [{"port": port, "protocol": "TCP"}]
    assert [p["port"] for p in egress[2]["ports"]] == [443, 6443]
    assert len(egress) == 3


def test_service_monitor_switch() -> None:
    assert "ServiceMonitor" not in kinds(render(AGENT, *TOKEN))
    (monitor,) = kinds(render(AGENT, *TOKEN, "--set", "serviceMonitor.enabled=true"))["ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["port"] == "observability"


def test_helm_test_pod_is_outside_the_charts_own_selectors() -> None:
    """The NetworkPolicy (egress to DNS, kas and the API server only) once selected `helm test`'s pod and blocked
    its request to the agentk Service; the Service and the PodDisruptionBudget counted it as an agentk pod."""
    docs = render(AGENT, *TOKEN)
    (pod,) = kinds(docs)["Pod"]
    labels = pod["metadata"]["labels"]
    (policy,) = kinds(docs)["NetworkPolicy"]
    (service,) = kinds(docs)["Service"]
    (budget,) = kinds(docs)["PodDisruptionBudget"]
    assert not selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    assert not selects(service["spec"]["selector"], labels)
    assert not selects(budget["spec"]["selector"]["matchLabels"], labels)
    # The agentk pods let anyone in on the port the test asks (the probes' and metrics' port).
    assert policy["spec"]["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert f"http://t-tether-agent:{service['spec']['ports'][0]['port']}/readiness" in "".join(
        pod["spec"]["containers"][0]["command"]
    )


@pytest.mark.parametrize(
    ("chart", "values"),
    [
        (AGENT, [*TOKEN, "--set", "replicas=1"]),
        (AGENT, TOKEN),
        (SERVER, ["--set", "kas.replicas=1"]),
        (SERVER, ["--set", "frontProxy.replicas=1"]),
        (SERVER, []),
    ],
    ids=["agent-1", "agent-2", "kas-1", "front-proxy-1", "server-defaults"],
)
def test_no_pod_disruption_budget_blocks_a_node_drain(chart: Path, values: list[str]) -> None:
    """A budget that allows no eviction (minAvailable 1 of 1 replica) makes `kubectl drain` wait forever."""
    docs = render(chart, *values)
    budgets = kinds(docs)["PodDisruptionBudget"]
    assert budgets
    for budget in budgets:
        selector = budget["spec"]["selector"]["matchLabels"]
        (covered,) = [d for d in kinds(docs)["Deployment"] if selects(selector, pod_labels(d))]
        spec = budget["spec"]
        if "minAvailable" in spec:
            assert int(spec["minAvailable"]) < covered["spec"]["replicas"], budget["metadata"]["name"]
        else:
            assert int(spec["maxUnavailable"]) >= 1, budget["metadata"]["name"]


def test_least_privilege_writes_workspace_objects_by_server_side_apply_only() -> None:
    """agentk writes workspace objects by server-side apply (PATCH, plus `create` for a new object) and prunes
    them (DELETE); it never replaces one (PUT: `update`) and never reads a Secret (applier.py)."""
    rules = _rules(render(AGENT, *TOKEN))
    secrets = {verb for rule in rules if "secrets" in rule.get("resources", []) for verb in rule["verbs"]}
    assert secrets == {"create", "patch", "delete"}
    assert not [rule for rule in rules if "update" in rule["verbs"]]


@pytest.mark.k8s
def test_least_privilege_lets_agentk_apply_and_prune_a_secret_but_not_read_or_replace_it(
    kubectl: Kubectl, k8s_namespace: str
) -> None:
    """The real API server's verdict on the preset, as agentk's applier calls it (server-side apply, force)."""
    release = f"r{uuid.uuid4().hex[:8]}"
    result = _helm("template", release, str(AGENT), "--namespace", k8s_namespace, "--kube-version", K8S_VERSION, *TOKEN)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] in ("ServiceAccount", "ClusterRole")]
    docs += [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ClusterRoleBinding"]
    kubectl.run("apply", "-n", k8s_namespace, "-f", "-", input_text=yaml.safe_dump_all(docs))
    agent = f"--as=system:serviceaccount:{k8s_namespace}:{release}-tether-agent"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ws-env-var", "namespace": k8s_namespace}}
    apply = ["apply", agent, "--server-side", "--force-conflicts", "--field-manager=agentk", "-f", "-"]
    try:
        for value in ("one", "two"):  # created, then changed: both by server-side apply
            written = {**secret, "stringData": {"A": value}}
            kubectl.run(*apply, input_text=yaml.safe_dump(written))
        assert "Forbidden" in kubectl.run("get", agent, "-n", k8s_namespace, "secret/ws-env-var", check=False).stderr
        replace = kubectl.run("replace", agent, "-f", "-", input_text=yaml.safe_dump(secret), check=False)
        assert "Forbidden" in replace.stderr
        kubectl.run("delete", agent, "-n", k8s_namespace, "secret/ws-env-var")
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            kubectl.run("delete", kind, f"{release}-tether-agent", "--ignore-not-found", check=False)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "rbac.preset=admin"], "/rbac/preset"),
        (["--set", "config.kasAddress=https://kas.example.com"], "/config/kasAddress"),
        (["--set", "replica=3"], "replica"),
        (["--set", "replicas=0"], "/replicas"),
    ],
)
def test_agent_schema_rejects_bad_values(values: list[str], message: str) -> None:
    assert message in render_error(AGENT, *TOKEN, *values)


AGENT_COMBINATIONS = [
    [],
    ["--set", "rbac.preset=clusterAdmin", "--set-string", "config.kasCaCert=-----BEGIN CERTIFICATE-----"],
    ["--set", "networkPolicy.enabled=false,podDisruptionBudget.enabled=false,serviceAccount.create=false"],
    ["--set", "networkPolicy.allowPodEgress=true,networkPolicy.apiServerCidrs[0]=10.0.0.1/32"],
]


@pytest.mark.k8s
@pytest.mark.parametrize("values", AGENT_COMBINATIONS, ids=range(len(AGENT_COMBINATIONS)))
def test_agent_chart_is_valid_for_the_api_server(values: list[str], kubectl: Kubectl, k8s_namespace: str) -> None:
    docs = render(AGENT, *TOKEN, *values, namespace=k8s_namespace)
    _dry_run(kubectl, docs, k8s_namespace)


def _dry_run(kubectl: Kubectl, docs: list[dict[str, Any]], namespace: str) -> None:
    manifest = yaml.safe_dump_all(docs)
    result = kubectl.run("apply", "--dry-run=server", "-n", namespace, "-f", "-", input_text=manifest, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


# --- tether (server side) ------------------------------------------------------------------------------------


def test_kas_configuration_is_valid_for_kas(tmp_path: Path) -> None:
    values = ["--set", "kas.tls.secretName=kas-tls,redis.bundled=false,redis.external.address=redis:6379"]
    values += ["--set", "frontProxy.enabled=false"]  # kas terminates the agent side's TLS itself
    values += ["--set", "redis.external.passwordSecret=redis-pw,kas.workspaces.enabled=true"]
    values += ["--set", "kas.workspaces.dnsZones[0]=workspaces.example.com"]
    values += ["--set", "kas.extraConfig.routing.tunnel_find_timeout=30s"]
    (config_map,) = kinds(render(SERVER, *values))["ConfigMap"]
    (tmp_path / "kas.yaml").write_text(config_map["data"]["kas.yaml"])
    config = load_config(tmp_path / "kas.yaml")
    assert config.agent.listen.address == "0.0.0.0:8150"
    assert config.agent.listen.certificate_file == Path("/etc/tether/tls/tls.crt")
    assert config.redis is not None
    assert config.redis.password_file == Path("/etc/tether/redis/password")
    assert config.workspaces is not None
    assert config.routing.tunnel_find_timeout == 30.0
    # The audit spool stays below the 64Mi /tmp emptyDir it lives in (a full emptyDir evicts the pod).
    assert config.audit.spool_dir == Path("/tmp/audit-spool") and config.audit.spool_max_bytes < 64 * 2**20


def test_server_defaults_render_kas_hub_and_a_trial_redis() -> None:
    docs = render(SERVER)
    names = {d["metadata"]["name"] for d in kinds(docs)["Deployment"]}
    assert names == {"t-tether-kas", "t-tether-hub", "t-tether-redis", "t-tether-front-proxy"}
    kas = container(docs, "kas")
    assert kas["args"] == ["--configuration-file=/etc/tether/kas/kas.yaml"]
    assert {"name": "OWN_PRIVATE_API_URL", "value": "grpc://$(POD_IP):8155"} in kas["env"]
    hub = container(docs, "hub")
    assert {e["name"] for e in hub["env"]} <= set(ENV_OVERRIDES)
    for c in (kas, hub):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert kinds(docs)["PersistentVolumeClaim"][0]["metadata"]["name"] == "t-tether-hub"
    (secret,) = kinds(docs)["Secret"]
    assert set(secret["data"]) == {"gitlab_secret", "api_secret", "private_api_secret", "gitaly_token"}


def test_hub_on_postgresql_keeps_the_url_in_a_secret_and_scales() -> None:
    docs = render(SERVER, "--set", "hub.database.url=postgresql+asyncpg://u:p@db:5432/hub,hub.replicas=2")
    assert "PersistentVolumeClaim" not in kinds(docs)
    env = {e["name"]: e for e in container(docs, "hub")["env"]}
    assert env["TETHER_HUB_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "t-tether-database", "key": "url"}
    assert "u:p@" not in yaml.safe_dump(container(docs, "hub"))


def test_hub_on_sqlite_refuses_two_replicas() -> None:
    assert "SQLite serves one replica" in render_error(SERVER, "--set", "hub.replicas=2")


def test_external_redis_needs_an_address() -> None:
    assert "redis.external.address" in render_error(SERVER, "--set", "redis.bundled=false")


def test_kas_finds_its_redis_through_sentinel_over_tls(tmp_path: Path) -> None:
    """redis.external.sentinel and .tls become kas' redis.sentinel and redis.tls, each file mounted from its Secret."""
    values = ["--set", "redis.bundled=false,redis.external.passwordSecret=redis-pw"]
    values += ["--set", "redis.external.sentinel.masterName=tether,redis.external.sentinel.passwordSecret=sentinel-pw"]
    values += ["--set", "redis.external.sentinel.addresses={s-0.redis:26379,s-1.redis:26379,s-2.redis:26379}"]
    values += ["--set", "redis.external.tls.enabled=true,redis.external.tls.caSecret=redis-ca"]
    values += ["--set", "redis.external.tls.clientSecret=redis-client"]
    docs = render(SERVER, *values)
    (tmp_path / "kas.yaml").write_text(named(docs, "ConfigMap", "t-tether-kas")["data"]["kas.yaml"])
    redis = load_config(tmp_path / "kas.yaml").redis
    assert redis is not None and redis.server is None and redis.sentinel is not None
    assert (redis.sentinel.master_name, len(redis.sentinel.addresses)) == ("tether", 3)
    assert redis.tls.enabled and redis.tls.key_file is not None
    files = [redis.password_file, redis.sentinel.sentinel_password_file]
    files += [redis.tls.ca_certificate_file, redis.tls.certificate_file, redis.tls.key_file]
    kas = named(docs, "Deployment", "t-tether-kas")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in kas["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in kas["volumes"] if "secret" in v}
    for file in files:
        assert file is not None
        (volume,) = [name for name, path in mounts.items() if file.parent == Path(path)]
        assert file.name in [item["path"] for item in secrets[volume]["items"]], file
    assert {secrets[v]["secretName"] for v in mounts if v.startswith("redis-")} == {
        "redis-pw",
        "sentinel-pw",
        "redis-ca",
        "redis-client",
    }


def test_sentinel_needs_its_sentinels_and_no_address_beside_it() -> None:
    sentinel = ["--set", "redis.bundled=false,redis.external.sentinel.masterName=tether"]
    assert "redis.external.sentinel.addresses" in render_error(SERVER, *sentinel)
    both = [*sentinel, "--set", "redis.external.address=redis:6379,redis.external.sentinel.addresses={s:26379}"]
    assert "not both" in render_error(SERVER, *both)
    bad = [*sentinel, "--set", "redis.external.sentinel.addresses={sentinel-without-port}"]
    assert "addresses" in render_error(SERVER, *bad)


def test_ingress_passes_grpc_to_the_agent_listener_and_long_websockets_to_the_proxy() -> None:
    hosts = "ingress.kasAgentHost=kas.example.com,ingress.kasProxyHost=k8s.example.com,ingress.hubHost=hub.example.com"
    docs = render(SERVER, "--set", f"ingress.enabled=true,{hosts}")
    ingresses = {i["metadata"]["name"]: i for i in kinds(docs)["Ingress"]}
    agent = ingresses["t-tether-agent"]
    assert agent["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    backend = agent["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "t-tether-front-proxy", "port": {"name": "grpc-agent"}}
    # Every agent connection comes from the ingress controller: one source address for all of them.
    assert "reject if { sc0_conn_cur gt 20000 }" in _front_proxy_config(docs)
    direct = render(SERVER, "--set", f"ingress.enabled=true,{hosts},frontProxy.enabled=false")
    agent = named(direct, "Ingress", "t-tether-agent")
    backend = agent["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "t-tether-kas", "port": {"name": "grpc-agent"}}
    proxy = ingresses["t-tether-proxy"]["metadata"]["annotations"]
    assert proxy["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "7200"
    assert "t-tether-hub" in ingresses


def test_server_schema_rejects_bad_values() -> None:
    assert "/redis/external/address" in render_error(SERVER, "--set", "redis.external.address=redis://x")
    assert "/kas/replicas" in render_error(SERVER, "--set", "kas.replicas=0")


# --- tether: the front proxy, NetworkPolicies and the hub's Gitaly service -------------------------------------


def _front_proxy_config(docs: list[dict[str, Any]]) -> str:
    return named(docs, "ConfigMap", "t-tether-front-proxy")["data"]["haproxy.cfg"]  # type: ignore[no-any-return]


def test_the_chart_carries_the_shipped_front_proxy_template() -> None:
    """Helm reads files inside the chart only: its copy of deploy/front-proxy/haproxy.cfg.template stays identical."""
    assert (SERVER / "files" / "haproxy.cfg.template").read_text() == TEMPLATE.read_text()


def test_the_front_proxy_is_on_by_default_before_kas_agent_listener() -> None:
    docs = render(SERVER)
    proxy = container(docs, "front-proxy")
    assert proxy["image"] == f"localhost/tether/front-proxy:{__version__}"
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "config", "mountPath": "/etc/tether/front-proxy", "readOnly": True} in proxy["volumeMounts"]
    # kas' Service by its short name, resolved at start with the pod's search domains: no run-time `resolvers`,
    # which would look the short name up without them, fail, and take kas out of the proxy after 30 s.
    assert _front_proxy_config(docs) == render_config(FrontProxyParameters(":8150", "t-tether-kas:8150"))
    deployment = named(docs, "Deployment", "t-tether-front-proxy")
    assert deployment["spec"]["replicas"] == 2
    service = named(docs, "Service", "t-tether-front-proxy")
    assert service["spec"]["ports"][0]["targetPort"] == "agent"
    assert selects(service["spec"]["selector"], pod_labels(deployment))
    # kas' agent listener accepts the front proxy only; its other listeners stay reachable.
    policy = named(docs, "NetworkPolicy", "t-tether-kas")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels(named(docs, "Deployment", "t-tether-kas")))
    to_agent = [rule for rule in policy["spec"]["ingress"] if {"port": 8150, "protocol": "TCP"} in rule["ports"]]
    assert to_agent == [
        {
            "from": [{"podSelector": {"matchLabels": pod_labels(deployment)}}],
            "ports": [{"port": 8150, "protocol": "TCP"}],
        }
    ]
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {8150, 8151, 8153, 8154, 8155}


def test_with_tls_the_front_proxy_terminates_it_and_kas_listens_in_plaintext_behind(tmp_path: Path) -> None:
    docs = render(SERVER, "--set", "kas.tls.secretName=kas-tls,frontProxy.service.type=LoadBalancer")
    assert "bind :8150 ssl crt /etc/tether/front-proxy/tls/agent.pem alpn h2" in _front_proxy_config(docs)
    volumes = {
        v["name"]: v for v in named(docs, "Deployment", "t-tether-front-proxy")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["tls"]["secret"] == {
        "secretName": "kas-tls",
        "items": [{"key": "tls.crt", "path": "agent.pem"}, {"key": "tls.key", "path": "agent.pem.key"}],
    }
    service = named(docs, "Service", "t-tether-front-proxy")["spec"]
    assert service["type"] == "LoadBalancer"
    assert service["externalTrafficPolicy"] == "Local", "the per-source connection limit needs agents' addresses"
    config_map = named(docs, "ConfigMap", "t-tether-kas")
    (tmp_path / "kas.yaml").write_text(config_map["data"]["kas.yaml"])
    config = load_config(tmp_path / "kas.yaml")
    assert config.agent.listen.certificate_file is None
    assert config.agent.kubernetes_api is not None
    assert config.agent.kubernetes_api.listen.certificate_file == Path("/etc/tether/tls/tls.crt")


FRONT_PROXY_VALUES = [
    [],
    ["--set", "kas.tls.secretName=kas-tls"],
    ["--set", "ingress.enabled=true,ingress.kasAgentHost=kas.example.com"],
    ["--set", "frontProxy.maxConnections=500,frontProxy.headerBlockBytes=32768,frontProxy.streamIdleTimeout=90m"],
]


@pytest.mark.parametrize("values", FRONT_PROXY_VALUES, ids=["defaults", "tls", "ingress", "tuned"])
def test_the_rendered_haproxy_configuration_is_valid(values: list[str], tmp_path: Path) -> None:
    """``haproxy -c`` (Debian's, the one the image carries) accepts what the chart renders. kas' Service name
    resolves in a pod only; ``tests/deploy/test_front_proxy_image.py`` checks the unchanged file in the image."""
    config = _front_proxy_config(render(SERVER, *values))
    tls = tmp_path / "tls"
    pki = generate(tmp_path / "pki")
    cert, key = issue(pki.ca_cert, pki.ca_key, tmp_path / "pki", "kas", "kas.example.com", server=True)
    tls.mkdir()
    shutil.copyfile(cert, tls / "agent.pem")
    shutil.copyfile(key, tls / "agent.pem.key")
    config = config.replace("/etc/tether/front-proxy/tls/", f"{tls}/").replace(" t-tether-kas:", " 127.0.0.1:")
    (tmp_path / "haproxy.cfg").write_text(config)
    result = subprocess.run(
        [haproxy_binary(), "-c", "-f", str(tmp_path / "haproxy.cfg")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout


def test_only_kas_reaches_the_bundled_redis() -> None:
    docs = render(SERVER)
    policy = named(docs, "NetworkPolicy", "t-tether-redis")
    assert selects(
        policy["spec"]["podSelector"]["matchLabels"], pod_labels(named(docs, "Deployment", "t-tether-redis"))
    )
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == [], "Redis dials nothing"
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    (peer,) = rule["from"]
    allowed = [
        d["metadata"]["name"]
        for d in kinds(docs)["Deployment"]
        if selects(peer["podSelector"]["matchLabels"], pod_labels(d))
    ]
    assert allowed == ["t-tether-kas"]
    assert set(peer) == {"podSelector"}, "pods of this namespace only"
    (test_pod,) = kinds(docs)["Pod"]
    assert not selects(peer["podSelector"]["matchLabels"], test_pod["metadata"]["labels"])
    external = render(SERVER, "--set", "redis.bundled=false,redis.external.address=redis:6379")
    assert [p["metadata"]["name"] for p in kinds(external)["NetworkPolicy"]] == ["t-tether-kas"]
    assert "NetworkPolicy" not in kinds(render(SERVER, "--set", "networkPolicy.enabled=false"))


def test_the_hub_serves_its_gitaly_service_to_kas_by_default() -> None:
    """Upstream kas reads an agent's configuration through the hub's Gitaly-compatible service, at the address and
    with the token ``agent_info`` names: the hub's Service, and a token every hub replica shares."""
    docs = render(SERVER, "--set", "hub.database.url=postgresql+asyncpg://u:p@db:5432/hub,hub.replicas=2")
    hub = container(docs, "hub")
    env = {e["name"]: e["value"] for e in hub["env"] if "value" in e}
    config = load_hub_config(None, environ=env)
    assert config.gitaly.listen == "0.0.0.0:8075"
    assert config.gitaly_address == "tcp://t-tether-hub:8075"
    assert config.gitaly_token_file == Path("/etc/tether/secrets/gitaly_token")
    assert {"name": "secrets", "mountPath": "/etc/tether/secrets", "readOnly": True} in hub["volumeMounts"]
    assert {"name": "gitaly", "containerPort": 8075, "protocol": "TCP"} in hub["ports"]
    service = named(docs, "Service", "t-tether-hub")
    assert {"name": "grpc-gitaly", "port": 8075, "targetPort": "gitaly", "appProtocol": "kubernetes.io/h2c"} in (
        service["spec"]["ports"]
    )
    secret = named(docs, "Secret", "t-tether-secrets")
    assert len(base64.b64decode(secret["data"]["gitaly_token"])) == 64
    off = container(render(SERVER, "--set", "hub.gitaly.enabled=false"), "hub")
    assert not [e for e in off["env"] if e["name"].startswith("TETHER_HUB_GITALY")]


SERVER_COMBINATIONS = [
    [],
    ["--set", "hub.database.url=postgresql+asyncpg://u:p@db/hub,redis.bundled=false,redis.external.address=r:6379"],
    ["--set", "ingress.enabled=true,ingress.kasAgentHost=kas.example.com,ingress.kasProxyHost=k8s.example.com"],
    ["--set", "hub.enabled=false,kas.workspaces.enabled=true,kas.workspaces.pathUrl=https://ws.example.com"],
    ["--set", "kas.tls.secretName=kas-tls,frontProxy.service.type=LoadBalancer,kas.replicas=1"],
    ["--set", "frontProxy.enabled=false,networkPolicy.enabled=false,hub.gitaly.enabled=false"],
]


@pytest.mark.k8s
@pytest.mark.parametrize("values", SERVER_COMBINATIONS, ids=range(len(SERVER_COMBINATIONS)))
def test_server_chart_is_valid_for_the_api_server(values: list[str], kubectl: Kubectl, k8s_namespace: str) -> None:
    _dry_run(kubectl, render(SERVER, *values, namespace=k8s_namespace), k8s_namespace)
