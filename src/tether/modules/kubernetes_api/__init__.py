"""Kubernetes API proxy (kas.md §5): kas serves HTTP, carries it over a tunnel, agentk calls the API server.

kas half ``server/``: ``proxy.py`` (listener; ``MakeRequest`` through ``ServerApi.agent_conn``), ``auth.py``
(who is calling), ``cors.py``, ``request_head.py`` (the ``header`` frame), ``status.py`` (errors as Kubernetes
``Status``). agentk half ``agent/``: ``forward.py`` (``MakeRequest`` -> API server). Protocol glue shared by
both halves ``rpc/``: ``impersonation.py``. HTTP over gRPC itself (frames, headers, upgrades) is
``tool/http_grpc``.
"""
