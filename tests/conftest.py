import os

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
