import os
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

# Tests start servers (initdb, postgres, redis, kubectl) with fork+exec while in-process gRPC clients run; gRPC's
# fork handlers then crashed the child before exec (initdb "exited with status -11"). exec needs none of them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest_plugins = [
    "pytester",  # tests/unit/test_log_net.py runs the log net in a pytest session of its own
    "tests.fixtures.secrets_in_logs",
    "tests.fixtures.servers",
    "tests.fixtures.k8s",
    "tests.fixtures.hub",
    "tests.fixtures.system",
    "tests.fixtures.bulk_endpoint",
    "tests.fixtures.netns",
]

# `make test` runs the suite on two pytest-xdist workers (`-n 2`), handing out the work unit by unit, a unit being
# one test module (its module fixtures then start once) except for ONE_WORKER: tests/node (its package-scoped
# real-node cluster is started once) and every test running `tether up`, which listens on fixed ports (hub 8080,
# front proxy 8140, Gitaly 8075, kas 815x; tests/node/test_tether_up.py runs it too). Those must never run at the
# same time as each other, so they are one unit, run in turn by one worker.
ONE_WORKER = "real-node-and-tether-up"
_ONE_WORKER_PATHS = ("tests/node/", "tests/e2e/test_tether_up.py::", "tests/console/test_console_up.py::")


def work_unit(nodeid: str) -> str:
    """The unit of work of the test ``nodeid`` (``tests/e2e/test_x.py::test_y[z]``): ONE_WORKER or its module."""
    if nodeid.startswith(_ONE_WORKER_PATHS):
        return ONE_WORKER
    return nodeid.split("::", 1)[0]


class WorkUnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`work_unit` as the scope (xdist 3.8's ``xdist_group`` marks do not work
    with pytest 9.2, which no longer reads the node id xdist rewrites for them)."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> WorkUnitScheduling:
    """Every ``-n`` run schedules by :func:`work_unit`."""
    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the ONE_WORKER unit first: it is the longest, and meanwhile the other worker takes the rest module by
    module (``--no-loadscope-reorder`` keeps this order). Otherwise the collection order is kept."""
    items.sort(key=lambda item: work_unit(item.nodeid) != ONE_WORKER)
