"""The whole kas configuration file: the shared sections plus each module's own (issue 24 item 4).

The YAML keys are upstream kascfg's and Tether's (docs/configuration.md): the modules' sections sit where
they always did (``agent.configuration``, ``agent.kubernetes_api``, ``workspaces``), but each is declared,
with its defaults, in its module's folder. A module reads its section with ``ServerApi.section``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from tether.modserver.config import AgentCF, ConfigError, KasConfigBase, load_yaml
from tether.modules.agent_configuration.config import AgentConfigurationCF
from tether.modules.audit.server.config import AuditCF
from tether.modules.kubernetes_api.server.config import KubernetesApiCF
from tether.modules.workspace_access.server.config import WorkspacesCF

__all__ = ["ConfigError", "KasAgentCF", "KasConfig", "load_config", "module_sections"]


class KasAgentCF(AgentCF):
    """The ``agent`` section: kas' own fields plus the modules' ``configuration`` and ``kubernetes_api``."""

    configuration: AgentConfigurationCF = AgentConfigurationCF()
    kubernetes_api: KubernetesApiCF | None = None


class KasConfig(KasConfigBase):
    """The whole kas configuration file."""

    agent: KasAgentCF = KasAgentCF()
    workspaces: WorkspacesCF | None = None
    audit: AuditCF = AuditCF()


def module_sections(config: KasConfig) -> dict[type[BaseModel], BaseModel | None]:
    """Each module's section by its model, for ``ServerApi.section`` (None: the section is absent)."""
    return {
        AgentConfigurationCF: config.agent.configuration,
        KubernetesApiCF: config.agent.kubernetes_api,
        WorkspacesCF: config.workspaces,
        AuditCF: config.audit,
    }


def load_config(path: Path) -> KasConfig:
    """Read and validate a kas YAML configuration file.

    Raises:
        ConfigError: with one line per problem, e.g. ``agent.listen.max_connection_age: invalid duration``.
    """
    return load_yaml(path, KasConfig)
