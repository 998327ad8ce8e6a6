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
LINT_PATHS := src tests tools examples
# Extra pytest arguments, e.g. `make test PYTEST_ARGS='-k proxy -x'`.
PYTEST_ARGS ?=
# pytest-xdist workers for the parallel phase of the suite (0: one process). Three on two
# cores: much of the suite waits (node restarts, freezes, Spark), so a third worker fills
# that time (docs/testing.md, "Parallel and serial phases").
PYTEST_WORKERS ?= 3
# make flake-hunt: how many runs, and LOAD=1 to keep one core busy meanwhile.
N ?= 5
LOAD ?= 0

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv broker broker4 pyroots test-pyroots test-rmq4 test-spark-cluster lint types twins test flake-hunt demo demo-quick java docs docs-serve format bench bench-spark

help:
	@echo "Targets:"
	@echo "  venv     create $(VENV) and install the package with its dev extras"
	@echo "  broker   make sure a RabbitMQ broker answers at RABBITMQ_URL (starts a local one if needed)"
	@echo "  lint     ruff format --check and ruff check on $(LINT_PATHS), then the import"
	@echo "           graph of src/: no cycles, no import from a higher layer (tools/check_imports.py)"
	@echo "  types    mypy --strict on src/rabbitry and examples/orders_pipeline (pyproject.toml)"
	@echo "  twins    regenerate the forwarding members of the sync Channel and Connection"
	@echo "           from AsyncChannel and AsyncConnection (tools/gen_twins.py)"
	@echo "  test     venv + broker, then lint, types, docs and the whole pytest suite (what CI runs):"
	@echo "           PYTEST_WORKERS workers, then the serial tests alone (tools/run_pytest.py);"
	@echo "           then $(RMQ4_TESTS) again against a RabbitMQ 4.x node (RMQ4=0 skips that);"
	@echo "           then the unit and integration tests again on Debian's Pythons"
	@echo "           (PYROOTS=$(PYROOTS); PYROOTS= skips them);"
	@echo "           then the Spark kill tests on a standalone cluster (SPARK_CLUSTER=0 skips them)"
	@echo "  broker4  build (once; cached) the Debian 13 root the RabbitMQ 4.x test node runs in"
	@echo "  pyroots  build (once; cached) the Debian roots of PYROOTS=$(PYROOTS) and a venv"
	@echo "           .venv-SUITE in each (the test extra, from wheels; scripts/python-root.sh)"
	@echo "  test-pyroots  only the passes on Debian's Pythons: $(PYROOT_TESTS) with"
	@echo "           -m '$(PYROOT_MARKERS)' on each root's CPython (trixie: 3.13, sid: its newest)"
	@echo "  test-rmq4  only the RabbitMQ 4.x run: $(RMQ4_TESTS) against a node started for it"
	@echo "  test-spark-cluster  only the Spark kill tests on a standalone cluster (a master and"
	@echo "           two workers on 127.0.0.1; about 3 minutes), the last step of make test"
	@echo "  flake-hunt  the pytest part of make test (the 4.x pass unless RMQ4=0, the Spark"
	@echo "           cluster kill tests unless SPARK_CLUSTER=0) N=$(N)"
	@echo "           times on a fresh clone of HEAD, LOAD=1 with one core kept busy; lists"
	@echo "           every test that failed (tools/flake_hunt.py)"
	@echo "  demo     venv + Java check + broker, then the reference pipeline (docs/pipeline.md),"
	@echo "           examples/orders_pipeline: orders published with confirms, a Spark stream,"
	@echo "           retries, parking lot, Parquet"
	@echo "  demo-quick  venv + broker, then a 10k-message confirmed round trip (python -m rabbitry.demo)"
	@echo "  docs     check the API docstrings (tools/check_docstrings.py), then build the"
	@echo "           documentation site (mkdocs --strict) into $(DOCS_OUT)"
	@echo "  docs-serve  serve the documentation site locally at DOCS_ADDR=$(DOCS_ADDR)"
	@echo "  format   ruff format and ruff check --fix on $(LINT_PATHS)"
	@echo "  bench    peer benchmarks (bench/peers, own venv bench/peers/.venv) -> $(BENCH_OUT);"
	@echo "           e.g. make bench BENCH_ARGS='--repeats 1 --scale 0.3 --clients raw,rabbitry_async'"
	@echo "           and rewrites the generated section of $(BENCH_DOC)"
	@echo "  bench-spark  venv + Java check + broker, then rows/s written and read through"
	@echo "           format('rabbitmq') (classic queue, stream, super streams) next to rabbitry's"
	@echo "           own rate, on local[2] then a 2-worker standalone cluster; prints a table, writes"
	@echo "           no file (bench/spark_bench.py)"
	@echo "Variables: PY=$(PY)  PYTEST_ARGS=...  PYTEST_WORKERS=$(PYTEST_WORKERS)  RABBITMQ_URL=..."
	@echo "           BROKER_WAIT_SECONDS=...  N=$(N)  LOAD=$(LOAD)"
	@echo "           RMQ4=0|1  RMQ4_TESTS=...  RABBITRY_RMQ4_CACHE=... (scripts/rabbitmq4.sh)"
	@echo "           SPARK_CLUSTER=0|1  PYROOTS='$(PYROOTS)'"
	@echo "           DEMO_ARGS=... (e.g. '-n 20000 --keep'; see PYTHONPATH=examples python -m orders_pipeline -h)"
	@echo "           BENCH_ARGS=... (run_peers.py options)  BENCH_OUT=$(BENCH_OUT)"
	@echo "           SPARK_BENCH_ARGS=... (e.g. '--rows 10000'; bench/spark_bench.py -h)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

