"""Tether installed with its own Helm charts on the development cluster's real node (issue 22 item 4).

Shared by ``tests/node/test_helm_e2e.py`` (the checks) and ``bench/deploy.py`` (the figures), so both measure
the same installation, the way ``docs/deployment.md`` tells a user to do it:

1. the images of ``make images`` (kas, agentk, hub) and a trial Redis image (Debian's ``redis-server``: no
   registry is reachable here) imported into the node's containerd;
2. ``helm install tether`` (two kas with TLS from a private CA, the hub on SQLite on a PVC, bundled Redis);
3. the hub's first administrator token (``tether hub bootstrap`` in the hub pod), then a project, an agent,
   its token and its configuration through the hub's REST API;
4. ``helm install tether-agent`` with that token, kas' in-cluster address and the private CA.

How the host reaches the pods: the host routes the node's pod range through the node's veth, so pod IPs are
reachable; Service ClusterIPs are not (every development cluster uses the same Service range, so a host
route to it would collide with other clusters running side by side). The hub (one pod, never restarted
here) is reached at its pod IP. kas is reached through a NodePort Service on the node's IP, which kube-proxy
in the node's namespace balances over the ready kas pods: the path an external load balancer takes, and the
one that keeps working while kas pods are killed or rolled (a pod IP would not).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

from tests.fixtures.k8s import Kubectl
from tether_devenv import pki
from tether_devenv.cluster import ClusterInfo, write_kubeconfig
from tether_devenv.helm import build_helm
from tether_devenv.images import build_images
from tether_devenv.node import import_archives
from tether_devenv.node_net import NodeNet
from tether_devenv.oci import REDIS_IMAGE, write_redis_image

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "deploy" / "helm"
SERVER_NS, AGENT_NS, WORK_NS = "tether", "tether-agent", "tether-work"
SERVER_RELEASE, AGENT_RELEASE = "tether", "tether-agent"
KAS_TLS_SECRET = "kas-tls"
KAS_NODEPORT_SERVICE = "kas-nodeport"
KAS_K8S_API_PORT = 8154
USERNAME = "root"
#: Bound for one install or upgrade step (`helm --wait`, rollouts): generous, two loaded cores.
STEP_S = 300
#: A request of the load clients may take this long (retries included) before it counts as failed.
REQUEST_DEADLINE_S = 30.0

Progress = Callable[[str], None]


def _quiet(_line: str) -> None:
    return None


class Helm:
    """The cached helm (``tether_devenv.helm``) against one kubeconfig."""

    def __init__(self, kubeconfig: Path, cache: Path) -> None:
        self.binary = build_helm(progress=_quiet)
        self.kubeconfig = kubeconfig
        self.env = {
            "HOME": str(cache),
            "PATH": "/usr/bin:/bin",
            "HELM_CACHE_HOME": str(cache / "cache"),
            "HELM_CONFIG_HOME": str(cache / "config"),
            "HELM_DATA_HOME": str(cache / "data"),
        }

    def run(self, *args: str, timeout: float = STEP_S + 60) -> str:
        """Run ``helm args...``; returns its standard output.

        Raises:
            AssertionError: helm failed (with its output).
        """
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env, check=False)
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}{result.stdout}")
        return result.stdout


def kubectl_json(kubectl: Kubectl, *args: str) -> Any:
    """``kubectl args... -o json`` parsed."""
    return json.loads(kubectl.run(*args, "-o", "json").stdout)


def wait_until(check: Callable[[], Any], limit_s: float, what: str, interval: float = 0.5) -> Any:
    """Call ``check`` until it returns something truthy (exceptions count as not yet); raise after ``limit_s``.

    Raises:
        AssertionError: ``limit_s`` passed (with the last value or error).
    """
    deadline = time.monotonic() + limit_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (AssertionError, OSError, KeyError, ValueError, httpx.HTTPError, subprocess.SubprocessError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {limit_s}s waiting for {what} (last: {last!r})")


def prepare_images(info: ClusterInfo, directory: Path, progress: Progress = _quiet) -> None:
    """Build (or reuse) the kas, agentk and hub images and a Redis image, and import them into every node."""
    built = build_images(progress=progress)
    redis = directory / "redis.oci.tar"
    write_redis_image(redis)
    archives = [image.archive for image in built] + [redis]
    # One `ctr images import` per archive at once: each mostly waits on unpacking its layer.
    with ThreadPoolExecutor(len(archives)) as pool:
        list(pool.map(lambda archive: import_archives(info.real_nodes, [archive]), archives))


@dataclass
class Installation:
    """Both releases installed, an agent registered and connected; helpers to reach kas and the hub.

    Attributes:
        admin: kubectl as cluster admin (direct to the API server).
        helm: helm as cluster admin.
        directory: scratch files (certificates, kubeconfigs).
        node_ip: the real node's IP (the host reaches it through the node's veth).
        kas_proxy_url: kas' Kubernetes API proxy through the NodePort, ``https://<node ip>:<port>/`` (the chart
            keeps upstream's default ``url_path_prefix: /``).
        ca: the private CA of kas' certificate (PEM file).
        hub_url: the hub at its pod IP, ``http://<pod ip>:8080``.
        admin_pat: the hub administrator's personal access token.
        project_id, agent_id: the agent's project and id in the hub.
        agent_token: the agent's token.
        timings: seconds of each step (``helm_install_to_agent_ready_seconds``, ...).
    """

    admin: Kubectl
    helm: Helm
    directory: Path
    node_ip: str
    kas_proxy_url: str = ""
    ca: Path = Path()
    hub_url: str = ""
    admin_pat: str = ""
    project_id: int = 0
    agent_id: int = 0
    agent_token: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def proxy_token(self) -> str:
        """The kubectl token for kas' proxy: ``pat:<agent id>:<personal access token>``."""
        return f"pat:{self.agent_id}:{self.admin_pat}"

    def proxy_kubectl(self, name: str = "through-kas") -> Kubectl:
        """kubectl whose server is kas' Kubernetes API proxy, as the hub user (impersonated by agentk)."""
        path = self.directory / f"{name}.kubeconfig"
        write_kubeconfig(path, self.kas_proxy_url, self.proxy_token, self.ca, name=name)
        return Kubectl(self.admin.binary, path)

    def ssl_context(self) -> ssl.SSLContext:
        """TLS client context trusting kas' private CA."""
        return ssl.create_default_context(cafile=str(self.ca))

    def hub(self) -> httpx.Client:
        """The hub's REST API as the administrator."""
        return httpx.Client(base_url=f"{self.hub_url}/api/v4", headers={"PRIVATE-TOKEN": self.admin_pat}, timeout=60)

    def pods(self, namespace: str, component: str) -> list[dict[str, Any]]:
        """Pods of one component (``kas``, ``hub``, ``redis``, ``agentk``) that are not being deleted."""
        selector = (
            "app.kubernetes.io/name=tether-agent" if component == "agentk" else f"app.kubernetes.io/name={component}"
        )
        items = kubectl_json(self.admin, "get", "pods", "-n", namespace, "-l", selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self, namespace: str, component: str) -> list[str]:
        """Names of the component's Ready pods."""
        return [
            p["metadata"]["name"]
            for p in self.pods(namespace, component)
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]

    def lease(self) -> dict[str, Any]:
        """agentk's leader-election Lease ``agent-<id>-lock`` (raises AssertionError while it is missing)."""
        return dict(kubectl_json(self.admin, "get", "lease", f"agent-{self.agent_id}-lock", "-n", AGENT_NS))

    def leader(self) -> str:
        """The Lease's current holder (empty while released)."""
        return str(self.lease().get("spec", {}).get("holderIdentity") or "")


