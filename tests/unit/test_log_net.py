"""The "no token in any log" net itself (tests/fixtures/secrets_in_logs.py; issue 27 item 9).

A pytest session of its own runs the net over logs that outlive a test, as the session-scoped kas hub, Redis and
the cluster do: an in-process capture and a log file, both created by a session fixture. A token written into
either during a test fails that test; what earlier tests wrote is not blamed on later ones; a token a session
fixture remembered is searched for in every test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
pytest_plugins = ["tests.fixtures.secrets_in_logs"]
"""

SESSION = '''
import logging

import pytest

from tests.fixtures.hub import LogCapture
from tests.fixtures.secrets_in_logs import remember_log, remember_secret

TOKEN = "glpat-" + "t" * 20
FIXTURE_TOKEN = "glagent-" + "f" * 40
log = logging.getLogger("shared.hub")
log.setLevel(logging.INFO)


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """A hub-like capture and a server-like log file that live for the whole session."""
    capture = LogCapture()
    log.addHandler(capture)
    remember_log(capture, "shared hub")
    remember_secret(FIXTURE_TOKEN)  # as kas_hub's administrator token: remembered outside any test
    return capture, tmp_path_factory.mktemp("shared-server") / "server.log"


def test_clean(shared):
    log.info("GET /api/v4/user 200")


def test_leak_into_the_session_capture(shared):
    remember_secret(TOKEN)
    log.info("token %s", TOKEN)


def test_leak_into_a_session_log_file(shared):
    remember_secret(TOKEN)
    with shared[1].open("a") as file:
        file.write(f"auth {TOKEN}\\n")


def test_earlier_lines_are_not_blamed_on_a_later_test(shared):
    remember_secret(TOKEN)  # in both logs already, from the tests above
    shared[0].clear()  # as the system fixture clears kas_hub's log: the net still reads by offset
    log.info("nothing secret")


def test_a_fixture_token_is_searched_in_every_test(shared):
    log.info("agent token %s", FIXTURE_TOKEN)
'''


def test_the_net_searches_logs_that_outlive_the_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_session=SESSION)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), str(ROOT / "devenv" / "src"), str(ROOT)]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, errors=3)  # a teardown error does not undo the test's pass
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leak_into_the_session_capture*",
            "E   *AssertionError: shared hub (in-process) holds a token",
            "*ERROR at teardown of test_leak_into_a_session_log_file*",
            "E   *AssertionError: */shared-server*/server.log holds a token",
            "*ERROR at teardown of test_a_fixture_token_is_searched_in_every_test*",
            "E   *AssertionError: shared hub (in-process) holds a token",
        ]
    )