broker:
	bash scripts/ensure-broker.sh

# RabbitMQ 4.x: Debian 13's rabbitmq-server in a debootstrap root cached outside the clone
# (scripts/rabbitmq4.sh; RABBITRY_RMQ4_CACHE moves it). `pytest --rabbitmq4` starts a node
# from it on its own ports for one session and deletes it at the end.
broker4:
	bash scripts/rabbitmq4.sh build

# The suite on other Pythons than the host's: Debian's CPython in a minimal Debian root
# (scripts/python-root.sh), one venv per root in the clone (.venv-SUITE, the `test` extra
# from wheels: no Spark, no docs tools). trixie is the RabbitMQ 4.x node's root (CPython
# 3.13); sid gets a root of its own with its newest python3.X (3.15 in late 2026). The
# roots share the host's network: their tests use the shared broker on 127.0.0.1:5672.
# PYROOT_MARKERS leaves out what needs Spark and what starts nodes of its own (those
# need the host's rabbitmq-server scripts).
PYROOTS ?= trixie sid
PYROOT_TESTS ?= tests/unit tests/integration
PYROOT_MARKERS ?= not spark and not faults
# These ask the shared broker what it holds through rabbitmqctl (tests/support/broker_ctl.py):
# the root's rabbitmqctl has neither the host's Erlang cookie nor its rabbitmq user, so
# they run in the main pass only.
PYROOT_DESELECT ?= \
    tests/integration/test_consumer.py::test_exclusive_consumer_and_arguments_reach_the_broker \
    tests/integration/test_consumer.py::test_server_named_queue_is_followed_after_redeclare \
    tests/integration/test_errors.py::test_connection_closed_by_the_broker \
    tests/integration/test_field_types.py::test_broker_parses_each_letter_as_the_intended_type \
    tests/integration/test_observability.py::test_a_recovery_is_counted_with_its_duration \
    tests/integration/test_topology.py::test_diff_against_the_broker_definitions \
    tests/integration/test_topology_super_stream.py::test_diff_against_the_broker_and_delete
PYROOT_VENVS := $(foreach suite,$(PYROOTS),.venv-$(suite)/.installed)

pyroots: $(PYROOT_VENVS)

# A venv is made again when it is not of the root's newest interpreter (sid moved on).
.venv-%/.installed: pyproject.toml
	bash scripts/python-root.sh $* build
	@py=$$(bash scripts/python-root.sh $* python); \
	if [[ "$$(readlink -f .venv-$*/bin/python 2>/dev/null)" != "$$py" ]] && \
	    [[ "$$(readlink .venv-$*/bin/python 2>/dev/null)" != "$$py" ]]; then \
	    bash scripts/python-root.sh $* run "$(CURDIR)" "$$py" -m venv --clear .venv-$*; \
	fi
	bash scripts/python-root.sh $* run "$(CURDIR)" .venv-$*/bin/python -m pip install -q \
	    --only-binary ':all:' -e '.[test]'
	@touch $@

# Each root's pass, one after the other; the first non-zero status is the target's.
test-pyroots: $(PYROOT_VENVS) broker
	@status=0; \
	for suite in $(PYROOTS); do \
	    echo "== the unit and integration tests on Debian $$suite's Python:" \
	        "$$(bash scripts/python-root.sh $$suite run "$(CURDIR)" .venv-$$suite/bin/python --version 2>/dev/null || true)"; \
	    started=$$SECONDS; \
	    bash scripts/python-root.sh $$suite run "$(CURDIR)" .venv-$$suite/bin/python \
	        tools/run_pytest.py --workers $(PYTEST_WORKERS) -- -m "$(PYROOT_MARKERS)" \
	        $(addprefix --deselect ,$(PYROOT_DESELECT)) $(PYROOT_TESTS) $(PYTEST_ARGS) || { rc=$$?; [[ $$status -ne 0 ]] || status=$$rc; }; \
	    echo "== the $$suite pass took $$((SECONDS - started)) s"; \
	done; \
	exit $$status