def _kas_certificate(inst: Installation) -> tuple[Path, Path]:
    """A private CA and kas' serving certificate for its in-cluster names and the node IP."""
    authority = pki.generate(inst.directory / "kas-pki")
    service = f"{SERVER_RELEASE}-kas"
    names = tuple(
        f"{name}{suffix}"
        for name in (service, f"{SERVER_RELEASE}-front-proxy")
        for suffix in ("", f".{SERVER_NS}", f".{SERVER_NS}.svc", f".{SERVER_NS}.svc.cluster.local")
    )
    inst.ca = authority.ca_cert
    return pki.issue(
        authority.ca_cert,
        authority.ca_key,
        inst.directory / "kas-pki",
        "kas",
        service,
        (),
        (inst.node_ip,),
        names,
        True,
    )


def install_server(inst: Installation) -> None:
    """``helm install tether`` with TLS from a private CA and the local Redis image; expose kas' proxy."""
    cert, key = _kas_certificate(inst)
    inst.admin.run("create", "namespace", SERVER_NS)
    inst.admin.run("create", "secret", "tls", KAS_TLS_SECRET, "-n", SERVER_NS, f"--cert={cert}", f"--key={key}")
    repository, tag = REDIS_IMAGE.rsplit(":", 1)
    began = time.monotonic()
    inst.helm.run(
        "install", SERVER_RELEASE, str(CHARTS / "tether"), "-n", SERVER_NS, "--wait", f"--timeout={STEP_S}s",
        f"--set=kas.tls.secretName={KAS_TLS_SECRET}",
        f"--set=redis.image.repository={repository}", f"--set=redis.image.tag={tag}",
    )  # fmt: skip
    inst.timings["helm_install_server_seconds"] = time.monotonic() - began
    # A NodePort for kas' Kubernetes API listener: the test's own Service, as a user's load balancer would be.
    nodeport = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": KAS_NODEPORT_SERVICE, "namespace": SERVER_NS},
        "spec": {
            "type": "NodePort",
            "selector": {"app.kubernetes.io/instance": SERVER_RELEASE, "app.kubernetes.io/name": "kas"},
            "ports": [{"name": "k8s-proxy", "port": KAS_K8S_API_PORT, "targetPort": "kubernetes-api"}],
        },
    }
    inst.admin.run("apply", "-f", "-", input_text=yaml.safe_dump(nodeport))
    port = kubectl_json(inst.admin, "get", "service", KAS_NODEPORT_SERVICE, "-n", SERVER_NS)["spec"]["ports"][0]
    inst.kas_proxy_url = f"https://{inst.node_ip}:{port['nodePort']}/"


