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

.PHONY: run test lint bench repo data clean-venv

run: $(STAMP) repo  ## the main job: build and pin data and base, validate, fine-tune, calibrate, export
	dvc repro
	decision validate data/processed/vader.jsonl
	decision finetune --data data/processed/vader.jsonl --base data/snapshots/minilm --out models/vader-minilm

test: $(STAMP) repo data  ## the whole default test suite (CPU, tiny models)
	python -m pytest

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
