"""The Graph API engine in agentk: discovery, watches, graph, visibility and batching for one request.

High-level algorithm (seed 002 "High-level algorithm"):

1. Discovery is read and filtered through the queries (``selection.py``); it is read again when a
   ``CustomResourceDefinition`` changes (debounced) and every ``rediscovery_interval_s``.
2. Namespaces: cluster-wide (no filter), the listed ones, or every namespace passing the label/field
   selectors (sent to the API server) and the CEL expression (evaluated here). In the last two modes with a
   CEL expression, Namespace objects are watched and namespaces start and stop being watched as they
   appear, change and disappear.
3. One reflector per selected resource and namespace (cluster-scoped resources and cluster-wide mode: one
   per resource) with the query's label and field selectors; the query's CEL object filter runs here.
4. Objects passing the filters become vertices with their arcs (``arcs.py``); visibility from roots and
   the client's state are handled by ``view.py``.

Flow control: :meth:`GraphEngine.next_batch` is pulled by the transport. Changes accumulate in the graph's
dirty sets until pulled, so a slow client costs no memory beyond the graph, and each batch carries the
latest state of what changed. The initial state is streamed (issue 15): vertices leave as their objects
arrive and an arc as soon as both of its ends have been sent (``view.py``); arcs whose destination has not
been seen wait until every watch has synced (or failed, or ``sync_timeout_s`` passed) and then go with
``e``. With root expressions visibility depends on the whole graph, so the first batch waits for that
point instead.

Warnings (seed 002 "Warnings"): ``INFORMER_SYNC_FAILED`` when a watch has not synced within
``sync_timeout_s``; ``DISCOVERY_FAILED`` for discovery errors and partial discovery; ``NAMESPACE_LIST_FAILED``
when the Namespace watch does not sync or a namespace's CEL expression fails; ``OBJECT_PROCESSING_FAILED``
when an object's CEL filter, root expressions, references or projection fail (one warning per expression,
the first object is named); ``INTERNAL_ERROR`` for unexpected exceptions while processing events.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import Any

import msgspec
import structlog

from tether.kube.client import KubeClient, KubeError
from tether.kube.discovery import ApiResource, Discovery, discover
from tether.kube.reflector import Reflector
from tether.modules.graph.engine.arcs import ExtractionError, extract
from tether.modules.graph.engine.cel import CelEvaluationError, object_variables
from tether.modules.graph.engine.graph import Graph, Node
from tether.modules.graph.engine.model import (
    WARNING_DISCOVERY_FAILED,
    WARNING_INFORMER_SYNC_FAILED,
    WARNING_INTERNAL_ERROR,
    WARNING_NAMESPACE_LIST_FAILED,
    WARNING_OBJECT_PROCESSING_FAILED,
    Action,
    GraphWarning,
    VertexId,
)
from tether.modules.graph.engine.request import GraphRequest, NamespaceMode
from tether.modules.graph.engine.selection import Selection, WatchedResource, select_resources
from tether.modules.graph.engine.view import ClientView
from tether.tool.backoff import Backoff

__all__ = ["EngineOptions", "GraphBatch", "GraphEngine", "GraphEngineError"]

_log = structlog.get_logger(__name__)
_ENCODER = msgspec.json.Encoder()

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NAMESPACES_PATH = "/api/v1/namespaces"


@dataclass(frozen=True)
class EngineOptions:
    """Tunables of one engine.

    Attributes:
        sync_timeout_s: seconds a watch may take to sync before ``INFORMER_SYNC_FAILED`` (and the first
            batch stops waiting for it).
        batch_delay_s: seconds changes are collected before a batch is built (coalescing window).
        max_actions_per_message: upper bound on actions per batch.
        max_message_bytes: approximate upper bound on a batch's encoded size.
        rediscovery_interval_s: periodic re-read of discovery (also covers aggregated APIs).
        rediscovery_debounce_s: wait after a CRD change before re-reading discovery.
        page_size: objects per list request.
        max_pending_warnings: warnings kept while the client is slow; more are dropped (and logged).
        max_pending_vertices: vertices waiting to be sent (each holding its encoded object) above which the
            watches stop reading until the client has taken half of them (streamed mode, i.e. without roots):
            a client slower than the API server then bounds agentk's memory instead of growing it.
    """

    sync_timeout_s: float = 30.0
    batch_delay_s: float = 0.02
    max_actions_per_message: int = 2000
    max_message_bytes: int = 1 << 20
    rediscovery_interval_s: float = 600.0
    rediscovery_debounce_s: float = 1.0
    page_size: int = 500
    max_pending_warnings: int = 100
    max_pending_vertices: int = 2000


@dataclass
class GraphBatch:
    """One message worth of changes: actions (in order) and warnings."""

    actions: list[Action] = field(default_factory=list)
    warnings: list[GraphWarning] = field(default_factory=list)


class GraphEngineError(RuntimeError):
    """The engine failed and cannot continue (the watch must end with an internal error)."""


class _SyncedWatch:
    """A reflector whose first sync is awaited by the engine, with a warning when it takes too long."""

    def __init__(self, engine: GraphEngine, path: str, label_selector: str, field_selector: str) -> None:
        self.engine = engine
        self.synced = False
        self.failed = False
        self.last_error: KubeError | None = None
        self.reflector = Reflector(
            engine.kube,
            path,
            self,
            label_selector=label_selector,
            field_selector=field_selector,
            page_size=engine.options.page_size,
            pace=engine.pace,
        )
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.reflector.start()
        self._timer = asyncio.get_running_loop().call_later(self.engine.options.sync_timeout_s, self._sync_timeout)

    def cancel(self) -> asyncio.Task[None] | None:
        if self._timer is not None:
            self._timer.cancel()
        return self.reflector.cancel()

    def _sync_timeout(self) -> None:
        if self.synced:
            return
        if self.engine.paced:  # waiting for the client, not for the API server: give it another period
            self._timer = asyncio.get_running_loop().call_later(self.engine.options.sync_timeout_s, self._sync_timeout)
            return
        self.failed = True
        detail = f": {self.last_error}" if self.last_error else ""
        self.engine.warn(self._timeout_warning(detail))
        self.engine.check_ready()

    def _timeout_warning(self, detail: str) -> GraphWarning:
        raise NotImplementedError

    # ReflectorHandler

    def on_upsert(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_delete(self, namespace: str, name: str) -> None:
        raise NotImplementedError

    def on_synced(self) -> None:
        self.synced = True
        self.engine.check_ready()

    def on_error(self, error: KubeError) -> None:
        self.last_error = error
        if not self.synced:
            self.failed = True
            self.engine.check_ready()


class _Informer(_SyncedWatch):
    """One reflector for one watched resource in one namespace ("" = all or cluster-scoped)."""

    def __init__(self, engine: GraphEngine, watched: WatchedResource, namespace: str) -> None:
        self.watched = watched
        self.namespace = namespace
        object_filter = watched.object_filter
        super().__init__(
            engine, watched.api.collection_path(namespace), object_filter.label_selector, object_filter.field_selector
        )

    def _timeout_warning(self, detail: str) -> GraphWarning:
        w = self.watched
        where = f" in {self.namespace}" if self.namespace else ""
        attributes = {"g": w.group, "v": w.version, "r": w.resource}
        if self.namespace:
            attributes["ns"] = self.namespace
        return GraphWarning(
            WARNING_INFORMER_SYNC_FAILED,
            f"Failed to sync informer for {_gvr(w)}{where} in {self.engine.options.sync_timeout_s:g} seconds. "
            f"Check agent's log, agent's permissions{detail}",
            attributes,
        )

    def on_upsert(self, obj: dict[str, Any]) -> None:
        self.engine.guard(self.engine.upsert_object, self, obj)

    def on_delete(self, namespace: str, name: str) -> None:
        self.engine.guard(self.engine.delete_object, self, namespace, name)


class _NamespaceWatcher(_SyncedWatch):
    """Watches Namespace objects to decide which namespaces are watched (list mode with filters, all mode)."""

    def __init__(self, engine: GraphEngine) -> None:
        selection = engine.request.namespaces
        super().__init__(engine, NAMESPACES_PATH, selection.label_selector, selection.field_selector)

    def _timeout_warning(self, detail: str) -> GraphWarning:
        return GraphWarning(
            WARNING_NAMESPACE_LIST_FAILED,
            f"Failed to list namespaces in {self.engine.options.sync_timeout_s:g} seconds. "
            f"Check agent's log, agent's permissions{detail}",
            {},
        )

    def on_upsert(self, obj: dict[str, Any]) -> None:
        self.engine.guard(self._upsert, obj)

    def _upsert(self, obj: dict[str, Any]) -> None:
        engine = self.engine
        selection = engine.request.namespaces
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if selection.mode is NamespaceMode.LIST and name not in selection.names:
            return
        selected = True
        if selection.expression is not None:
            try:
                selected = selection.expression.evaluate(object_variables(obj, "", "v1", "namespaces", "", name))
            except CelEvaluationError as exc:
                selected = False
                engine.warn_once(
                    ("namespace-cel", name),
                    GraphWarning(
                        WARNING_NAMESPACE_LIST_FAILED,
                        f"Evaluating namespaces.object_selector_expression for namespace {name} failed: {exc}",
                        {"ns": name},
                    ),
                )
        engine.set_namespace(name, selected)

    def on_delete(self, namespace: str, name: str) -> None:
        self.engine.guard(self.engine.set_namespace, name, False)


class _CrdWatcher:
    """Triggers a discovery re-read when a CustomResourceDefinition changes (after the initial list)."""

    def __init__(self, engine: GraphEngine) -> None:
        self.engine = engine
        self.synced = False
        self.reflector = Reflector(engine.kube, CRD_PATH, self, page_size=engine.options.page_size)

    def on_upsert(self, obj: dict[str, Any]) -> None:
        if self.synced:
            self.engine.request_rediscovery()

    def on_delete(self, namespace: str, name: str) -> None:
        if self.synced:
            self.engine.request_rediscovery()

    def on_synced(self) -> None:
        if self.synced:
            self.engine.request_rediscovery()  # a relist may hide changes
        self.synced = True

    def on_error(self, error: KubeError) -> None:
        _log.debug("graph_crd_watch_error", error=str(error))


class GraphEngine:
    """Computes and streams the graph for one request.

    Use as an async context manager (or call :meth:`start` / :meth:`close`), then pull
    :meth:`next_batch` until done. Runs on the current event loop; not thread-safe.

    Args:
        kube: API client (agentk's credentials).
        request: the compiled request.
        options: tunables.
    """

    def __init__(self, kube: KubeClient, request: GraphRequest, options: EngineOptions | None = None) -> None:
        self.kube = kube
        self.request = request
        self.options = options or EngineOptions()
        self.graph = Graph()
        self.view = ClientView(
            self.graph,
            roots_enabled=request.roots.enabled,
            undirected=request.roots.undirected,
            holding=not request.roots.enabled,
            keep_payloads=request.roots.enabled,
        )
        self.selection: Selection | None = None
        self._informers: dict[tuple[str, str, str], _Informer] = {}
        self._namespaces: set[str] = (
            set(request.namespaces.names) if request.namespaces.mode is NamespaceMode.LIST else set()
        )
        self._namespace_watcher: _NamespaceWatcher | None = None
        self._crd_watcher: _CrdWatcher | None = None
        self._warnings: list[GraphWarning] = []
        self._warned: set[Any] = set()
        self._wakeup = asyncio.Event()
        self._ready = asyncio.Event()
        self._rediscover = asyncio.Event()
        self._discovered = False
        self._first_sent = False
        self._continuation = False
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping: list[asyncio.Task[None]] = []
        self._deadline = 0.0
        #: Set while the watches may read on (see ``EngineOptions.max_pending_vertices``).
        self._room = asyncio.Event()
        self._room.set()
        self._pacing = not request.roots.enabled  # with roots nothing is sent before sync: never pause then
        self._pack_payloads = request.roots.enabled  # with roots projections are kept (``ClientView`` doc)

    # ---- lifecycle ----

    async def __aenter__(self) -> GraphEngine:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start discovery and watching in the background (idempotent)."""
        if self._task is None:
            self._deadline = asyncio.get_running_loop().time() + self.options.sync_timeout_s
            self._task = asyncio.create_task(self._run(), name="graph-engine")

    async def close(self) -> None:
        """Stop every watch and background task."""
        tasks: list[asyncio.Task[None]] = []
        if self._task is not None:
            self._task.cancel()
            tasks.append(self._task)
            self._task = None
        for informer in self._informers.values():
            task = informer.cancel()
            if task is not None:
                tasks.append(task)
        self._informers.clear()
        for watcher in (self._namespace_watcher, self._crd_watcher):
            if watcher is not None:
                task = watcher.reflector.cancel() if isinstance(watcher, _CrdWatcher) else watcher.cancel()
                if task is not None:
                    tasks.append(task)
        tasks.extend(self._stopping)
        self._stopping.clear()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ---- pacing ----

    @property
    def initial_state_sent(self) -> bool:
        """Every watch has synced (or failed) and the client has taken everything pending."""
        return self._ready.is_set() and not self.view.pending()

    @property
    def paced(self) -> bool:
        """The watches are waiting for the client to take pending vertices."""
        return not self._room.is_set()

    async def pace(self) -> None:
        """Awaited by the reflectors between events: returns when there is room for more pending vertices."""
        if not self._room.is_set():
            await self._room.wait()

    # ---- pulling batches ----

    async def next_batch(self) -> GraphBatch:
        """Wait for and return the next batch of actions and warnings (never empty).

        Raises:
            GraphEngineError: the engine failed (bug or unrecoverable condition).
        """
        if not self._first_sent and self.request.roots.enabled:
            remaining = self._deadline - asyncio.get_running_loop().time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), max(remaining, 0.0))
            self._first_sent = True
        while True:
            if self._failure is not None:
                raise GraphEngineError(f"graph engine failed: {self._failure}") from self._failure
            if self.view.pending() or self._warnings:
                if not self._continuation and self.options.batch_delay_s > 0:
                    await asyncio.sleep(self.options.batch_delay_s)
                actions = self.view.take(self.options.max_actions_per_message, self.options.max_message_bytes)
                if len(self.graph.changes.vertices) <= self.options.max_pending_vertices // 2:
                    self._room.set()
                warnings, self._warnings = self._warnings, []
                self._continuation = self.view.pending()
                if actions or warnings:
                    return GraphBatch(actions, warnings)
                continue
            self._wakeup.clear()
            await self._wakeup.wait()

    # ---- warnings ----

    def warn(self, warning: GraphWarning) -> None:
        """Queue a warning for the next batch (dropped when too many are pending)."""
        if len(self._warnings) >= self.options.max_pending_warnings:
            _log.warning("graph_warning_dropped", type=warning.type, message=warning.message)
            return
        self._warnings.append(warning)
        self._wakeup.set()

    def warn_once(self, key: Any, warning: GraphWarning) -> None:
        """Queue ``warning`` unless one with the same ``key`` was queued before during this watch."""
        if key not in self._warned:
            self._warned.add(key)
            self.warn(warning)

    def guard(self, function: Any, *args: Any) -> None:
        """Run an event handler; unexpected exceptions become ``INTERNAL_ERROR`` warnings.

        An error while processing a Secret is reported by type only, in the warning and in the log.
        """
        try:
            function(*args)
        except Exception as exc:
            if any(isinstance(arg, _Informer) and _is_secret_resource(arg.watched) for arg in args):
                _log.error("graph_event_failed", error_type=type(exc).__name__, resource="secrets")
                detail = f"{type(exc).__name__} (details withheld because the object is a Secret)"
            else:
                _log.exception("graph_event_failed")
                detail = repr(exc)
            self.warn_once(
                ("internal", type(exc).__name__, detail),
                GraphWarning(WARNING_INTERNAL_ERROR, f"Internal error while processing an event: {detail}", {}),
            )

    # ---- objects ----

    def upsert_object(self, informer: _Informer, obj: dict[str, Any]) -> None:
        """Process an added or changed object of ``informer``."""
        w = informer.watched
        if "kind" not in obj:  # list responses omit the type of their items; watch events carry it
            obj["apiVersion"] = w.api.api_version
            obj["kind"] = w.kind
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        namespace = intern(str(meta.get("namespace") or "")) if w.namespaced else ""
        vertex = VertexId(w.group, w.version, w.resource, namespace, name)
        object_filter = w.object_filter
        roots = self.request.roots
        variables: Mapping[str, Any] | None = None
        if object_filter.expression is not None or roots.enabled:
            variables = object_variables(obj, w.group, w.version, w.resource, namespace, name)
        if object_filter.expression is not None:
            assert variables is not None
            try:
                keep = object_filter.expression.evaluate(variables)
            except CelEvaluationError as exc:
                keep = False
                self.warn_once(
                    ("object-cel", w.query_index),
                    self._object_warning(
                        vertex, f"Evaluating queries[{w.query_index}].include.object.object_selector_expression", exc
                    ),
                )
            if not keep:
                self.graph.remove(vertex)
                self._wakeup.set()
                return
        assert self.selection is not None
        try:
            extracted = extract(w, obj, self.selection)
        except ExtractionError as exc:
            extracted = exc.partial
            self.warn(self._object_warning(vertex, f"Extracting references of {_describe(vertex)}", exc))
        root = False
        if roots.enabled:
            assert variables is not None
            for index, expression in enumerate(roots.expressions):
                try:
                    if expression.evaluate(variables):
                        root = True
                        break
                except CelEvaluationError as exc:
                    self.warn_once(
                        ("root-cel", index),
                        self._object_warning(vertex, f"Evaluating roots.object_selector_expressions[{index}]", exc),
                    )
        encoded_object, encoded_json_path = self._projection(w, vertex, obj)
        packed = self._pack_payloads and bool(encoded_object or encoded_json_path)
        if packed:
            # Kept for the vertex's life (a root may reach it later): about a third of the size, 15 us per Pod.
            encoded_object = zlib.compress(encoded_object, 1) if encoded_object is not None else None
            encoded_json_path = zlib.compress(encoded_json_path, 1) if encoded_json_path is not None else None
        self.graph.upsert(
            vertex,
            Node(
                labels=_compact_labels(meta.get("labels")),
                refs=extracted.refs,
                selectors=tuple(extracted.selectors),
                root=root,
                object=encoded_object,
                json_path=encoded_json_path,
                packed=packed,
            ),
        )
        if self._pacing and len(self.graph.changes.vertices) >= self.options.max_pending_vertices:
            self._room.clear()
        self._wakeup.set()

    def delete_object(self, informer: _Informer, namespace: str, name: str) -> None:
        """Process a deleted object of ``informer``."""
        w = informer.watched
        self.graph.remove(VertexId(w.group, w.version, w.resource, namespace if w.namespaced else "", name))
        self._wakeup.set()

    def _projection(
        self, w: WatchedResource, vertex: VertexId, obj: dict[str, Any]
    ) -> tuple[bytes | None, bytes | None]:
        """``o`` or ``j`` for the object (seed 002 "Set a vertex"); Secrets never carry content."""
        if _is_secret_resource(w):
            return None, None
        json_path = w.object_filter.json_path
        try:
            if json_path is not None:
                results = json_path.find(obj)
                return None, (_ENCODER.encode(results) if results else None)
            meta = obj.get("metadata")
            if isinstance(meta, dict):
                meta.pop("managedFields", None)  # the object is ours and the filters have seen it
            return (_ENCODER.encode(obj) if obj else None), None
        except (TypeError, ValueError, OverflowError) as exc:
            self.warn(self._object_warning(vertex, f"Encoding {_describe(vertex)}", exc))
            return None, None

    def _object_warning(self, vertex: VertexId, what: str, error: Exception) -> GraphWarning:
        """``OBJECT_PROCESSING_FAILED`` for ``what`` failing with ``error`` on ``vertex``.

        For a Secret the error's text is left out: CEL errors quote the values they failed on (a missing map
        key, an invalid regular expression, a non-bool result), so they could carry the Secret's data, which
        the Graph API never sends (issue 9 item 1).
        """
        if _is_secret(vertex):
            message = f"{what} failed ({type(error).__name__}; details withheld because the object is a Secret)"
        else:
            message = f"{what} failed: {error}"
        attributes = {"g": vertex.group, "v": vertex.version, "r": vertex.resource}
        if vertex.namespace:
            attributes["ns"] = vertex.namespace
        attributes["n"] = vertex.name
        return GraphWarning(WARNING_OBJECT_PROCESSING_FAILED, message, attributes)

    # ---- namespaces, informers ----

    def set_namespace(self, name: str, selected: bool) -> None:
        """Start or stop watching ``name`` (list mode with CEL, all-namespaces mode)."""
        if selected == (name in self._namespaces):
            return
        if selected:
            self._namespaces.add(name)
        else:
            self._namespaces.discard(name)
        self._reconcile()

    def check_ready(self) -> None:
        """Release the first batch once discovery is done and every watch has synced or failed."""
        if self._ready.is_set() or not self._discovered:
            return
        watcher = self._namespace_watcher
        if watcher is not None and not (watcher.synced or watcher.failed):
            return
        if all(i.synced or i.failed for i in self._informers.values()):
            self._ready.set()
            self.view.release()
            self._wakeup.set()

    def request_rediscovery(self) -> None:
        """Re-read discovery soon (a CRD changed)."""
        self._rediscover.set()

    def _reconcile(self) -> None:
        selection = self.selection
        if selection is None:
            return
        cluster_wide = self.request.namespaces.mode is NamespaceMode.CLUSTER
        desired: dict[tuple[str, str, str], WatchedResource] = {}
        for watched in selection.resources:
            if not watched.namespaced or cluster_wide:
                desired[(watched.group, watched.resource, "")] = watched
            else:
                for namespace in self._namespaces:
                    desired[(watched.group, watched.resource, namespace)] = watched
        for key, informer in list(self._informers.items()):
            if desired.get(key) != informer.watched:
                self._stop_informer(key, informer)
        for key, watched in desired.items():
            if key not in self._informers:
                informer = _Informer(self, watched, key[2])
                self._informers[key] = informer
                informer.start()
        self.check_ready()

    def _stop_informer(self, key: tuple[str, str, str], informer: _Informer) -> None:
        del self._informers[key]
        task = informer.cancel()
        if task is not None:
            self._stopping.append(task)
            task.add_done_callback(self._forget_task)
        w = informer.watched
        for namespace, name in informer.reflector.known_keys:
            self.graph.remove(VertexId(w.group, w.version, w.resource, namespace if w.namespaced else "", name))
        self._wakeup.set()

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._stopping.remove(task)

    # ---- discovery ----

    async def _run(self) -> None:
        try:
            await self._run_inner()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            _log.exception("graph_engine_failed")
            self._failure = exc
            self._wakeup.set()

    async def _run_inner(self) -> None:
        discovery = await self._discover_until_success()
        self._apply_discovery(discovery)
        namespaces = self.request.namespaces
        if namespaces.mode is NamespaceMode.ALL or (
            namespaces.mode is NamespaceMode.LIST
            and (namespaces.expression is not None or namespaces.label_selector or namespaces.field_selector)
        ):
            self._namespaces.clear()
            self._namespace_watcher = _NamespaceWatcher(self)
            self._namespace_watcher.start()
        self._discovered = True
        self._reconcile()
        self._crd_watcher = _CrdWatcher(self)
        self._crd_watcher.reflector.start()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rediscover.wait(), self.options.rediscovery_interval_s)
            await asyncio.sleep(self.options.rediscovery_debounce_s)
            self._rediscover.clear()
            try:
                discovery = await discover(self.kube)
            except KubeError as exc:
                self.warn(GraphWarning(WARNING_DISCOVERY_FAILED, f"Discovery failed: {exc}", {}))
                continue
            self._apply_discovery(discovery)

    async def _discover_until_success(self) -> Discovery:
        backoff = Backoff(initial_s=1.0, max_s=30.0, jitter=0.5)
        while True:
            try:
                return await discover(self.kube)
            except KubeError as exc:
                self.warn(GraphWarning(WARNING_DISCOVERY_FAILED, f"Discovery failed: {exc}", {}))
                await asyncio.sleep(backoff.next_delay())

    def _apply_discovery(self, discovery: Discovery) -> None:
        if discovery.failures:
            self.warn(
                GraphWarning(
                    WARNING_DISCOVERY_FAILED,
                    "Discovery returned a partial response: " + "; ".join(discovery.failures),
                    {},
                )
            )
        selection = select_resources(discovery.resources, self.request.queries)
        for error in selection.errors:
            self.warn_once(("query-cel", error), GraphWarning(WARNING_INTERNAL_ERROR, error, {}))
        previous = self.selection
        self.selection = selection
        if previous is not None and _resolution_key(previous) != _resolution_key(selection):
            # References resolve against the watched resources: re-deliver every object so its arcs are
            # extracted again (objects themselves are not kept).
            for informer in self._informers.values():
                informer.reflector.resync()
        self._reconcile()


def _compact_labels(labels: Any) -> dict[str, str] | None:
    """``metadata.labels`` with interned strings: keys and many values (``app``, template hashes) repeat."""
    if not isinstance(labels, dict) or not labels:
        return None
    return {intern(k): intern(v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def _resolution_key(selection: Selection) -> frozenset[ApiResource]:
    return frozenset(w.api for w in selection.resources)


def _gvr(w: WatchedResource) -> str:
    return f"{w.group}/{w.version}/{w.resource}" if w.group else f"{w.version}/{w.resource}"


def _is_secret(vertex: VertexId) -> bool:
    return vertex.group == "" and vertex.resource == "secrets"


def _is_secret_resource(w: WatchedResource) -> bool:
    return w.group == "" and w.resource == "secrets"


def _describe(vertex: VertexId) -> str:
    gvr = (
        f"{vertex.group}/{vertex.version}/{vertex.resource}" if vertex.group else f"{vertex.version}/{vertex.resource}"
    )
    return f"{gvr} {vertex.namespace}/{vertex.name}" if vertex.namespace else f"{gvr} {vertex.name}"