def _bootstrap(inst: Installation) -> str:
    """``tether hub bootstrap`` in the hub pod: the administrator's token, printed alone.

    Bootstrapping again only makes another token, so a run killed with its container is retried (seen once
    on a machine at load 18: exit 137; the hub pod's state is in the error if it happens again).
    """
    argv = ["exec", "-n", SERVER_NS, f"deploy/{SERVER_RELEASE}-hub", "--", "tether", "hub", "bootstrap"]
    failures = []
    for _attempt in range(3):
        result = inst.admin.run(*argv, check=False)
        if result.returncode == 0:
            return result.stdout.strip()
        statuses = [pod["status"].get("containerStatuses") for pod in inst.pods(SERVER_NS, "hub")]
        failures.append(f"exit {result.returncode}: {result.stderr.strip()[-300:]}; hub pod: {statuses}")
        print(f"tether hub bootstrap failed, retrying: {failures[-1]}")
        wait_until(lambda: inst.ready_pods(SERVER_NS, "hub"), STEP_S, "a Ready hub pod")
    raise AssertionError(f"tether hub bootstrap failed 3 times: {failures}")


def register_agent(inst: Installation) -> None:
    """The administrator's token from ``tether hub bootstrap``; a project, an agent, its token and its
    configuration (``user_access`` as the user for the project, a ``remote_development`` section so the
    replicas elect a leader) through the hub's REST API."""
    inst.admin_pat = _bootstrap(inst)
    hub_pod = inst.pods(SERVER_NS, "hub")[0]
    inst.hub_url = f"http://{hub_pod['status']['podIP']}:8080"
    with inst.hub() as hub:
        project = hub.post("/projects", json={"name": "clusters"}).raise_for_status().json()
        inst.project_id = int(project["id"])
        agent = hub.post(f"/projects/{inst.project_id}/cluster_agents", json={"name": "e2e"}).raise_for_status().json()
        inst.agent_id = int(agent["id"])
        tokens = f"/projects/{inst.project_id}/cluster_agents/{inst.agent_id}/tokens"
        inst.agent_token = hub.post(tokens, json={"name": "helm"}).raise_for_status().json()["token"]
        configuration = {
            "user_access": {"access_as": {"user": {}}, "projects": [{"id": project["path_with_namespace"]}]},
            "remote_development": {"enabled": True, "dns_zone": "workspaces.e2e.test"},
        }
        hub.put(
            f"/projects/{inst.project_id}/cluster_agents/{inst.agent_id}/configuration",
            content=yaml.safe_dump(configuration).encode(),
        ).raise_for_status()


