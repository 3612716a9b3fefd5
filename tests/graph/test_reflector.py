"""The reflector against a scripted fake API server: pagination, resourceVersion, bookmarks, 410 relists,
reconnects and errors (stack.md §6), plus discovery parsing of both discovery formats."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tether.kube.client import KubeClient, KubeError
from tether.kube.discovery import discover
from tether.kube.kubeconfig import KubeCredentials
from tether.kube.reflector import Reflector
from tether.tool.backoff import Backoff


@dataclass
class FakeApi:
    """A collection ``/api/v1/namespaces/ns/configmaps`` with scripted watch behaviour."""

    objects: dict[str, int] = field(default_factory=dict)  # name -> resourceVersion
    rv: int = 10
    watch_script: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    list_requests: list[dict[str, str]] = field(default_factory=list)
    watch_requests: list[dict[str, str]] = field(default_factory=list)
    fail_next_lists: int = 0

    def obj(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(self.objects[name])}}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if params.get("watch") == "1":
            self.watch_requests.append(params)
            step = await self.watch_script.get()
            if step == "http410":
                return web.json_response(
                    {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}, status=410
                )
            response = web.StreamResponse()
            await response.prepare(request)
            for event in step:
                if event == "drop":
                    request.transport.close()  # type: ignore[union-attr]
                    return response
                await response.write(json.dumps(event).encode() + b"\n")
            return response
        self.list_requests.append(params)
        if self.fail_next_lists:
            self.fail_next_lists -= 1
            return web.json_response(
                {"kind": "Status", "code": 500, "reason": "InternalError", "message": "boom"}, status=500
            )
        names = sorted(self.objects)
        start = int(params.get("continue", "0"))
        limit = int(params.get("limit", "500"))
        page = names[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if start + limit < len(names):
            meta["continue"] = str(start + limit)
        return web.json_response({"kind": "ConfigMapList", "metadata": meta, "items": [self.obj(n) for n in page]})


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.errors: list[KubeError] = []
        self.changed = asyncio.Event()

    def on_upsert(self, obj: dict[str, Any]) -> None:
        self.events.append(("upsert", obj["metadata"]["name"] + "@" + obj["metadata"]["resourceVersion"]))
        self.changed.set()

    def on_delete(self, namespace: str, name: str) -> None:
        self.events.append(("delete", name))
        self.changed.set()

    def on_synced(self) -> None:
        self.events.append(("synced", ""))
        self.changed.set()

    def on_error(self, error: KubeError) -> None:
        self.errors.append(error)
        self.changed.set()

    async def until(self, predicate: Any) -> None:
        async with asyncio.timeout(30):
            while not predicate():
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.05)  # also re-checks server-side state


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, KubeClient]]:
    api = FakeApi()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/configmaps", api.handle)
    server = TestServer(app)
    await server.start_server()
    client = KubeClient(KubeCredentials(server=str(server.make_url("")).rstrip("/")))
    try:
        yield api, client
    finally:
        await client.close()
        await server.close()


async def test_list_watch_bookmarks_and_relists(fake: tuple[FakeApi, KubeClient]) -> None:
    api, client = fake
    api.objects = {"a": 1, "b": 2, "c": 3}
    recorder = Recorder()
    reflector = Reflector(
        client,
        "/api/v1/namespaces/ns/configmaps",
        recorder,
        label_selector="app=x",
        field_selector="metadata.name!=z",
        page_size=2,
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        streaming_list=False,
    )
    reflector.start()
    try:
        await recorder.until(lambda: ("synced", "") in recorder.events)
        assert recorder.events == [("upsert", "a@1"), ("upsert", "b@2"), ("upsert", "c@3"), ("synced", "")]
        assert len(api.list_requests) == 2  # paginated
        assert (
            api.list_requests[0]["labelSelector"] == "app=x"
            and api.list_requests[0]["fieldSelector"] == "metadata.name!=z"
        )
        recorder.events.clear()

        # watch: events, a bookmark, then the server ends the stream
        await api.watch_script.put(
            [
                {"type": "ADDED", "object": {"metadata": {"name": "d", "namespace": "ns", "resourceVersion": "11"}}},
                {"type": "MODIFIED", "object": {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "12"}}},
                {"type": "DELETED", "object": {"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "13"}}},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
            ]
        )
        await recorder.until(lambda: len(recorder.events) == 3)
        assert recorder.events == [("upsert", "d@11"), ("upsert", "a@12"), ("delete", "b")]
        first_watch = api.watch_requests[0]
        assert first_watch["resourceVersion"] == "10" and first_watch["allowWatchBookmarks"] == "true"
        assert first_watch["labelSelector"] == "app=x" and int(first_watch["timeoutSeconds"]) >= 300
        recorder.events.clear()

        # the re-watch resumes from the bookmark; a connection drop resumes from the last event
        await api.watch_script.put(
            [
                {"type": "ADDED", "object": {"metadata": {"name": "e", "namespace": "ns", "resourceVersion": "21"}}},
                "drop",
            ]
        )
        await recorder.until(lambda: len(api.watch_requests) >= 2 and recorder.events)
        assert api.watch_requests[1]["resourceVersion"] == "20"
        # an ERROR 410 event: relist; the diff against what was known gives upserts and deletes
        api.objects = {"a": 12, "c": 30, "f": 31}  # b, d, e gone; c changed; f new; a unchanged
        api.rv = 40
        await api.watch_script.put([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}])
        await recorder.until(lambda: recorder.events.count(("synced", "")) == 1)
        assert api.watch_requests[2]["resourceVersion"] == "21"
        events = recorder.events
        assert events[0] == ("upsert", "e@21")
        assert set(events[1:-1]) == {("upsert", "c@30"), ("upsert", "f@31"), ("delete", "d"), ("delete", "e")}
        assert events[-1] == ("synced", "")
        recorder.events.clear()

        # 410 at the start of a watch: relist; then a failing list is retried after on_error
        api.fail_next_lists = 1
        await api.watch_script.put("http410")
        await recorder.until(lambda: ("synced", "") in recorder.events)
        assert any("InternalError" in str(e) for e in recorder.errors)  # the dropped watch was an error too
        assert recorder.events == [("synced", "")]  # nothing changed
        assert api.watch_requests[-1]["resourceVersion"] == "21" or api.watch_requests[-1]["resourceVersion"] == "40"
        await recorder.until(lambda: api.watch_requests[-1]["resourceVersion"] == "40")
        assert sorted(reflector.known_keys) == [("ns", "a"), ("ns", "c"), ("ns", "f")]

        # resync re-delivers every object even when nothing changed
        recorder.events.clear()
        reflector.resync()
        await recorder.until(lambda: ("synced", "") in recorder.events)
        assert recorder.events == [("upsert", "a@12"), ("upsert", "c@30"), ("upsert", "f@31"), ("synced", "")]
    finally:
        await reflector.stop()


async def test_streaming_list(fake: tuple[FakeApi, KubeClient]) -> None:
    api, client = fake
    api.objects = {"a": 1}
    recorder = Recorder()
    reflector = Reflector(
        client, "/api/v1/namespaces/ns/configmaps", recorder, backoff=Backoff(initial_s=0.01, max_s=0.05)
    )

    def added(name: str, rv: int) -> dict[str, Any]:
        return {"type": "ADDED", "object": {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}}

    end = {
        "type": "BOOKMARK",
        "object": {"metadata": {"resourceVersion": "50", "annotations": {"k8s.io/initial-events-end": "true"}}},
    }
    reflector.start()
    try:
        # initial events, the end marker, then live events on the same stream
        await api.watch_script.put([added("a", 1), added("b", 2), end, added("c", 51)])
        await recorder.until(lambda: ("upsert", "c@51") in recorder.events)
        assert recorder.events == [("upsert", "a@1"), ("upsert", "b@2"), ("synced", ""), ("upsert", "c@51")]
        first = api.watch_requests[0]
        assert first["sendInitialEvents"] == "true" and first["resourceVersionMatch"] == "NotOlderThan"
        assert "resourceVersion" not in first and not api.list_requests
        # the stream ends: a plain watch resumes from the last resourceVersion
        await recorder.until(lambda: len(api.watch_requests) >= 2)
        assert api.watch_requests[1]["resourceVersion"] == "51" and "sendInitialEvents" not in api.watch_requests[1]
        recorder.events.clear()
        # 410: a new streaming list; objects missing from it are deleted
        await api.watch_script.put([{"type": "ERROR", "object": {"kind": "Status", "code": 410}}])
        await api.watch_script.put([added("a", 1), end])
        await recorder.until(lambda: ("synced", "") in recorder.events)
        assert set(recorder.events) == {("delete", "b"), ("delete", "c"), ("synced", "")}
        # a server that does not know sendInitialEvents: a bookmark without the end marker -> classic LIST
        recorder.events.clear()
        await api.watch_script.put([{"type": "ERROR", "object": {"kind": "Status", "code": 410}}])
        await api.watch_script.put(
            [added("a", 1), {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "60"}}}]
        )
        await recorder.until(lambda: ("synced", "") in recorder.events)
        assert api.list_requests
    finally:
        await reflector.stop()


async def test_discovery_aggregated_and_legacy() -> None:
    aggregated_core = {
        "kind": "APIGroupDiscoveryList",
        "items": [
            {
                "metadata": {"name": ""},
                "versions": [
                    {
                        "version": "v1",
                        "resources": [
                            {
                                "resource": "pods",
                                "responseKind": {"kind": "Pod"},
                                "scope": "Namespaced",
                                "verbs": ["list", "watch"],
                                "subresources": [{"subresource": "log"}],
                            },
                            {
                                "resource": "nodes",
                                "responseKind": {"kind": "Node"},
                                "scope": "Cluster",
                                "verbs": ["list"],
                            },
                        ],
                    }
                ],
            }
        ],
    }
    aggregated_groups = {
        "kind": "APIGroupDiscoveryList",
        "items": [
            {
                "metadata": {"name": "apps"},
                "versions": [
                    {
                        "version": "v1",
                        "resources": [
                            {
                                "resource": "deployments",
                                "responseKind": {"kind": "Deployment"},
                                "scope": "Namespaced",
                                "verbs": ["watch", "list"],
                            }
                        ],
                    }
                ],
            },
            {
                "metadata": {"name": "stale.example.com"},
                "versions": [{"version": "v1", "freshness": "Stale", "resources": []}],
            },
        ],
    }
    legacy = {
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/apis": {
            "kind": "APIGroupList",
            "groups": [
                {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]},
                {"name": "broken.io", "versions": [{"groupVersion": "broken.io/v1", "version": "v1"}]},
            ],
        },
        "/api/v1": {
            "kind": "APIResourceList",
            "resources": [
                {"name": "pods", "namespaced": True, "kind": "Pod", "verbs": ["list", "watch"]},
                {"name": "pods/log", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
            ],
        },
        "/apis/apps/v1": {
            "kind": "APIResourceList",
            "resources": [
                {"name": "deployments", "namespaced": True, "kind": "Deployment", "verbs": ["list", "watch"]}
            ],
        },
    }

    for mode in ("aggregated", "legacy"):

        async def handle(request: web.Request, mode: str = mode) -> web.Response:
            accept = request.headers.get("Accept", "")
            if mode == "aggregated" and "apidiscovery.k8s.io" in accept:
                return web.json_response(aggregated_core if request.path == "/api" else aggregated_groups)
            if request.path in legacy:
                return web.json_response(legacy[request.path])
            return web.json_response(
                {"kind": "Status", "code": 503, "reason": "ServiceUnavailable", "message": "down"}, status=503
            )

        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        server = TestServer(app)
        await server.start_server()
        client = KubeClient(KubeCredentials(server=str(server.make_url("")).rstrip("/")))
        try:
            result = await discover(client)
        finally:
            await client.close()
            await server.close()
        names = {(r.group, r.version, r.resource, r.kind, r.namespaced) for r in result.resources}
        assert ("", "v1", "pods", "Pod", True) in names and ("apps", "v1", "deployments", "Deployment", True) in names
        assert not any("/" in r.resource for r in result.resources)
        assert len(result.failures) == 1
        assert ("stale.example.com" if mode == "aggregated" else "broken.io") in result.failures[0]
