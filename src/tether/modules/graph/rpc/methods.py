"""The Graph API's RPC name, shared by kas (routing, descriptor check) and agentk (registration).

``/gitlab.agent.kubernetes_api.rpc.KubernetesApi/WatchGraph``, in the service the seed names ("kas to
agentk API"). Kept apart from the engine so kas can name the method without loading it.
"""

from __future__ import annotations

#: Service and method of the RPC, as in the seed's ``kas to agentk API``.
WATCH_GRAPH_SERVICE = "gitlab.agent.kubernetes_api.rpc.KubernetesApi"
WATCH_GRAPH_METHOD = "WatchGraph"
WATCH_GRAPH_FULL_METHOD = f"/{WATCH_GRAPH_SERVICE}/{WATCH_GRAPH_METHOD}"
#: Response header by which agentk confirms that it applied the request's ``impersonation`` (issue 9 item 1).
IDENTITY_HEADER = "tether-graph-identity"
IDENTITY_IMPERSONATED = "impersonated"
