"""kas half of the seed's example agent API: ``Pods.GetPods`` on the api listener, routed to the agent."""

from __future__ import annotations

from tether.modserver.agent_conn import AgentIdFromRequest
from tether.modserver.api import ServerApi
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.pods.rpc import rpc_pb2

GET_PODS = "/gitlab.agent.pods.rpc.Pods/GetPods"


def agent_id_of_get_pods(message: bytes) -> int:
    """Destination agent of a serialized ``GetPodsRequest``.

    Raises:
        ValueError: undecodable request or ``agent_id`` not positive.
    """
    try:
        request = rpc_pb2.GetPodsRequest.FromString(message)
    except Exception as exc:
        raise ValueError(f"malformed GetPodsRequest: {exc}") from exc
    if request.agent_id <= 0:
        raise ValueError("GetPodsRequest.agent_id must be positive")
    return request.agent_id


#: Methods of this module that the api listener routes to agents.
ROUTED_METHODS: dict[str, AgentIdFromRequest] = {GET_PODS: agent_id_of_get_pods}


class PodsServerFactory:
    """kas half of ``pods``: ``GetPods`` on the api listener, routed to the agent named in the request."""

    name = "pods"

    def new(self, api: ServerApi) -> Module:
        """Declare ``GetPods`` as an agent API routed from the api listener."""
        api.register_agent_api(ROUTED_METHODS)
        return IdleModule(self.name)
