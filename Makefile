# decision-pipeline: `make run` runs the main job end to end, `make test` runs the tests.
# Both create (or reuse) the project virtualenv in .venv and install what they need first.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1
# Prefect keeps its database and task results in the project (resume after a crash reads them); no telemetry.
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false
RUN_CONFIG ?=
MODEL_NAME ?= $(if $(RUN_CONFIG),decision-model-$(RUN_CONFIG),decision-model)
PORT ?= 8000
UI_PORT ?= 5000

.PHONY: run test lint bench repo data serve ui schedule clean-venv

run: $(STAMP) repo  ## the main job: pin data and base, then the retrain flow (train, calibrate, export, register, smoke, promote)
	dvc repro
	python -m flows.retrain $(if $(RUN_CONFIG),--run-config $(RUN_CONFIG))

test: $(STAMP) repo data  ## the whole default test suite (CPU, tiny models)
	python -m pytest

serve: $(STAMP)  ## the Decision API on the champion version (follows the alias)
	decision serve --model models:/$(MODEL_NAME)@champion --port $(PORT)

ui: $(STAMP)  ## the MLflow UI on loopback
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:///mlflow/mlflow.db \
	  --default-artifact-root $(CURDIR)/mlflow/artifacts --host 127.0.0.1 --port $(UI_PORT) --workers 1

lint: $(STAMP)
	ruff check pipeline flows tests benchmarks
	ruff format --check pipeline flows tests benchmarks

bench: $(STAMP) repo data  ## the benchmark scripts (each prints a table and ratios, and writes JSON)
	python benchmarks/bench_slice.py
	python benchmarks/bench_validate.py

data: $(STAMP) repo  ## build the DVC-pinned dataset where it is missing
	dvc repro dataset

# DVC needs a git repository with one commit: a copy without one (an unpacked archive) gets a local snapshot.
repo:
	@git rev-parse --verify -q HEAD >/dev/null 2>&1 || { \
	  echo "No git commit here: making a local snapshot commit so DVC can run."; \
	  git init -q && git add -A && \
	  git -c user.name=decision-pipeline -c user.email=pipeline@localhost commit -qm "Local snapshot for DVC"; }

# PyTorch is pinned to the CPU wheel on this machine's disk; a looser pin would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

clean-venv:
	rm -rf $(VENV)
