"""Agent configuration: the GetConfiguration stream (kas) and the configuration watcher (agentk)."""
