"""The ``agent.configuration`` section of kas' configuration (kas.md §7): how agent configurations are served."""

from __future__ import annotations

from tether.modserver.config import Section
from tether.tool.durations import Duration


class AgentConfigurationCF(Section):
    """GetConfiguration behaviour."""

    poll_period: Duration = 300.0
    max_configuration_file_size: int = 131072
