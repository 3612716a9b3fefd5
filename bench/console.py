"""Benchmark the console's live graph in a real browser (issue 14 acceptance figures).

Usage: ``uv run python bench/console.py [--changes N]``

* A private cluster (``tether_devenv``, 4 kwok nodes) with the 5,000-object namespace of ``bench/graph.py``
  (200 Deployments x 15 replicas -> 200 ReplicaSets and 3,000 Pods, plus ConfigMaps, Secrets, Services).
* The real path a user takes: the hub (SQLite), a real kas and ``tether agentk``; Debian's Chromium (headless,
  Playwright) signs in to the console and opens the graph page on that namespace, for the resources
  ``bench/graph.py`` counts. The page opens the Graph API WebSocket through the hub's relay to kas, which
  routes it to agentk; Cytoscape.js draws it.

Figures (``bench/results/console.json``):

* ``graph_5000_first_draw_seconds``: from the start of the graph page's navigation (``performance.timeOrigin``)
  to the painted frame (Cytoscape's ``render`` event) that holds the last vertex of the initial graph: every
  object of the namespace in the resources ``bench/graph.py`` counts (Pods, ConfigMaps, Secrets, Services,
  ServiceAccounts, Deployments, ReplicaSets), asked with the page's ``query`` parameter.
* ``graph_change_visible_ms``: median, over ``--changes`` sequential ConfigMap creations through the API server,
  from just before the request to the painted frame holding the new vertex (wall clocks of one machine);
  ``graph_change_visible_max_ms`` is the slowest.
* ``graph_objects``: vertices in the initial graph.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from graph import QUERY, Api, populate

from tests.fixtures.hub import HubLauncher
from tests.fixtures.system import System, write_private_secret
from tether_devenv import pki
from tether_devenv.cluster import LocalCluster

RESULTS = ROOT / "bench" / "results" / "console.json"
NAMESPACE = "bench-5k"


def setup_agent(hub: Any) -> tuple[int, str, str]:
    """User ``alice`` (api token), project ``alice/bench`` with agent ``bench`` allowed for the project's users."""
    _uid, token = hub.user("alice", ("api",))
    api = hub.api(token)
    project = api.post("/projects", json={"name": "bench"}).json()
    agents = f"/projects/{project['id']}/cluster_agents"
    agent = api.post(agents, json={"name": "bench"}).json()
    agent_token = api.post(f"{agents}/{agent['id']}/tokens", json={"name": "agentk"}).json()["token"]
    api.put(f"{agents}/{agent['id']}/configuration", content=b"user_access:\n  access_as:\n    agent: {}\n")
    return int(agent["id"]), agent_token, token


def ready(agentk: Any) -> bool:
    try:
        return bool(agentk.readiness()[0] == 200)
    except OSError:  # its observability listener is not up yet
        return False


