"""The hub half of ``remote_development``: the rules GitLab's Rails half applies, pure and storage-free.

``tether.hub.workspaces`` persists workspaces and runs these rules in its reconcile service and API.
"""
