# The README's two commands: `make up` runs the whole system, `make test` runs the tests.
# Both bootstrap a fresh machine first (apt packages, Python environment, Kubernetes binaries).
.PHONY: up test bootstrap check lint typecheck proto proto-check pytest bench format

UV := uv run --frozen

up: bootstrap
	$(UV) tether up

test: bootstrap check pytest

bootstrap:
	@bash scripts/bootstrap.sh

check: lint typecheck proto-check

lint:
	$(UV) ruff check src tests scripts bench
	$(UV) ruff format --check src tests scripts bench

format:
	$(UV) ruff check --fix src tests scripts bench
	$(UV) ruff format src tests scripts bench

typecheck:
	$(UV) mypy

proto:
	$(UV) python scripts/protogen.py

proto-check:
	$(UV) python scripts/protogen.py --check

pytest:
	$(UV) pytest -p no:cacheprovider

bench: bootstrap
	$(UV) python bench/testenv.py
