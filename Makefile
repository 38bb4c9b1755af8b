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

.PHONY: setup demo test lint format clean

setup: $(STAMP)

# torch first: `torch==2.13.0` is a CPU wheel available offline here; any other
# spec would pull a multi-GB CUDA build. bfcl-eval goes in with --no-deps
# because its own dependency set is ~6 GB and pins an old numpy.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev,studio]"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps bfcl-eval==2026.3.23 mpmath
	touch $(STAMP)

# The main job. `coevolve run` (the closed loop with training) is not built yet,
# so this runs every stage that exists, in order.
DEMO := runs/demo
demo: $(STAMP)
	@echo "== coevolve demo: the training loop (coevolve run) is not built yet; running the stages that exist =="
	$(VENV)/bin/coevolve env check world
	$(VENV)/bin/coevolve bootstrap
	$(VENV)/bin/coevolve eval --env world --split heldout --policy bootstrap --save $(DEMO)/heldout.jsonl
	$(VENV)/bin/coevolve eval --env world --split train --limit 128 --k 4 --temperature 0.9 \
		--policy bootstrap --save $(DEMO)/rollouts.jsonl
	$(VENV)/bin/coevolve synthesize $(DEMO)/rollouts.jsonl --store $(DEMO)/task_store --cycle 1

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

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