lint: venv
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/python tools/check_imports.py src

types: venv
	$(BIN)/mypy

# The members of the sync Channel and Connection that only forward to their asyncio twins
# are generated from them (sync/_channel_forwarding.py, sync/_connection_forwarding.py);
# run this after changing one of those async members. tests/unit/test_twins_drift.py
# fails while the committed modules are out of date.
twins: venv
	$(BIN)/python tools/gen_twins.py

# Lint and types come before the brokers so a style slip fails fast, before a possibly
# slow broker install. tools/run_pytest.py runs the suite on PYTEST_WORKERS workers, then
# the tests marked serial alone; then the same for RMQ4_TESTS against a RabbitMQ 4.x node;
# then the Spark kill tests on a standalone cluster (tests/spark/test_spark_cluster.py),
# alone: their six drivers and executors start JVMs and Python workers on both cores,
# and Spark gives a Python worker a fixed 10 s to connect back to its JVM.
# Every pass always runs; the first non-zero exit code is the target's, and a run that
# tested nothing exits with pytest's "no tests collected" (5), which fails the build.
# PYTEST_ARGS reach every pass: with a -k that selects no cluster test, add SPARK_CLUSTER=0.
RMQ4 ?= 1
RMQ4_TESTS ?= tests/integration tests/spark
SPARK_CLUSTER ?= 1
SPARK_CLUSTER_TESTS := tests/spark/test_spark_cluster.py
test: venv lint types docs broker $(if $(filter 0,$(RMQ4)),,broker4) $(if $(filter 0,$(SPARK_CLUSTER)),,java) $(PYROOT_VENVS)
	@status=0; \
	$(BIN)/python tools/run_pytest.py --workers $(PYTEST_WORKERS) -- $(PYTEST_ARGS) || status=$$?; \
	if [[ "$(RMQ4)" != 0 ]]; then \
	    echo "== again against RabbitMQ 4.x: $(RMQ4_TESTS)"; \
	    $(BIN)/python tools/run_pytest.py --workers $(PYTEST_WORKERS) -- \
	        --rabbitmq4 $(RMQ4_TESTS) $(PYTEST_ARGS) || \
	        { rc=$$?; [[ $$status -ne 0 ]] || status=$$rc; }; \
	fi; \
	if [[ "$(SPARK_CLUSTER)" != 0 ]]; then \
	    echo "== the Spark kill tests on a standalone cluster: $(SPARK_CLUSTER_TESTS)"; \
	    started=$$SECONDS; \
	    $(BIN)/python -m pytest --spark-cluster -m spark_cluster --fail-on-skip \
	        $(PYTEST_ARGS) $(SPARK_CLUSTER_TESTS) || \
	        { rc=$$?; [[ $$status -ne 0 ]] || status=$$rc; }; \
	    echo "== the Spark cluster pass took $$((SECONDS - started)) s"; \
	fi; \
	if [[ -n "$(strip $(PYROOTS))" ]]; then \
	    $(MAKE) --no-print-directory test-pyroots || { rc=$$?; [[ $$status -ne 0 ]] || status=$$rc; }; \
	fi; \
	exit $$status

test-rmq4: venv broker4
	$(BIN)/python tools/run_pytest.py --workers $(PYTEST_WORKERS) -- --rabbitmq4 $(RMQ4_TESTS) $(PYTEST_ARGS)

# The last pass of make test alone.
test-spark-cluster: venv java broker
	$(BIN)/python -m pytest --spark-cluster -m spark_cluster --fail-on-skip $(PYTEST_ARGS) \
	    $(SPARK_CLUSTER_TESTS)

flake-hunt: venv $(if $(filter 0,$(RMQ4)),,broker4) $(if $(filter 0,$(SPARK_CLUSTER)),,java)
	$(BIN)/python tools/flake_hunt.py --runs $(N) --workers $(PYTEST_WORKERS) \
	    $(if $(filter 1,$(LOAD)),--load) \
	    $(if $(filter 0,$(RMQ4)),,--rabbitmq4 "$(RMQ4_TESTS)") \
	    $(if $(filter 0,$(SPARK_CLUSTER)),,--spark-cluster "$(SPARK_CLUSTER_TESTS)") -- $(PYTEST_ARGS)

