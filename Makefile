# Developer and CI entry points. `make test` is what CI runs (see .ci/run), so it has
# to work from a fresh clone: it builds the virtualenv and makes sure a broker answers.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; pip only runs again when pyproject.toml changes.
STAMP := $(VENV)/.installed
LINT_PATHS := src tests tools
# Extra pytest arguments, e.g. `make test PYTEST_ARGS='-k proxy -x'`.
PYTEST_ARGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv broker lint types test demo format

help:
	@echo "Targets:"
	@echo "  venv     create $(VENV) and install the package with its dev extras"
	@echo "  broker   make sure a RabbitMQ broker answers at RABBITMQ_URL (starts a local one if needed)"
	@echo "  lint     ruff format --check and ruff check on $(LINT_PATHS)"
	@echo "  types    mypy (strict on src/rabbitry, configured in pyproject.toml)"
	@echo "  test     venv + broker, then lint, types and the whole pytest suite (what CI runs)"
	@echo "  demo     venv + broker, then run python -m rabbitry.demo"
	@echo "  format   ruff format and ruff check --fix on $(LINT_PATHS)"
	@echo "Variables: PY=$(PY)  PYTEST_ARGS=...  RABBITMQ_URL=...  BROKER_WAIT_SECONDS=..."

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

broker:
	bash scripts/ensure-broker.sh

lint: venv
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)

types: venv
	$(BIN)/mypy

# Lint and types come before the broker so a style slip fails fast, before a possibly
# slow broker install. pytest's exit code is passed through untouched: "no tests
# collected" (5) fails the build on purpose.
test: venv lint types broker
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: venv broker
	$(BIN)/python -m rabbitry.demo

format: venv
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)
