"""A reflector: list + watch of one collection, kept in step with the API server (stack.md §6).

Behaviour (as client-go's reflector):

1. Get the current state with the label and field selectors: by default as a streaming list (a watch
   with ``sendInitialEvents=true``, served from the API server's watch cache one object at a time and ended by
   a bookmark annotated ``k8s.io/initial-events-end``), or, when the server refuses that (400/422, servers
   without the WatchList feature), as a LIST page by page (``limit`` / ``continue``). Every object whose
   ``resourceVersion`` changed since the last sync is delivered; objects that disappeared are delivered as
   deletions. Then :meth:`ReflectorHandler.on_synced` is called.
2. WATCH from the list's ``resourceVersion`` with ``allowWatchBookmarks=true`` and a random server-side
   ``timeoutSeconds``; ADDED/MODIFIED/DELETED events are delivered, BOOKMARK events only advance the
   resourceVersion. When the server ends the watch, a new one starts from the last resourceVersion.
3. ``410 Gone`` / ``Expired`` (at the start of a watch, as an ERROR event, or for a stale ``continue``
   token) -> relist from scratch. Other failures -> :meth:`ReflectorHandler.on_error`, jittered
   exponential backoff, then a new watch from the last resourceVersion (or a new list if none succeeded).

Memory: the reflector keeps only ``namespace/name -> resourceVersion`` per object, never the objects
(namespace names interned: one copy however many objects a namespace holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from sys import intern
from typing import Any, Protocol

import structlog

from tether.kube.client import KubeApiError, KubeClient, KubeConnectionError, KubeError
from tether.tool.backoff import Backoff

__all__ = ["Reflector", "ReflectorHandler"]

_log = structlog.get_logger(__name__)

#: Server-side watch timeout range in seconds (client-go uses 5-10 minutes).
WATCH_TIMEOUT_RANGE_S = (300, 600)


class ReflectorHandler(Protocol):
    """Receives the reflector's events, synchronously, on the event loop."""

    def on_upsert(self, obj: dict[str, Any]) -> None:
        """An object was added or changed (also for every changed object of a relist)."""

    def on_delete(self, namespace: str, name: str) -> None:
        """An object is gone (deleted, or absent from a relist)."""

    def on_synced(self) -> None:
        """A full list has been delivered (after the first list and after every relist)."""

    def on_error(self, error: KubeError) -> None:
        """A list or watch attempt failed; the reflector retries after a backoff."""


class _Gone(Exception):
    """The resourceVersion is too old: relist."""