def install_agent(inst: Installation) -> None:
    """``helm install tether-agent`` with the token and the private CA; returns once both agentk pods are
    Ready (agentk's readiness: a configuration and a tunnel to kas) and a leader holds the Lease.

    ``timings["helm_install_to_agent_ready_seconds"]``: from the start of ``helm install`` until both pods
    are Ready.
    """
    # agentk dials the chart's front proxy when the chart has one (it then terminates TLS), else kas itself.
    services = inst.admin.run("get", "services", "-n", SERVER_NS, "-o", "name").stdout.split()
    front = f"service/{SERVER_RELEASE}-front-proxy" in services
    kas = f"grpcs://{SERVER_RELEASE}-{'front-proxy' if front else 'kas'}.{SERVER_NS}.svc.cluster.local:8150"
    began = time.monotonic()
    inst.helm.run(
        "install", AGENT_RELEASE, str(CHARTS / "tether-agent"), "-n", AGENT_NS, "--create-namespace",
        f"--set=config.kasAddress={kas}", f"--set=config.token={inst.agent_token}",
        f"--set-file=config.kasCaCert={inst.ca}",
    )  # fmt: skip
    wait_until(lambda: len(inst.ready_pods(AGENT_NS, "agentk")) == 2, STEP_S, "two Ready agentk pods", 0.2)
    inst.timings["helm_install_to_agent_ready_seconds"] = time.monotonic() - began
    wait_until(inst.leader, STEP_S, "an agentk leader in the Lease")


def grant_namespace(inst: Installation, namespace: str) -> None:
    """Create ``namespace`` and let the hub user (impersonated by agentk) edit it: the user's own RBAC."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "gitlab-root-edit", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"gitlab:user:{USERNAME}"}],
    }
    inst.admin.run("create", "namespace", namespace)
    inst.admin.run("apply", "-f", "-", input_text=yaml.safe_dump(binding))


def install(info: ClusterInfo, admin: Kubectl, directory: Path, progress: Progress = _quiet) -> Installation:
    """Images, both releases, an agent: everything :class:`Installation` describes, on the real node."""
    directory.mkdir(parents=True, exist_ok=True)
    node_ip = NodeNet.from_json(info.real_nodes["nodes"][0]["net"]).node_address
    inst = Installation(admin, Helm(admin.kubeconfig, directory / "helm"), directory, node_ip)
    steps: list[tuple[str, Callable[[], None]]] = [
        ("images built and imported", lambda: prepare_images(info, directory, progress)),
        ("helm install tether", lambda: install_server(inst)),
        ("agent registered in the hub", lambda: register_agent(inst)),
        ("helm install tether-agent, agentk Ready", lambda: install_agent(inst)),
        ("work namespace for the hub user", lambda: grant_namespace(inst, WORK_NS)),
    ]
    for what, step in steps:
        began = time.monotonic()
        step()
        progress(f"{what}: {time.monotonic() - began:.1f}s")
    return inst


@dataclass
class LoadReport:
    """What the load clients saw.

    Attributes:
        requests: requests that completed (successfully or past their deadline).
        failed: requests without a successful answer within :data:`REQUEST_DEADLINE_S`.
        retried: failed attempts that a retry within the deadline recovered (connection reset, 5xx...).
        slowest_s: the longest successful request, retries included, seconds.
        errors: a sample of the failed requests' last errors.
    """

    requests: int = 0
    failed: int = 0
    retried: int = 0
    slowest_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class Load:
    """``clients`` concurrent clients listing pods through kas' proxy (kas -> agentk -> the API server).

    Each request retries a failed attempt (connection error, HTTP 5xx or 429) until :data:`REQUEST_DEADLINE_S`
    has passed since it began, as a client with a deadline does; only then it counts as failed.
    """

    def __init__(self, inst: Installation, clients: int = 20) -> None:
        self.inst = inst
        self.clients = clients
        self.report = LoadReport()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Load:
        connector = aiohttp.TCPConnector(ssl=self.inst.ssl_context(), limit=self.clients)
        self._session = aiohttp.ClientSession(connector=connector)
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._session is not None:
            await self._session.close()

    async def _attempt(self, url: str) -> str | None:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {self.inst.proxy_token}"}
        try:
            timeout = aiohttp.ClientTimeout(total=REQUEST_DEADLINE_S)
            async with self._session.get(url, headers=headers, timeout=timeout) as response:
                body = await response.read()
                if response.status == 200:
                    return None
                return f"HTTP {response.status}: {body[:200]!r}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"

    async def _client(self) -> None:
        url = f"{self.inst.kas_proxy_url}api/v1/namespaces/{WORK_NS}/pods?limit=5"
        while not self._stop.is_set():
            began = time.monotonic()
            while True:
                error = await self._attempt(url)
                elapsed = time.monotonic() - began
                if error is None:
                    self.report.slowest_s = max(self.report.slowest_s, elapsed)
                    break
                if elapsed >= REQUEST_DEADLINE_S:
                    self.report.failed += 1
                    if len(self.report.errors) < 10:
                        self.report.errors.append(error)
                    break
                self.report.retried += 1
                await asyncio.sleep(0.2)
            self.report.requests += 1
            await asyncio.sleep(0.05)


def roll_out(inst: Installation, generation: str) -> None:
    """``helm upgrade`` both releases at once with a changed pod annotation: a rolling update of kas and agentk.

    Waits (``--wait``) until every new pod is Ready; ``--reuse-values`` keeps the install's settings.
    """

    def upgrade(release: str, namespace: str, chart: str, key: str) -> str:
        return inst.helm.run(
            "upgrade", release, str(CHARTS / chart), "-n", namespace, "--reuse-values", "--wait",
            f"--timeout={STEP_S}s", f"--set-string={key}={generation}",
        )  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        server = pool.submit(upgrade, SERVER_RELEASE, SERVER_NS, "tether", "kas.podAnnotations.tether-e2e/generation")
        agent = pool.submit(upgrade, AGENT_RELEASE, AGENT_NS, "tether-agent", "podAnnotations.tether-e2e/generation")
        server.result(), agent.result()


def fail_over(inst: Installation) -> tuple[str, str, float]:
    """Delete the leader agentk pod; return (old leader, new leader, seconds until the new one held the Lease)."""
    old = inst.leader()
    began = time.monotonic()
    inst.admin.run("delete", "pod", old, "-n", AGENT_NS, "--wait=false")

    def new_leader() -> str:
        holder = inst.leader()
        return holder if holder and holder != old else ""

    new = str(wait_until(new_leader, STEP_S, "another agentk to take the Lease", 0.1))
    return old, new, time.monotonic() - began


def uninstall(inst: Installation) -> None:
    """``helm uninstall`` both releases (at once), each waiting until helm's objects are deleted."""
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(inst.helm.run, "uninstall", release, "-n", namespace, "--wait", f"--timeout={STEP_S}s")
            for release, namespace in ((AGENT_RELEASE, AGENT_NS), (SERVER_RELEASE, SERVER_NS))
        ]
        for run in runs:
            run.result()


