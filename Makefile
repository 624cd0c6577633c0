# kai-ray developer commands. `make test` is what CI runs (see .ci/run).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install example test lint typecheck layers unit e2e-build e2e crds bench clean image image-lock rbac-docs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)

## Run the simulator on the bundled quick-start example (no cluster needed).
example: $(STAMP)
	mkdir -p out
	$(BIN)/kai-ray simulate examples/quickstart --report out/quickstart.json --plot out/quickstart.png

## Everything CI checks: lint, types, layers, unit + scenario + e2e tests.
test: lint typecheck layers e2e-build
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check kai_ray tests bench
	$(BIN)/ruff format --check kai_ray tests bench

typecheck: $(STAMP)
	$(BIN)/mypy --strict kai_ray

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q -m "not e2e"

e2e-build:
	bash e2e/build.sh

e2e: $(STAMP) e2e-build
	$(BIN)/pytest -q -m e2e

## The operator image, an OCI layout cached outside the clone (docs/operations.md).
## Needs root; about 3 minutes from nothing, seconds when cached. tests/e2e/test_image.py
## builds it through the same cache, so `make test` pays it once per machine.
image: $(STAMP)
	bash operator/build-image.sh

## Re-pin the image's Python and Debian packages (operator/*.lock).
image-lock: $(STAMP)
	bash operator/lock.sh all

## Regenerate the RBAC table of docs/operations.md from the chart (a test fails when it drifts).
rbac-docs: $(STAMP) e2e-build
	$(BIN)/python helm/rbac_table.py

## Regenerate crds/ from the models (a test fails when they drift).
crds: $(STAMP)
	$(BIN)/kai-ray crds --output crds

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache out
