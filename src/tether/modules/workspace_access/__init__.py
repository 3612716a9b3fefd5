"""Reaching a workspace (issue 13; seed 003 "User accessing the workspace") through kas and agentk.

kas serves a workspace's addresses, checks with the hub that the caller owns it, and forwards HTTP and WebSocket
through the agent's tunnels to agentk, which resolves the workspace Service's endpoints and connects.

kas half ``server/``: ``addresses.py`` (host and path forms), ``credentials.py`` (token or cookie),
``sign_in.py`` (redirect to the hub and back), ``authorizer.py`` (the hub's answer, cached, invalidated by
events), ``pages.py`` (state and error answers), ``forward.py`` (the agent call) and ``proxy.py`` (the
listener). agentk half ``agent/``: ``endpoints.py`` (Service -> EndpointSlice address) and ``forward.py``
(``WorkspaceAccess.MakeRequest``). Shared ``rpc/``: ``tokens.py`` (the sign-in JWTs kas and the hub exchange)
and ``headers.py`` (what never crosses to the workspace). The HTTP-over-gRPC framing and relay are
``tool/http_grpc`` (upstream keeps them in ``grpctool``).
"""

#: The module's name, in log lines and the module lists.
MODULE_NAME = "workspace_access"
#: The path form: ``/-/workspaces/<workspace name>/<port>/...``.
PATH_PREFIX = "/-/workspaces/"
#: Where the hub sends the browser back after sign-in, on a workspace's own origin (``-`` names no workspace).
CALLBACK_PATH = "/-/workspaces/-/callback"
#: The hub's page that signs a browser in for workspaces (``sign_in_url`` in kas' configuration).
HUB_SIGN_IN_PATH = "/-/workspaces/authorize"
#: The workspace session cookie (a JWT, ``HttpOnly``), scoped to the zone or to the path form.
SESSION_COOKIE = "_tether_workspaces"
#: The sign-in's state cookie: a nonce binding the hub's answer to the browser that asked.
STATE_COOKIE = "_tether_workspaces_state"
#: ``access_type`` of a personal access token (``Authorization: Bearer <token>``) in ``authorize_workspace_user``.
ACCESS_PAT = "personal_access_token"
#: ``access_type`` of a workspace session cookie.
ACCESS_SESSION = "workspace_session"
#: Service port of the editor in GitLab's workspaces (reference §4.2).
EDITOR_PORT = 60001
