"""``gitlab_access``: agentk modules call the hub through kas (HTTP over gRPC; modules.md, reference §1.1).

kas half in ``server``; the agentk side's request function in ``client``. The module has no agentk module of
its own (upstream: no ``agent/``).
"""

MODULE_NAME = "gitlab_access"