def wait(check: Any, what: str, limit_s: float) -> Any:
    deadline = time.monotonic() + limit_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is missing: run scripts/bootstrap.sh")
    with tempfile.TemporaryDirectory(prefix="tether-console-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", nodes=4)
        info = cluster.start()
        launcher = HubLauncher(Path(tmp), f"sqlite+aiosqlite:///{tmp}/hub.db")
        hub = launcher.prepare()
        tls = pki.generate(Path(tmp) / "proxy-tls")
        (Path(tmp) / "system").mkdir()
        system = System(
            Path(tmp) / "system", hub, write_private_secret(Path(tmp) / "private"), info.kubeconfig, None, tls
        )  # type: ignore[arg-type]
        try:

            async def fill() -> int:
                async with Api(info.server, info.token, info.ca_file) as api:
                    return await populate(api, NAMESPACE, 5000)

            print("populating 5,000 objects", flush=True)
            populated = asyncio.run(fill())
            kas = system.kas(use_redis=False)
            launcher.start(
                hub,
                {
                    "kas.api_address": kas.api_target,
                    "kas.k8s_proxy_url": kas.k8s_proxy_url,
                    "kas.k8s_proxy_ca_certificate_file": str(tls.ca_cert),
                },
            )
            agent_id, agent_token, user_token = setup_agent(hub)
            agentk = system.agentk(agent_token, kas)
            wait(lambda: ready(agentk), "agentk", 60)
            api = httpx.Client(
                base_url=info.server, headers={"Authorization": f"Bearer {info.token}"}, verify=str(info.ca_file)
            )
            # The same resources bench/graph.py counts (the page's "query" parameter sets its own expression).
            graph_url = f"{hub.url}/projects/1/agents/{agent_id}/graph?" + urlencode(
                {"query": QUERY, "namespace": NAMESPACE}
            )
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
                page.on("pageerror", lambda error: print(f"page error: {error}", flush=True))
                page.on("console", lambda message: print(f"page console: {message.text}", flush=True))
                page.goto(hub.url + "/")
                page.get_by_label("Username").fill("alice")
                page.get_by_label("Personal access token").fill(user_token)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url("**/projects")
                # Warm-up: agentk's tunnel is up and the browser has the scripts cached, as for a user who
                # navigates to the graph from the agent page.
                page.goto(graph_url.replace(NAMESPACE, "default"))
                wait(lambda: page.evaluate("window.tetherGraph.count()") > 0, "the warm-up graph", 120)
                time.sleep(1)

                page.goto(graph_url)
                wait(lambda: page.evaluate("window.tetherGraph.count()") >= populated, "the whole graph", 180)
                time.sleep(1)  # the frame holding the last vertices is painted after they arrive
                last_count = page.evaluate("window.tetherGraph.count()")
                first_draw_s = page.evaluate("window.tetherGraph.lastDrawMs()") / 1000
                print(f"first full drawing: {last_count} objects in {first_draw_s:.2f} s", flush=True)
                print(
                    f"page timings (ms since navigation): {page.evaluate('window.tetherGraph.timings()')}", flush=True
                )
                page.screenshot(
                    path=str(Path(os.environ.get("TETHER_SCREENSHOTS", ROOT / "build")) / "bench-graph-5000.png")
                )

                latencies = []
                for i in range(args.changes):
                    name = f"change-{i}"
                    vertex = f"/v1/configmaps/{NAMESPACE}/{name}"
                    started_ms = time.time() * 1000
                    answer = api.post(f"/api/v1/namespaces/{NAMESPACE}/configmaps", json={"metadata": {"name": name}})
                    answer.raise_for_status()
                    try:
                        drawn = wait(
                            lambda v=vertex: page.evaluate("(v) => window.tetherGraph.drawnAt(v)", v), name, 30
                        )
                    except RuntimeError:
                        status = page.locator("#graph-status").inner_text()
                        banner = page.locator("#graph-banner").inner_text()
                        known = page.evaluate(
                            "(v) => window.tetherGraph.ids('configmaps').filter((i) => i.includes('change'))", vertex
                        )
                        raise RuntimeError(
                            f"{name} not drawn; status {status!r}, banner {banner!r}, known {known}"
                        ) from None
                    latencies.append(drawn - started_ms)
                    time.sleep(0.3)
                browser.close()
            median = statistics.median(latencies)
            print(f"change visible: median {median:.0f} ms, max {max(latencies):.0f} ms", flush=True)
            return [
                {"metric": "graph_objects", "value": last_count, "unit": "objects"},
                {"metric": "graph_5000_first_draw_seconds", "value": round(first_draw_s, 2), "unit": "s"},
                {"metric": "graph_change_visible_ms", "value": round(median), "unit": "ms"},
                {"metric": "graph_change_visible_max_ms", "value": round(max(latencies)), "unit": "ms"},
                {"metric": "populated_objects", "value": populated, "unit": "objects"},
            ]
        finally:
            system.stop_all()
            launcher.stop_all()
            cluster.stop()


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=20, help="ConfigMaps created one after another")
    results = run(parser.parse_args())
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