# The reference pipeline, an application in examples/ (not part of the installed package):
# it is imported as `orders_pipeline` with examples/ on PYTHONPATH (an absolute path, so
# Spark's Python workers, which inherit the environment, find it too). Spark runs on the
# JVM: Java is checked before the broker is set up.
DEMO_ARGS ?=
demo: venv java broker
	PYTHONPATH="$(CURDIR)/examples$${PYTHONPATH:+:$$PYTHONPATH}" \
	    $(BIN)/python -m orders_pipeline $(DEMO_ARGS)

demo-quick: venv broker
	$(BIN)/python -m rabbitry.demo

java:
	@java_bin=java; \
	if [[ -n "$${JAVA_HOME:-}" && -x "$$JAVA_HOME/bin/java" ]]; then java_bin="$$JAVA_HOME/bin/java"; fi; \
	if ! command -v "$$java_bin" >/dev/null 2>&1; then \
	    echo "make: Spark needs a Java runtime (17 or newer) and there is none on PATH." >&2; \
	    echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2; \
	    echo "  or set JAVA_HOME to an installed JDK/JRE 17+." >&2; exit 1; \
	fi; \
	version=$$("$$java_bin" -version 2>&1 | sed -nE '1s/.*version "([0-9]+)(\.([0-9]+))?.*/\1 \3/p'); \
	major=$${version%% *}; [[ "$$major" == 1 ]] && major=$${version##* }; \
	if [[ -z "$$major" || "$$major" -lt 17 ]]; then \
	    echo "make: Spark 4 needs Java 17 or newer; '$$java_bin -version' says: $$("$$java_bin" -version 2>&1 | head -1)" >&2; \
	    echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2; exit 1; \
	fi

# The documentation site: docs/*.md plus an API reference generated from docstrings
# (mkdocstrings). First tools/check_docstrings.py: every public function and method of
# the API documents its parameters (Args), its result (Returns) and the exceptions it
# raises itself (Raises). --strict turns every warning (broken link, bad docstring) into
# an error.
DOCS_OUT ?= site
docs: venv
	$(BIN)/python tools/check_docstrings.py
	$(BIN)/mkdocs build --strict --site-dir $(DOCS_OUT)

# The documentation site with the API reference, rebuilt on every change, at
# http://127.0.0.1:8000/ (DOCS_ADDR=host:port for another address).
DOCS_ADDR ?= 127.0.0.1:8000
docs-serve: venv
	$(BIN)/mkdocs serve --dev-addr $(DOCS_ADDR)

format: venv
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

# Peer benchmarks: rabbitry next to pika, aio-pika, aiormq, py-amqp, amqpstorm, rabbitpy and
# a raw-socket limit (bench/peers/README.md). They get their own venv so the peers' pinned
# versions never enter $(VENV). Needs a broker at 127.0.0.1:5672 (BENCH_AMQP_HOST/PORT).
# Options go to run_peers.py: `make bench BENCH_ARGS='--repeats 1 --scale 0.3'`.
BENCH_VENV := bench/peers/.venv
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_OUT ?= docs/peers-results.md
# The generated section of this page (between its bench:generated markers) is rewritten.
BENCH_DOC ?= docs/benchmarks.md
BENCH_ARGS ?=

$(BENCH_STAMP): bench/peers/requirements.txt pyproject.toml
	@test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q -r bench/peers/requirements.txt -e .
	@touch $@

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/peers/run_peers.py --out $(BENCH_OUT) $(BENCH_ARGS)
	$(BENCH_VENV)/bin/python bench/bench_report.py --latest --doc $(BENCH_DOC)

# The data source's throughput next to the broker's own single-connection rate, in one
# run on local[2] (bench/spark_bench.py): it prints a Markdown table and writes no file.
# A quick run: `make bench-spark SPARK_BENCH_ARGS='--rows 10000'`.
SPARK_BENCH_ARGS ?=
bench-spark: venv java broker
	$(BIN)/python bench/spark_bench.py $(SPARK_BENCH_ARGS)

# The model-based fault test (tests/faults/test_model_based_faults.py) run for as long as
# asked, seed after seed; its figures are printed at the end. Replay a failure with the
# seed it prints: `RABBITRY_MODEL_SEED=<seed> make soak SOAK_MINUTES=1`.
SOAK_MINUTES ?= 30
.PHONY: soak
soak: venv broker
	RABBITRY_MODEL_SOAK_MINUTES=$(SOAK_MINUTES) $(BIN)/python -m pytest -p no:cacheprovider -s \
	    tests/faults/test_model_based_faults.py $(PYTEST_ARGS)
