"""The running ``audit`` module: its shipping task, started with kas and ended last (``__init__.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tether.modserver.api import ServerApi
from tether.modules.audit import MODULE_NAME
from tether.modules.audit.server.auditor import MAX_BACKOFF_S, Auditor
from tether.modules.audit.server.config import AuditCF

__all__ = ["AuditModule"]

log = logging.getLogger(__name__)

#: On stop, how long kas tries to ship what is still queued before spooling it for the next start.
STOP_SHIP_TIMEOUT_S = 2.0


class AuditModule:
    """Runs :meth:`Auditor.run`; a crash of it is logged and it starts again.

    Args:
        config: the ``audit`` section.
        api: kas' module API (hub client, metrics, ``kas_instance``).
    """

    name = MODULE_NAME

    def __init__(self, config: AuditCF, api: ServerApi) -> None:
        self.auditor = Auditor(config, api.gitlab, api.kas_instance, api.metrics)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start shipping (the spool left by an earlier run goes first)."""
        self._task = asyncio.create_task(self._run(), name="audit-shipper")

    async def _run(self) -> None:
        while True:
            try:
                await self.auditor.run()
            except Exception:
                log.exception("the audit shipper failed; it starts again")
                await asyncio.sleep(MAX_BACKOFF_S)

    async def stop(self) -> None:
        """Stop the task, ship what is queued (briefly) and spool the rest."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.auditor.close(STOP_SHIP_TIMEOUT_S)
