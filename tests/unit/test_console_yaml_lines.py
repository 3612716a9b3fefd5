"""Which line of an agent configuration a validation error points at (pure logic)."""

from __future__ import annotations

import pytest

from tether.hub.agent_config import parse_configuration
from tether.hub.console.yaml_lines import error_line
from tether.hub.errors import BadRequest

CONFIG = """\
user_access:
  access_as:
    agent: {}
  projects:
  - id: group/project
  - id: 12
observability:
  logging:
    levle: debug
"""


@pytest.mark.parametrize(
    ("field", "line"),
    [
        ("configuration.observability.logging.levle", 9),
        ("configuration.user_access.projects[1].id", 6),
        ("configuration.user_access.projects[1]", 6),
        ("configuration.userAccess.accessAs", 2),
        ("configuration.user_access.nothing_here", 1),
        ("configuration", None),
    ],
)
def test_field_paths_point_at_their_line(field: str, line: int | None) -> None:
    assert error_line(CONFIG, field) == line


def test_the_validators_own_errors_point_at_the_wrong_line() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_configuration(CONFIG)
    assert isinstance(caught.value.message, dict)
    field = next(iter(caught.value.message))
    assert error_line(CONFIG, field) in (6, 9)


def test_yaml_syntax_errors_point_at_where_the_parser_stopped() -> None:
    assert error_line("a: 1\nb: [1, 2\nc: 3\n", "configuration") == 3
    assert error_line("", "configuration") is None
