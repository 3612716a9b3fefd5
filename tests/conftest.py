pytest_plugins = ["tests.fixtures.servers", "tests.fixtures.k8s"]
