"""The hub's HTTP API: the GitLab-shaped REST API (``/api/v4``) and the internal API kas calls."""
