"""The hub's operations on the database, shared by the REST API, the internal API and the CLI.

Every function takes an open :class:`~sqlalchemy.ext.asyncio.AsyncSession` inside a transaction and raises
:class:`~tether.hub.errors.HubError` subclasses; the caller commits or rolls back.
"""
