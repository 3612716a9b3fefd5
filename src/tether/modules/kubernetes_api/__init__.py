"""Kubernetes API proxy (kas.md §5): kas serves HTTP, carries it over a tunnel, agentk calls the API server.

kas half ``server/``: ``proxy.py`` (listener), ``auth.py`` (who is calling), ``cors.py``, ``http_grpc.py``
(HTTP <-> ``grpctool.HttpRequest``/``HttpResponse`` frames), ``upgrade.py`` (raw bytes after ``101``),
``status.py`` (errors as Kubernetes ``Status``). agentk half ``agent/``: ``forward.py`` (``MakeRequest`` ->
API server) and ``upgrade.py``. Protocol glue shared by both halves ``rpc/``: ``headers.py`` and
``impersonation.py``.
"""
