pytest_plugins = [
    "tests.fixtures.secrets_in_logs",
    "tests.fixtures.servers",
    "tests.fixtures.k8s",
    "tests.fixtures.system",
    "tests.fixtures.hub",
]
