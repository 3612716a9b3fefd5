"""The audit feature module (issue 25 item 1): an event for every request kas relays to an agent.

kas makes the events and ships them to the hub in batches (``server/``: the sink behind ``ServerApi.audit``, the
bounded queue, the local spool and the batch shipper); the hub stores and serves them (``hub/``); both halves
share :mod:`tether.modules.audit.protocol`, the contract of the three audit branches.
"""

#: The module name (the kas configuration section).
MODULE_NAME = "audit"
