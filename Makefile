# decision-pipeline: `make run` runs the main job end to end, `make test` the fast test tier, `make test-all`
# every test. Each creates (or reuses) the project virtualenv in .venv and installs what it needs first.
# Another Python (3.11-3.13): `make PYTHON=python3.12 test` (after `make clean-venv` if .venv exists).
SHELL := /bin/bash
# When make started (read once, as the Makefile is parsed): `make run` ends by saying its wall time.
MAKE_STARTED := $(shell date +%s)
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | md5sum | cut -c1-12)
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1
# Prefect keeps its database and task results in the project (resume after a crash reads them); no telemetry.
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false
# Your own run: `make run DATA=SOURCE [BASE=SOURCE] [MAPPING=FILE] [NAME=NAME]` pins DATA and BASE and writes configs/NAME.yaml
# (`decision init`), then trains it; `make run NAME=NAME` reruns it and `make serve NAME=NAME` serves its champion.
DATA ?=
BASE ?=
MAPPING ?=
NAME ?=
RUN_CONFIG ?= $(NAME)
# A value as one shell word, whatever it holds (spaces, quotes, ;): in single quotes, each ' written '\''.
quoted = '$(subst ','\'',$(1))'
# Extra pytest arguments for `make test` / `make test-all`, e.g. PYTEST_ARGS="-n 4" (pytest-xdist) on a bigger machine.
PYTEST_ARGS ?=
PORT ?= 8000
UI_PORT ?= 5000
# The store `make ui` shows: the pipeline's own (pipeline.mlops.registry reads the same variable), with artifacts
# beside the SQLite file as pipeline.mlops.registry.artifact_root puts them.
MLFLOW_TRACKING_URI ?= sqlite:///mlflow/mlflow.db
UI_ARTIFACTS ?= $(abspath $(dir $(MLFLOW_TRACKING_URI:sqlite:///%=%)))/artifacts

.PHONY: help run sweep test test-all lint bench repo data pull push serve ui browser postgres schedule clean-venv

help:  ## these targets and what each does
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: $(STAMP) repo  ## the main job: pin data and base, then the retrain flow (train, calibrate, export, register, smoke, promote)
	python -m pipeline.data.remote pull
ifeq ($(DATA),)
	dvc repro
	decision retrain $(if $(RUN_CONFIG),--run-config $(call quoted,$(RUN_CONFIG)))
else
	decision init --run --data $(call quoted,$(DATA)) $(if $(RUN_CONFIG),--name $(call quoted,$(RUN_CONFIG))) \
	  $(if $(BASE),--base $(call quoted,$(BASE))) $(if $(MAPPING),--mapping $(call quoted,$(MAPPING)))
endif
	@echo "make run: $$(( $$(date +%s) - $(MAKE_STARTED) )) s of wall time, from make's start (the install included)"

# A sweep over train.* settings (docs/sweeps.md): `make sweep [SPACE=FILE] [NAME=NAME]` on the pinned data, as `make run`
# trains it; every trial an MLflow child run, the best registered and gated as a challenger. Rerun to resume.
SPACE ?= sweeps/vader.yaml
sweep: $(STAMP) repo  ## Optuna over the settings in SPACE: trials in MLflow, the best registered through the gate
	python -m pipeline.data.remote pull
	$(if $(DATA),$(error make sweep takes NAME=NAME for your own data: run `make run DATA=...` once to pin it),dvc repro)
	decision sweep --space $(call quoted,$(SPACE)) $(if $(RUN_CONFIG),--run-config $(call quoted,$(RUN_CONFIG)))

# The fast tier deselects `full` (tests/conftest.py marks it: services, workers, torchrun ranks, Chromium).
test: $(STAMP) repo data  ## the fast tier: unit, data, model, api and one tiny flow (CPU, tiny models)
	python -m pytest -m "not full and not gpu" $(PYTEST_ARGS)

test-all: $(STAMP) repo data browser postgres  ## every test but the GPU ones (.ci/run runs this)
	python -m pytest -m "not gpu" $(PYTEST_ARGS)

serve: $(STAMP)  ## the Decision API on the champion version (follows the alias)
	decision serve $(if $(RUN_CONFIG),--run-config $(call quoted,$(RUN_CONFIG)),--model models:/decision-model@champion) --port $(PORT)

# A tracking server (MLFLOW_TRACKING_URI=http://…, e.g. on PostgreSQL) serves its own UI: open that instead.
ui: $(STAMP)  ## the MLflow UI on loopback (or the address of the tracking server's own UI)
ifneq ($(filter http://% https://%,$(MLFLOW_TRACKING_URI)),)
	@echo "MLFLOW_TRACKING_URI is a tracking server: its UI is $(MLFLOW_TRACKING_URI) (open it in a browser)."
	@python -c "import sys; from pipeline.mlops.store import check_tracking_store as c; c(sys.argv[1])" \
	  '$(MLFLOW_TRACKING_URI)'
else
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri $(MLFLOW_TRACKING_URI) \
	  --default-artifact-root $(UI_ARTIFACTS) --host 127.0.0.1 --port $(UI_PORT) --workers 1
endif

# Headless Chromium for the MLflow UI test, from Debian's package where none is on PATH; never fails the build.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  command -v apt-get >/dev/null && { apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; } || \
	  echo "No chromium (and apt-get install chromium was not possible): the MLflow UI test will be skipped."

# PostgreSQL for the `postgres` tests (tests/services.py starts its own clusters), from Debian's package where
# no initdb is found; never fails the build (those tests then skip, saying why).
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null && { apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } >/dev/null 2>&1; } || \
	  echo "No PostgreSQL (and apt-get install postgresql was not possible): the postgres tests will be skipped."

lint: $(STAMP)  ## ruff check and ruff format --check, as CI runs them
	ruff check pipeline flows tests benchmarks scripts
	ruff format --check pipeline flows tests benchmarks scripts

bench: $(STAMP) repo data  ## the benchmark scripts (each prints a table and ratios, and writes JSON)
	python benchmarks/bench_slice.py
	python benchmarks/bench_validate.py
	python benchmarks/bench_quality.py

data: $(STAMP) repo  ## build the DVC-pinned dataset where it is missing
	dvc repro dataset

# The DVC remote (`dvc remote add -d NAME URL`; docs/scale-out.md has S3 and GCS): `make run` pulls what it holds
# before `dvc repro`, so a fresh clone skips the stages whose outputs the remote has; no remote, nothing happens.
pull: $(STAMP) repo  ## the pinned dataset and base snapshot from the default DVC remote, where it has them
	python -m pipeline.data.remote pull

push: $(STAMP) repo  ## the pinned dataset and base snapshot (built by `dvc repro`) to the default DVC remote
	python -m pipeline.data.remote push

# DVC needs a git repository with one commit: a copy without one (an unpacked archive) gets a local snapshot.
repo:
	@git rev-parse --verify -q HEAD >/dev/null 2>&1 || { \
	  echo "No git commit here: making a local snapshot commit so DVC can run."; \
	  git init -q && git add -A && \
	  git -c user.name=decision-pipeline -c user.email=pipeline@localhost commit -qm "Local snapshot for DVC"; }

# The exact tested versions (constraints.txt); pyproject.toml keeps ranges. torch first, on its own: on this kind
# of machine the pin resolves to the CPU wheel on its disk, before any other package could pull a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt torch
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev,postgres,onnx,openvino]'
	@rm -f $(VENV)/.installed-* && touch $@

clean-venv:  ## remove the project virtualenv (the next target makes it again)
	rm -rf $(VENV)

# Weekly retraining on this machine, as prefect.yaml declares it. `make schedule` starts a Prefect server on
# loopback in the background unless one answers on PREFECT_PORT (log .prefect/server.log; a cron schedule needs a
# real server: the temporary API `make run` starts never fires one), deploys `retrain`, then runs a process worker
# in the foreground. Ctrl-C stops the worker (press it twice: Prefect 3.9's worker takes the first as a graceful
# stop it does not finish when idle, the second kills it); the server and its UI (http://127.0.0.1:$(PREFECT_PORT))
# keep running, for the next `make schedule`, until `make schedule-stop` (`prefect server stop`).
#
# Not `prefect server start --background`: in Prefect 3.9 it gives the server's output to a pipe nobody reads (no
# log, so a server that fails to start says nothing) and leaves it in make's process group, where the Ctrl-C meant
# for the worker stops it too. So the server runs in the foreground of its own session (setsid), its output in the
# log, and writes its pid where `--background` would (PREFECT_HOME/server.pid): `prefect server stop` stops it, and
# `prefect server status --wait` waits for it to answer.
PREFECT_PORT ?= 4200
PREFECT_POOL := local-process
.PHONY: schedule-stop

schedule: export PREFECT_API_URL := http://127.0.0.1:$(PREFECT_PORT)/api
schedule: $(STAMP) repo  ## weekly retraining: a local Prefect server, the `retrain` deployment and a process worker
	@mkdir -p $(PREFECT_HOME)
	@if prefect server status >/dev/null 2>&1; then echo "A Prefect server already answers on 127.0.0.1:$(PREFECT_PORT)."; else \
	  echo "Starting a Prefect server on 127.0.0.1:$(PREFECT_PORT) (log $(PREFECT_HOME)/server.log)."; \
	  setsid sh -c 'echo $$$$ >$(PREFECT_HOME)/server.pid; exec prefect server start --host 127.0.0.1 --port $(PREFECT_PORT)' \
	    >$(PREFECT_HOME)/server.log 2>&1 </dev/null & \
	  prefect server status --wait --timeout 60 >/dev/null || { tail -20 $(PREFECT_HOME)/server.log; \
	    echo "No healthy Prefect server after 60 s (is port $(PREFECT_PORT) taken?): see $(PREFECT_HOME)/server.log"; \
	    exit 1; }; fi
	prefect work-pool inspect $(PREFECT_POOL) >/dev/null 2>&1 || prefect work-pool create $(PREFECT_POOL) --type process
	prefect --no-prompt deploy --name retrain
	@echo "Worker on $(PREFECT_POOL): Ctrl-C twice stops it; make schedule-stop stops the server."
	exec prefect worker start --pool $(PREFECT_POOL)

schedule-stop: $(STAMP)  ## stop the Prefect server that `make schedule` started
	prefect server stop
