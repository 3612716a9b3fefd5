# The README's two commands: `make up` runs the whole system, `make test` runs the tests.
# Both bootstrap a fresh machine first (apt packages, Python environment, Kubernetes binaries).
.PHONY: up test bootstrap check lint typecheck proto proto-check pytest bench format images

# After bootstrap everything runs from the project virtual environment.
BIN := .venv/bin

up: bootstrap
	$(BIN)/tether up

test: bootstrap check pytest

bootstrap:
	@bash scripts/bootstrap.sh

check: lint typecheck proto-check

lint:
	$(BIN)/ruff check src devenv tests scripts bench
	$(BIN)/ruff format --check src devenv tests scripts bench

format:
	$(BIN)/ruff check --fix src devenv tests scripts bench
	$(BIN)/ruff format src devenv tests scripts bench

typecheck:
	$(BIN)/mypy

proto:
	$(BIN)/python scripts/protogen.py

proto-check:
	$(BIN)/python scripts/protogen.py --check

# Two workers (the CI machine's cores): most tests wait on servers, not the CPU. tests/conftest.py says what runs
# on one worker (a module; the real node and the fixed-port `tether up` tests together, first).
pytest:
	$(BIN)/pytest -p no:cacheprovider -n 2 --no-loadscope-reorder

# Container images of kas, agentk, the hub and the front proxy as OCI archives in ~/.cache/tether/images
# (reused when unchanged).
images: bootstrap
	$(BIN)/python -m tether_devenv.images
	$(BIN)/python -m tether_devenv.tools_image

bench: bootstrap
	$(BIN)/python bench/testenv.py