def leftovers(inst: Installation, namespace: str) -> list[str]:
    """Every object in ``namespace`` except what Kubernetes itself keeps there (the ``default``
    ServiceAccount, the ``kube-root-ca.crt`` ConfigMap, events), as ``kind/name``."""
    kinds = inst.admin.run("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
    items = kubectl_json(inst.admin, "get", ",".join(kinds), "-n", namespace, "--ignore-not-found")["items"]
    found = [f"{item['kind']}/{item['metadata']['name']}" for item in items]
    return sorted(set(found) - {"ServiceAccount/default", "ConfigMap/kube-root-ca.crt"})


def cluster_leftovers(inst: Installation) -> list[str]:
    """Cluster-scoped objects of either release (ClusterRoles, ClusterRoleBindings...), as ``kind/name``."""
    selector = f"app.kubernetes.io/instance in ({SERVER_RELEASE},{AGENT_RELEASE})"
    items = kubectl_json(inst.admin, "get", "clusterroles,clusterrolebindings", "-l", selector)["items"]
    names = [f"{i['kind']}/{i['metadata']['name']}" for i in items]
    for kind in ("clusterroles", "clusterrolebindings"):
        items = kubectl_json(inst.admin, "get", kind)["items"]
        names += [f"{i['kind']}/{i['metadata']['name']}" for i in items if "tether" in i["metadata"]["name"]]
    return sorted(set(names))


def remove_everything(admin: Kubectl, helm: Helm | None = None) -> None:
    """Clean-up after a run (passed or not): both releases, the kept objects, the namespaces.

    Waits (bounded) until the namespaces are gone, so that their pods' containers are not still being torn
    down while the next test runs (a test scanning the cluster directory then saw a snapshot vanish).
    """
    if helm is not None:
        for release, namespace in ((AGENT_RELEASE, AGENT_NS), (SERVER_RELEASE, SERVER_NS)):
            subprocess.run(
                [str(helm.binary), f"--kubeconfig={helm.kubeconfig}", "uninstall", release, "-n", namespace],
                capture_output=True, env=helm.env, timeout=STEP_S, check=False,
            )  # fmt: skip
    namespaces = [f"namespace/{namespace}" for namespace in (WORK_NS, AGENT_NS, SERVER_NS)]
    admin.run("delete", *namespaces, "--ignore-not-found", "--wait=false", check=False)
    admin.run("wait", "--for=delete", *namespaces, "--timeout=110s", check=False)  # within kubectl.run's 120 s
