pytest_plugins = [
    "tests.fixtures.servers",
    "tests.fixtures.k8s",
    "tests.fixtures.system",
    "tests.fixtures.hub",
    "tests.fixtures.secrets_in_logs",
]
