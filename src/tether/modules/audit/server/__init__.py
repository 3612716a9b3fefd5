"""kas half of ``audit``: the sink behind ``ServerApi.audit``, its queue, spool and shipper (issue 25 item 1).

Listed first in ``SERVER_MODULES`` so the modules built after it (the relays) find the sink on ``ServerApi``,
and stopped last, so the events of requests that end during shutdown still reach the spool.
"""

from __future__ import annotations

from tether.modserver.api import ServerApi
from tether.modshared.module import IdleModule, Module
from tether.modules.audit import MODULE_NAME
from tether.modules.audit.server.config import AuditCF

__all__ = ["AuditServerFactory"]


class AuditServerFactory:
    """Installs the audit sink on ``ServerApi.audit`` unless ``audit.enabled`` is false."""

    name = MODULE_NAME

    def new(self, api: ServerApi) -> Module:
        """The module shipping events (an idle one when auditing is off: relays then keep the no-op sink).

        Raises:
            OSError: the spool directory cannot be created or read (kas does not start).
        """
        config = api.section(AuditCF) or AuditCF()
        if not config.enabled:
            return IdleModule(self.name)
        from tether.modules.audit.server.module import AuditModule  # noqa: PLC0415 (only when on)

        module = AuditModule(config, api)
        api.audit = module.auditor
        return module
