"""User-side client of the workspaces API: ``tether workspace`` (over the hub's GraphQL API)."""
