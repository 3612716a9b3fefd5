"""agentk's internal gRPC server: modules register the APIs kas calls through reverse tunnels.

Upstream runs it in memory (kas.md §0.1, seed 001 "agentk startup"); grpcio has no in-process
transport, so this is a ``grpc.aio`` server on a unix domain socket in a private temporary directory,
plus one client channel to it. The services registered here form the ``AgentDescriptor`` a tunnel
advertises (kas.md §1.4 "Which services are advertised").
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import descriptor_pool
from grpc import aio

from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.tool import tracing
from tether.tool.grpc_stream import BOUNDED_WINDOW_OPTIONS, PENDING_RPC_OPTIONS
from tether.tool.logs import REQUEST_ID_METADATA

__all__ = ["InternalServer"]

S = TypeVar("S")

#: The tunnel module is a client of kas, never served here, so it must not advertise itself (kas.md §1.4).
_NEVER_ADVERTISED_PREFIX = "gitlab.agent.reverse_tunnel."


class InternalServer:
    """The internal gRPC server and a channel to it.

    Register every module API before :meth:`start`; :meth:`descriptor` then lists exactly what was
    registered. Use it inside a running event loop.

    Args:
        options: extra ``grpc.aio`` options for both server and channel, e.g.
            ``[("grpc.max_receive_message_length", 10485760)]`` (bytes).
    """

    def __init__(self, options: Sequence[tuple[str, Any]] = ()) -> None:
        self._options = [*options, *BOUNDED_WINDOW_OPTIONS]
        self._server = aio.server(options=[*self._options, *PENDING_RPC_OPTIONS], interceptors=[RequestIdInterceptor()])
        self._services: dict[str, list[str]] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}  # "/<service>/<method>" -> handler
        self._generic: list[grpc.GenericRpcHandler] = []  # handlers that name their methods only when asked
        self._directory: Path | None = None
        self._channel: aio.Channel | None = None
        self._started = False

    def add_servicer(self, register_fn: Callable[[S, Any], None], servicer: S) -> None:
        """Register a servicer with its generated ``add_<Service>Servicer_to_server`` function.

        The service and method names are captured from the handlers the function installs.

        Raises:
            RuntimeError: the server has already started.
        """
        self._check_not_started()
        register_fn(servicer, _RecordingServer(self._server, self._record, self._keep, self._generic.extend))

    def add_generic_handler(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Register hand-built handlers (e.g. raw-bytes ones) for ``service_name`` (full proto name).

        Args:
            service_name: e.g. ``gitlab.agent.kubernetes_api.rpc.KubernetesApi``.
            method_handlers: method name (e.g. ``MakeRequest``) -> handler.

        Raises:
            RuntimeError: the server has already started.
        """
        self._check_not_started()
        self._server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(service_name, dict(method_handlers))]
        )
        self._record(service_name, method_handlers.keys())
        self._keep(service_name, method_handlers)

    def handler(self, method: str) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler registered for ``method`` (``/<service>/<method>``), or None when there is none.

        The reverse tunnels serve their calls with it in-process (:mod:`tether.modagent.local_call`).
        """
        if (found := self._handlers.get(method)) is not None:
            return found
        details = _CallDetails(method)
        return next((h for g in self._generic if (h := g.service(details)) is not None), None)

    def descriptor(self) -> info_pb2.AgentDescriptor:
        """The services and methods registered so far, sorted by name (the tunnel's ``descriptor``)."""
        return info_pb2.AgentDescriptor(
            services=[
                info_pb2.Service(name=name, methods=[info_pb2.Method(name=m) for m in methods])
                for name, methods in sorted(self._services.items())
                if not name.startswith(_NEVER_ADVERTISED_PREFIX)
            ]
        )

    @property
    def target(self) -> str:
        """The ``unix://`` address the server listens on.

        Raises:
            RuntimeError: before :meth:`start`.
        """
        if self._directory is None:
            raise RuntimeError("internal server not started")
        return f"unix://{self._directory / 'internal.sock'}"

    @property
    def channel(self) -> aio.Channel:
        """A channel to the server (shared; closed by :meth:`stop`).

        Raises:
            RuntimeError: before :meth:`start`.
        """
        if self._channel is None:
            raise RuntimeError("internal server not started")
        return self._channel

    async def start(self) -> None:
        """Bind the socket in a fresh private temporary directory, start serving and open the channel.

        Raises:
            RuntimeError: started twice, or the socket could not be bound.
        """
        self._check_not_started()
        self._started = True
        # mkdtemp creates the directory 0700, so only this user can connect to the socket.
        self._directory = Path(tempfile.mkdtemp(prefix="tether-agentk-"))
        self._server.add_insecure_port(self.target)
        await self._server.start()
        self._channel = aio.insecure_channel(self.target, options=self._options)

    async def stop(self, grace: float | None) -> None:
        """Stop the server, close the channel and remove the socket directory.

        Args:
            grace: seconds in-flight calls may still run before being cancelled; None cancels at once.
        """
        # Server first: closing the channel first would cancel the in-flight calls the grace is for.
        await self._server.stop(grace)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    def _check_not_started(self) -> None:
        if self._started:
            raise RuntimeError("internal server already started; register APIs before start()")

    def _record(self, service_name: str, methods: Iterable[str]) -> None:
        known = self._services.setdefault(service_name, [])
        known.extend(m for m in methods if m not in known)

    def _keep(self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        for name, method_handler in method_handlers.items():
            self._handlers[f"/{service_name}/{name}"] = method_handler


class _CallDetails(grpc.HandlerCallDetails):
    """What a generic handler is asked with: the method's name (no metadata)."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class _RecordingServer(aio.Server):
    """Passes registrations to the real server and reports the service and method names they carry."""

    def __init__(
        self,
        server: aio.Server,
        record: Callable[[str, Iterable[str]], None],
        keep: Callable[[str, Mapping[str, grpc.RpcMethodHandler[Any, Any]]], None],
        keep_generic: Callable[[Iterable[grpc.GenericRpcHandler]], None],
    ) -> None:
        self._server = server
        self._record = record
        self._keep = keep
        self._keep_generic = keep_generic

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        handlers = list(generic_rpc_handlers)
        self._server.add_generic_rpc_handlers(handlers)
        self._keep_generic(handlers)
        # Generated code also calls add_registered_method_handlers (names recorded there); for other
        # callers, a service handler at least names its service, and its methods come from the descriptor pool.
        for handler in handlers:
            if isinstance(handler, grpc.ServiceRpcHandler):
                self._record(handler.service_name(), _methods_from_pool(handler.service_name()))

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)
        self._record(service_name, method_handlers.keys())
        self._keep(service_name, method_handlers)

    def add_insecure_port(self, address: str) -> int:
        raise RuntimeError("modules must not open ports on the internal server")

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        raise RuntimeError("modules must not open ports on the internal server")

    async def start(self) -> None:
        raise RuntimeError("the internal server is started by agentk")

    async def stop(self, grace: float | None) -> None:
        raise RuntimeError("the internal server is stopped by agentk")

    async def wait_for_termination(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (grpc API)
        raise RuntimeError("the internal server is owned by agentk")


def _methods_from_pool(service_name: str) -> list[str]:
    try:
        service = descriptor_pool.Default().FindServiceByName(service_name)
    except KeyError:
        return []
    return [method.name for method in service.methods]


class RequestIdInterceptor(aio.ServerInterceptor):
    """Binds the ``request_id`` kas sent in metadata to the log lines of the call (issue 9 item 6), and its trace."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Bind the request id for the handler, which runs in this same task."""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == REQUEST_ID_METADATA and isinstance(value, str):
                structlog.contextvars.bind_contextvars(request_id=value)
                break
        tracer = tracing.TRACER
        if tracer is not None:
            # The tunnelled call's trace context becomes current for the handler, so its API server requests are
            # child spans (issue 25 item 3); the call's task and its context end with it.
            tracer.attach(handler_call_details.invocation_metadata or ())
        return await continuation(handler_call_details)
