"""Small protocol tools shared by kas, agentk and the hub."""
