pytest_plugins = [
    "tests.fixtures.secrets_in_logs",
    "tests.fixtures.servers",
    "tests.fixtures.k8s",
    "tests.fixtures.hub",
    "tests.fixtures.system",
]
