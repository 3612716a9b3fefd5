import os
from pathlib import Path

import pytest

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

_TESTS = Path(__file__).resolve().parent
# `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). These must not run at the same
# time as each other, so they form one group that a single worker runs in turn: tests/node (its package-scoped
# real-node cluster is started once) and every test running `tether up`, which listens on fixed ports (hub 8080,
# front proxy 8140, Gitaly 8075, kas 815x; tests/node/test_tether_up.py runs it too).
ONE_WORKER = "real-node-and-tether-up"
_ONE_WORKER_PATHS = (
    _TESTS / "node",
    _TESTS / "e2e" / "test_tether_up.py",
    _TESTS / "console" / "test_console_up.py",
)


def _group(item: pytest.Item) -> str:
    path = item.path
    if any(path == place or place in path.parents for place in _ONE_WORKER_PATHS):
        return ONE_WORKER
    return str(path.relative_to(_TESTS))  # a module's tests share one worker: module fixtures start once


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group every test for ``--dist loadgroup`` (see ``ONE_WORKER``) and run the one-worker group first.

    Its group is the longest unit of work; started first, the other worker meanwhile takes the rest module by
    module (``--no-loadscope-reorder`` keeps this order). Without xdist the markers do nothing and only the order
    changes: the one-worker group runs first, otherwise the collection order is kept.
    """
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    items.sort(key=lambda item: _group(item) != ONE_WORKER)
