#!/usr/bin/env bash
# GPU check: one command on a machine with one CUDA GPU that prints one table (rows: scripts/gpu_check.py) and writes
# it as JSON to $GPU_CHECK_OUT (default benchmarks/results/gpu_check.json). It installs nothing from a network.
#
# Budget: the rows get 420 s (one that would start later is skipped, saying so) under a hard limit of 480 s, so the
# whole check is one command of at most 8 minutes (a lease allows 10 minutes a command and about 15 in all).
# Carries: the working tree (tracked files, ~4 MiB) and .whl/ (~45 MiB): wheels for the machine's CPython 3.12 of
# what its image lacks: laya, orjson, pydantic (with pydantic-core, annotated-types, typing-inspection), pandera
# (with typeguard, typing-inspect, mypy-extensions) and bitsandbytes (41 MiB: its CUDA libraries, the QLoRA row).
# `--fetch-wheels` downloads them here; they are installed at the start into a temporary folder on PYTHONPATH.
# Everything else comes with the image (torch, transformers, peft, numpy, pyarrow, pytest, ...). The models are
# random, built there: the real MiniLM base would not fit beside the wheels (its fp16 weights alone are 43 MiB).
#
#   bash scripts/gpu_check.sh                   # on the GPU machine; with the device tool: carry .whl and set
#                                               # GPU_CHECK_OUT=$OUT/gpu_check.json to get the JSON back
#   bash scripts/gpu_check.sh --dry-run         # every row on the CPU with tiny models, in well under a minute
#   bash scripts/gpu_check.sh --fetch-wheels    # here, where pip reaches an index: .whl/ (GPU_CHECK_WHEEL_PYTHON=3.12)
#   bash scripts/gpu_check.sh --rows laya_train,data_parallel    # other options go to scripts/gpu_check.py
set -euo pipefail
cd "$(dirname "$0")/.."
# The machine's python3 (the project's .venv where there is one); GPU_CHECK_PYTHON overrides both.
PY=${GPU_CHECK_PYTHON:-python3}
[ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
# What the machine's image lacks and the configs, the contract and the laya family import (pure Python, or
# small manylinux wheels): carried as wheels in .whl/.
CARRIED=(laya orjson pydantic pydantic_core annotated_types typing_inspection pandera typeguard typing_inspect
  mypy_extensions)
# Carried too, but optional (without it the QLoRA row is skipped, saying so), and hidden by the CPU dry run.
OPTIONAL=(bitsandbytes)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  echo
  "$PY" scripts/gpu_check.py --help
}

fetch_wheels() {
  # The versions this environment holds (the project's pins), as manylinux wheels for the GPU machine's Python.
  local specs=() name version
  for name in "${CARRIED[@]}" "${OPTIONAL[@]}"; do
    version=$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    specs+=("$name${version:+==$version}")
  done
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_CHECK_WHEEL_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${specs[@]}"
  ls -l .whl && du -sh .whl
}

install_carried() {
  # Only where one of them is missing: a development machine has them in its environment already.
  local missing=()
  for name in "${CARRIED[@]}"; do
    "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$name') is None)" || missing+=("$name")
  done
  [ ${#missing[@]} -eq 0 ] && return
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "gpu_check: ${missing[*]} missing and no wheels in .whl/ (bash scripts/gpu_check.sh --fetch-wheels, then carry .whl)" >&2
    exit 2
  fi
  local site
  site=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_site.XXXXXX")
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check: installed ${missing[*]} from .whl/ into $site"
}

limit=480
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --fetch-wheels) fetch_wheels; exit 0 ;;
    --dry-run) limit=300 ;;
  esac
done
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
install_carried
status=0
timeout --kill-after=15 "$limit" "$PY" scripts/gpu_check.py "$@" || status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "gpu_check: stopped at its ${limit} s limit; the JSON holds the rows it finished" >&2
fi
exit "$status"
