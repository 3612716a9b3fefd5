"""Audit trail (issue 25 item 1): an event for every request kas relays to an agent.

Layout as every module: ``protocol`` holds the event kas sends and the hub stores (the contract between the two
halves); ``server/`` is kas' half (the bounded queue, the local spool and the batch shipper to the hub). The hub's
half (table, REST, console) lives in the hub beside the other persisted models.
"""

#: The module name (the kas configuration section, the hub's internal path segment).
MODULE_NAME = "audit"
