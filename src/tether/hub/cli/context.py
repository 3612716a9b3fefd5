"""The ``tether hub`` group's options, kept free of heavy imports so ``tether`` starts fast."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from tether.hub.config import HubConfig


@dataclass
class HubContext:
    """The group's options, stored in ``click.Context.obj``.

    Attributes:
        config_file: ``--config``; None for defaults and environment only.
        overrides: dotted field -> value from the group's options.
    """

    config_file: Path | None
    overrides: dict[str, Any]

    def config(self, **extra: Any) -> HubConfig:
        """Load the configuration with the group's and ``extra`` overrides.

        Raises:
            click.ClickException: the configuration is invalid.
        """
        from tether.hub.config import ConfigError, load_config  # noqa: PLC0415 - keeps `tether` start-up fast

        try:
            return load_config(self.config_file, overrides={**self.overrides, **extra})
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc


pass_hub = click.make_pass_decorator(HubContext)
