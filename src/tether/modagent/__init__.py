"""What agentk offers its modules (upstream ``modagent``): the module API and the internal gRPC server.

The agentk process builds these; modules import them, never the process package ``tether.agentk``.
"""
