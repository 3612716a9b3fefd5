"""The example agent API of seed 000: GetPods, served by agentk and exposed by kas."""
