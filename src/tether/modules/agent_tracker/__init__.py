"""Connected agents: who is connected where, in Redis or memory, and the query API."""
