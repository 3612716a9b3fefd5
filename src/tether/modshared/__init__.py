"""What kas and agentk modules share: the module lifecycle and the supervisor that runs it (upstream ``modshared``)."""
