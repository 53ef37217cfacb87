# GPUYARD: `make demo` installs and runs the platform with a demo job; `make test` runs the whole suite.
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[platform]'
	touch $@

# `platform`: what `gpuyard up` and the services run on (a bare `pip install .` is the client and CLI alone).
# The tests also need the test tools, and the extras they exercise: `train` (PyTorch, for the distributed
# example), `sim` (matplotlib, for `gpuyard sim --plot`) and `serving` (ONNX Runtime).
$(BIN)/.installed-test: $(BIN)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[platform,test,train,sim,serving]'
	touch $@

install: $(BIN)/.installed

# `make demo PORT=8081 NATS_PORT=4223 SERVING_PORT=8001 MONITOR_PORT=9401` when the usual ports are taken.
# The demo's jobs run with your own rights, also as root (where `gpuyard up` itself runs each tenant's jobs as an unprivileged user: docs/executor.md).
demo: $(BIN)/.installed
	GPUYARD_JOB_USERS='*=platform' $(BIN)/gpuyard up --simulate-gpus 4 --demo $(if $(PORT),--port $(PORT)) $(if $(NATS_PORT),--nats-port $(NATS_PORT)) \
		$(if $(SERVING_PORT),--serving-port $(SERVING_PORT)) $(if $(MONITOR_PORT),--monitor-port $(MONITOR_PORT))

test: $(BIN)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tests/suite.py  # two halves side by side (integration and chaos, the rest); each says what it skipped and why

# The deep run: the scheduler's property tests on clusters up to 64 nodes and queues up to 500 jobs, thousands
# of examples, and the API fuzz test with a fresh seed each run (printed, to replay a failure).
test-deep: $(BIN)/.installed-test
	GPUYARD_TEST_DEPTH=deep $(BIN)/pytest -q tests/unit/services/scheduler/test_properties.py tests/fuzz

# The daily loop (CONTRIBUTING.md): each target runs a part of what `make test` runs, with the same venv.
# PYTEST_ARGS passes more to pytest, e.g. `make unit PYTEST_ARGS='-k events -x'`.
lint: $(BIN)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(BIN)/.installed-test
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# mypy on the product packages, as `make test` runs it (tests/unit/project/test_types.py; settings in pyproject.toml).
typecheck: $(BIN)/.installed-test
	$(BIN)/pytest -q tests/unit/project/test_types.py $(PYTEST_ARGS)

# The quick part of the suite: the unit tests, and the stores' contract tests (SQLite and the MongoDB stand-in).
unit: $(BIN)/.installed-test
	$(BIN)/pytest -q -rs tests/unit tests/contract $(PYTEST_ARGS)

# Real nats-server and real processes: the integration tests, then the chaos test (services killed under load).
integration: $(BIN)/.installed-test
	$(BIN)/pytest -q -rs tests/integration tests/chaos $(PYTEST_ARGS)

# The dashboard in Chromium (Playwright against /usr/bin/chromium, or GPUYARD_TEST_CHROMIUM; docs/dashboard.md).
browser: $(BIN)/.installed-test
	$(BIN)/pytest -q -rs tests/browser $(PYTEST_ARGS)

# The generated docs, made anew from their one definition: docs/events.md from shared/contracts/events/, the
# settings tables of docs/operations.md from shared/settings/, and the README's picture of the bus from the bus
# users' grants (shared/bus/permissions.py), the dashboard's contracts.js from the enums; a unit test fails while
# any is stale.
docs: $(BIN)/.installed-test
	$(BIN)/python -m gpuyard.docsgen.events > docs/events.md.new || { rm -f docs/events.md.new; exit 1; }
	mv docs/events.md.new docs/events.md
	$(BIN)/python -m gpuyard.docsgen.settings
	$(BIN)/python -m gpuyard.docsgen.busdiagram
	$(BIN)/python -m gpuyard.docsgen.jscontracts

# A quick look at performance, about a minute on 2 cores (docs/benchmarks.md has the full runs, their figures, and
# "A short queue, and latency below saturation" for these two): the pipeline end to end, no-op jobs over HTTP
# through a `gpuyard up --simulate-gpus 8` that each run starts on free ports and removes afterwards, first
# 1,000 jobs as fast as 8 clients can (jobs/s, CPU ms per job of each process), then 300 jobs at 20 a second
# (latency below saturation); last, the scheduler's decision speed on its smaller cases (1,000 nodes, 10,000
# waiting jobs; no trace files needed). Each prints its JSON.
bench: $(BIN)/.installed-test
	$(BIN)/python benchmarks/pipeline.py --start --jobs 1000 --concurrency 8
	$(BIN)/python benchmarks/pipeline.py --start --jobs 300 --concurrency 4 --rate 20
	$(BIN)/python benchmarks/scheduler.py --quick --only speed

.PHONY: install demo test test-deep lint fmt typecheck unit integration browser docs bench
