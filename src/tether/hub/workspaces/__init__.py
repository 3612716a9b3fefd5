"""The hub half of the ``remote_development`` module.

Workspaces' persistence, user operations, the reconcile service agentk reaches through kas, and the GraphQL
API. The pure rules live in :mod:`tether.modules.remote_development`.
"""
