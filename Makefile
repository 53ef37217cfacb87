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
	$(BIN)/pytest -q -rs --durations=30  # -rs: every skipped test with its reason; the 30 slowest

# The deep run: the scheduler's property tests on clusters up to 64 nodes and queues up to 500 jobs, thousands
# of examples, and the API fuzz test with a fresh seed each run (printed, to replay a failure).
test-deep: $(BIN)/.installed-test
	GPUYARD_TEST_DEPTH=deep $(BIN)/pytest -q tests/unit/scheduler/test_properties.py tests/fuzz

.PHONY: install demo test test-deep
