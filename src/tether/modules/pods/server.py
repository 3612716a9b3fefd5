"""kas half of the seed's example agent API: ``Pods.GetPods`` on the api listener, answered by the agent.

The hub calls ``GetPods`` on kas' api listener with the agent id in the request; kas calls the same method on
that agent through ``ServerApi.agent_conn`` (seed 001 "High level schema": kas finds a tunnel of the agent on
whichever kas holds one) and returns the agent's answer.
"""

from __future__ import annotations

import grpc
from grpc import aio

from tether.modserver.agent_conn import AgentCallError, AgentMethod, unary
from tether.modserver.api import ServerApi
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2, rpc_pb2_grpc
from tether.tool.logs import REQUEST_ID_METADATA, bind, new_request_id

__all__ = ["GET_PODS", "PodsServerFactory", "PodsServicer"]

#: ``GetPods`` as agentk serves it.
GET_PODS = AgentMethod("/gitlab.agent.pods.rpc.Pods/GetPods", rpc_pb2.GetPodsRequest, rpc_pb2.GetPodsResponse)


class PodsServicer(rpc_pb2_grpc.PodsServicer):
    """``Pods`` on kas' api listener: each call goes to the agent it names.

    Args:
        api: kas' module API (its ``agent_conn``).
    """

    def __init__(self, api: ServerApi) -> None:
        self._api = api

    async def GetPods(
        self,
        request: rpc_pb2.GetPodsRequest,
        context: aio.ServicerContext[rpc_pb2.GetPodsRequest, rpc_pb2.GetPodsResponse],
    ) -> rpc_pb2.GetPodsResponse:
        """The pods of agent ``request.agent_id``'s cluster, as the agent lists them.

        Each call is recorded in ``ServerApi.audit`` (kind "grpc"; issue 25 item 1). The caller's deadline bounds
        the whole call (and the wait for the agent); its metadata, with a request
        id added when it has none, travels to agentk.

        Raises:
            grpc.aio.AbortError: via ``context.abort``: INVALID_ARGUMENT for an agent id that is not positive;
                DEADLINE_EXCEEDED when no path to the agent was found in time; UNAVAILABLE when the path broke;
                the agent's own status when it failed.
        """
        if request.agent_id <= 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "GetPodsRequest.agent_id must be positive")
        metadata = tuple(context.invocation_metadata() or ())
        request_id = next((value for key, value in metadata if key == REQUEST_ID_METADATA), None)
        if request_id is None:
            request_id = new_request_id()
            metadata = (*metadata, (REQUEST_ID_METADATA, request_id))
        audit = self._api.audit.begin(
            "grpc", GET_PODS.full_method, GET_PODS.full_method, str(request_id), context.peer()
        )
        audit.agent_id, audit.bytes_in = request.agent_id, request.ByteSize()
        code = grpc.StatusCode.CANCELLED
        with bind(request_id=request_id, agent_id=request.agent_id):
            try:
                response = await unary(
                    self._api.agent_conn,
                    request.agent_id,
                    GET_PODS,
                    request,
                    timeout_s=context.time_remaining(),
                    metadata=metadata,
                )
                code, audit.bytes_out = grpc.StatusCode.OK, response.ByteSize()
                return response
            except AgentCallError as exc:
                code = exc.code
                await exc.abort(context)
            finally:
                audit.finish(code.value[0])


class PodsServerFactory:
    """kas half of ``pods``: ``GetPods`` on the api listener, answered by the agent named in the request."""

    name = "pods"

    def new(self, api: ServerApi) -> Module:
        """Serve ``Pods`` on the api listener."""
        rpc_pb2_grpc.add_PodsServicer_to_server(PodsServicer(api), api.api_server)
        return IdleModule(self.name)
