"""What both halves of ``workspace_access`` and the hub share: the sign-in tokens and the header rules."""
