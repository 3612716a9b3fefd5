"""Agent registrar: agentk registers its pod with kas every few minutes (``AgentRegistrar.Register``, kas.md §3.3).

``server`` is the kas half (writes the agent tracker entry), ``agent`` the agentk half (the registration loop);
the protocol is ``proto/gitlab/agent/agent_registrar/rpc/rpc.proto`` with upstream's names and field numbers.
"""
