# The quick start is `make run` and `make test`; `make demo` walks a plan's life. Each sets up what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run demo test bench lint typecheck check clean screenshots

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Start the service on its embedded defaults: SQLite in ~/.local/share/hyperplan, the demo fleet. As root,
## tenant work runs in containers: the first run installs Podman, starts a registry on 127.0.0.1:5000 in
## the data directory (it stays up for the next run) and builds the demo's images into it; if a step
## fails, or not as root, host processes, saying why. RUNTIME=podman refuses instead of falling back;
## RUNTIME=process skips it all (hyperplan/containers/demo_runtime.py).
RUNTIME ?= auto
run: $(STAMP)
	$(BIN)/python -m hyperplan.containers.demo_runtime $(RUNTIME)

## A training plan's whole life in a minute or two: a server of its own on the demo fleet under the manual
## clock, which the walk moves; two plans bought, the HyperPod cluster of examples/hyperpod and the training
## job of examples/training-job on them, each command printed as it runs, until the plans expire; then the
## server stopped and nothing left running (hyperplan/cli/demo.py; tests/server/test_examples.py runs it).
demo: $(STAMP)
	$(BIN)/python -m hyperplan.cli.demo

## Set up and run every test, on one worker process more than the machine has cores (most tests wait on
## servers and processes, not on a core); TEST_WORKERS=0 runs them in this process. worksteal: an idle
## worker takes queued tests from a busy one, so that no slow test ends a long queue.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

## Screenshots of the console's main pages in docs/screenshots/ (the browser walkthrough, saving each page).
screenshots: $(STAMP)
	HYPERPLAN_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/console/test_browser.py

## Print speed and memory figures (no pass/fail).
bench: $(STAMP)
	$(BIN)/python -m bench

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
