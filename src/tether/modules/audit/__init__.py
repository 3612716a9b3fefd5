"""The audit feature module (issue 25): an event for every request kas relays to an agent.

kas makes the events and ships them to the hub in batches (``server/``); the hub stores and serves them
(``hub/``); both halves share :mod:`tether.modules.audit.protocol`.
"""