class Reflector:
    """List + watch of one collection path.

    Args:
        client: API client.
        path: collection path, e.g. ``/apis/apps/v1/namespaces/x/deployments``.
        handler: receives events.
        label_selector: sent as ``labelSelector`` ("" for none).
        field_selector: sent as ``fieldSelector`` ("" for none).
        page_size: objects per list request.
        backoff: retry delays; default 0.8 s doubling up to 30 s.
        streaming_list: try the streaming list (``sendInitialEvents``) before paginated LISTs.
        pace: awaited after every delivered event (and page) when given; a consumer that cannot keep up
            makes it wait, so the reflector stops reading and the API server's stream waits in TCP.
    """

    def __init__(
        self,
        client: KubeClient,
        path: str,
        handler: ReflectorHandler,
        *,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = 500,
        backoff: Backoff | None = None,
        streaming_list: bool = True,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._client = client
        self.path = path
        self._handler = handler
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["labelSelector"] = label_selector
        if field_selector:
            self._selectors["fieldSelector"] = field_selector
        self._page_size = page_size
        self._backoff = backoff or Backoff(initial_s=0.8, max_s=30.0, jitter=0.5, reset_after_s=60.0)
        self._known: dict[tuple[str, str], str] = {}
        self._resource_version: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._resync = False
        self._streaming_list = streaming_list
        self._pace = pace
        self.synced = False

    def start(self) -> None:
        """Start the list/watch loop as a task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"reflector {self.path}")

    def cancel(self) -> asyncio.Task[None] | None:
        """Cancel the loop without waiting: no event is delivered after this returns.

        Returns:
            The cancelled task (await it to be sure it has ended), or None if not running.
        """
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def stop(self) -> None:
        """Cancel the loop and wait for it to end."""
        task = self.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def resync(self) -> None:
        """Re-deliver every object: the next list delivers unchanged objects too, and a list starts now."""
        self._resync = True
        self._resource_version = None
        if self._task is not None:
            # The old task is cancelled at its current await point, before it can deliver anything else.
            self._task.cancel()
            self._task = asyncio.create_task(self.run(), name=f"reflector {self.path}")

    @property
    def known_keys(self) -> list[tuple[str, str]]:
        """``(namespace, name)`` of every object currently known."""
        return list(self._known)

    async def run(self) -> None:
        """List and watch until cancelled."""
        while True:
            try:
                if self._resource_version is None:
                    if self._streaming_list:
                        await self._stream_list()  # continues as the watch after the initial events
                    else:
                        await self._list()
                await self._watch()
                self._backoff.reset()
            except _Gone:
                _log.debug("reflector_relist", path=self.path)
                self._resource_version = None
            except KubeError as exc:
                self._handler.on_error(exc)
                delay = self._backoff.next_delay()
                _log.info("reflector_retry", path=self.path, error=str(exc), delay_s=round(delay, 2))
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        params = dict(self._selectors)
        seen: set[tuple[str, str]] = set()
        resource_version = ""
        first = True
        force = self._resync
        try:
            async for page in self._client.list_pages(self.path, params, limit=self._page_size):
                if first:
                    resource_version = str((page.get("metadata") or {}).get("resourceVersion") or "")
                    first = False
                for obj in page.get("items") or []:
                    meta = obj.get("metadata") or {}
                    key = (intern(str(meta.get("namespace") or "")), str(meta.get("name") or ""))
                    seen.add(key)
                    rv = str(meta.get("resourceVersion") or "")
                    if force or self._known.get(key) != rv or not rv:
                        self._known[key] = rv
                        self._handler.on_upsert(obj)
                if self._pace is not None:
                    await self._pace()
                await asyncio.sleep(0)  # let other tasks run between pages
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        self._finish_sync(seen, resource_version)

    async def _stream_list(self) -> None:
        """Initial state as watch events, then keep watching on the same stream until it ends."""
        params = dict(self._selectors)
        params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true")
        timeout = random.randint(*WATCH_TIMEOUT_RANGE_S)
        params["timeoutSeconds"] = str(timeout)
        seen: set[tuple[str, str]] = set()
        force = self._resync
        initial = True
        try:
            async for event in self._client.watch(self.path, params, read_timeout_s=timeout + 60.0):
                if self._pace is not None:
                    await self._pace()
                if not initial:
                    self._on_event(event)
                    continue
                kind = event.get("type")
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                if kind == "ADDED":
                    key = (intern(str(meta.get("namespace") or "")), str(meta.get("name") or ""))
                    seen.add(key)
                    rv = str(meta.get("resourceVersion") or "")
                    if force or self._known.get(key) != rv or not rv:
                        self._known[key] = rv
                        self._handler.on_upsert(obj)
                elif kind == "BOOKMARK":
                    if (meta.get("annotations") or {}).get("k8s.io/initial-events-end") != "true":
                        # A server that ignores sendInitialEvents (before Kubernetes 1.27) never marks the end.
                        _log.info("reflector_streaming_list_unsupported", path=self.path, reason="no end marker")
                        self._streaming_list = False
                        raise _Gone()
                    initial = False
                    self._finish_sync(seen, str(meta.get("resourceVersion") or ""))
                else:
                    self._on_event(event)  # ERROR events raise
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Gone() from exc
            if initial and exc.status in (400, 403, 422) and "sendInitialEvents" in exc.message + exc.reason:
                _log.info("reflector_streaming_list_unsupported", path=self.path, error=str(exc))
                self._streaming_list = False
                raise _Gone() from exc  # list the classic way at once
            raise
        if initial:
            raise KubeConnectionError(f"watch {self.path}: stream ended before the initial events were complete")

    def _finish_sync(self, seen: set[tuple[str, str]], resource_version: str) -> None:
        for key in [k for k in self._known if k not in seen]:
            del self._known[key]
            self._handler.on_delete(*key)
        self._resync = False
        self._resource_version = resource_version
        self.synced = True
        self._handler.on_synced()

    async def _watch(self) -> None:
        assert self._resource_version is not None
        params = dict(self._selectors)
        params["resourceVersion"] = self._resource_version
        params["allowWatchBookmarks"] = "true"
        timeout = random.randint(*WATCH_TIMEOUT_RANGE_S)
        params["timeoutSeconds"] = str(timeout)
        try:
            async for event in self._client.watch(self.path, params, read_timeout_s=timeout + 60.0):
                if self._pace is not None:
                    await self._pace()
                self._on_event(event)
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise

    def _on_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise _Gone()
            raise KubeApiError(code or 500, str(obj.get("reason") or "WatchError"), str(obj.get("message") or ""))
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        if kind == "BOOKMARK":
            if rv:
                self._resource_version = rv
            return
        key = (intern(str(meta.get("namespace") or "")), str(meta.get("name") or ""))
        if kind in ("ADDED", "MODIFIED"):
            self._known[key] = rv
            self._handler.on_upsert(obj)
        elif kind == "DELETED" and self._known.pop(key, None) is not None:
            self._handler.on_delete(*key)
        if rv:
            self._resource_version = rv
