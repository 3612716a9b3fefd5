"""`tether up` completes its demo agent's configuration and never replaces it (issue 23 item 1).

Before, every start rewrote the configuration with `user_access` alone: a second `make up` dropped the
`remote_development` section, so workspaces were switched off again and the user's edits lost. And the
default devfile's image, which its node cannot pull, is replaced by one it has (the hub's setting).
"""

from __future__ import annotations

import pytest
import yaml

from tether.hub.config import ConfigError, load_config
from tether.modules.remote_development.hub.devfile import DEFAULT_DEVFILE, default_devfile, parse_devfile
from tether_devenv.oci import WORKSPACE_IMAGE
from tether_devenv.up import WORKSPACES_DNS_ZONE, demo_configuration


def test_a_first_start_enables_workspaces_and_user_access() -> None:
    written = demo_configuration("", "root/tether-demo")
    assert written is not None
    assert yaml.safe_load(written) == {
        "user_access": {"access_as": {"agent": {}}, "projects": [{"id": "root/tether-demo"}]},
        "remote_development": {"enabled": True, "dns_zone": WORKSPACES_DNS_ZONE},
    }


def test_a_complete_configuration_is_left_exactly_as_the_user_wrote_it() -> None:
    mine = (
        "# my notes\n"
        "user_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: root/tether-demo\n"
        "remote_development:\n  enabled: false\n  dns_zone: ws.example.com\n  partial_sync_interval: 5\n"
    )
    assert demo_configuration(mine, "root/tether-demo") is None


def test_the_configuration_of_an_earlier_tether_up_gets_workspaces_appended_with_its_text_kept() -> None:
    earlier = "# kept\nuser_access:\n  access_as:\n    agent: {}\n  projects:\n    - id: root/tether-demo\n"
    written = demo_configuration(earlier, "root/tether-demo")
    assert written is not None and written.startswith(earlier)
    assert yaml.safe_load(written)["remote_development"] == {"enabled": True, "dns_zone": WORKSPACES_DNS_ZONE}


def test_a_flow_style_mapping_is_completed_as_a_whole_document() -> None:
    written = demo_configuration("{observability: {logging: {level: debug}}}", "p/q")
    assert written is not None
    document = yaml.safe_load(written)
    assert document["observability"] == {"logging": {"level": "debug"}}
    assert set(document) == {"observability", "user_access", "remote_development"}


def test_a_file_that_is_not_a_mapping_is_left_alone() -> None:
    assert demo_configuration("- a list\n", "p/q") is None
    assert demo_configuration("key: [unclosed\n", "p/q") is None


def test_the_hub_default_devfile_takes_the_configured_image_quoted() -> None:
    config = load_config(None, environ={"TETHER_HUB_WORKSPACES_DEFAULT_DEVFILE_IMAGE": WORKSPACE_IMAGE})
    devfile = parse_devfile(config.workspaces.default_devfile)
    assert [c.image for c in devfile.containers] == [WORKSPACE_IMAGE]
    assert load_config(None, environ={}).workspaces.default_devfile == DEFAULT_DEVFILE
    assert default_devfile("") == DEFAULT_DEVFILE


def test_an_image_that_would_change_the_devfile_is_refused() -> None:
    with pytest.raises(ConfigError, match="default_devfile_image"):
        load_config(None, environ={"TETHER_HUB_WORKSPACES_DEFAULT_DEVFILE_IMAGE": "x\n    command: [evil]"})
