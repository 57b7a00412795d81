"""On a CUDA GPU (the `gpu` marker: deselected by default; `scripts/gpu_check.sh` runs these there): native
bf16 follows the compute capability, a forced compile really compiles the encoder layers on CUDA and trains,
and a bf16 training step stays close to fp32's. Skipped where torch sees no CUDA device.

Nothing here may import what the GPU machine lacks (pandera, DVC, MLflow, ...): the records come from
`tests.tiny.synthetic_records`, not from validation.
"""

import math

import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.device import has_native_bf16, resolve_precision
from pipeline.families import pick_family
from pipeline.training.loop import TrainResult, train
from tests.tiny import synthetic_records, without_dropout

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
CUDA = torch.device("cuda")


def tiny_run(base, precision: str, steps: int = 3) -> TrainResult:
    """LoRA on the tiny base on CUDA for `steps` steps (dropout off, a loss every step)."""
    config = TrainConfig(
        family="laya",
        method="lora",
        lora_r=4,
        lora_alpha=8,
        micro_batch=8,
        grad_accum=1,
        max_steps=steps,
        min_steps=steps,
        log_every=1,
        precision=precision,
        checkpoint_every_steps=0,
        checkpoint_every_minutes=0.0,
    )
    family = pick_family(base, "laya")
    loaded = family.load(base, config, CUDA)
    examples, _ = family.build_examples(loaded, synthetic_records(24, seed=0, state_chars=16))
    torch.manual_seed(config.seed)
    family.prepare(loaded, config)
    without_dropout(loaded.model)
    torch._dynamo.reset()
    return train(loaded.model, examples, config, CUDA, family.batch_task(loaded, config))


def test_native_bf16_follows_the_compute_capability():
    major, _minor = torch.cuda.get_device_capability()
    assert has_native_bf16(CUDA) == (major >= 8)
    assert resolve_precision("auto", CUDA) == (torch.bfloat16 if major >= 8 else None)


def test_a_forced_compile_compiles_the_encoder_layers_on_cuda_and_trains(tiny_base, monkeypatch):
    monkeypatch.setenv("DECISION_COMPILE", "1")
    result = tiny_run(tiny_base, "fp32")
    report = result.compile
    assert report["enabled"] and report["fallback_error"] is None, report
    assert report["graphs_compiled"] > 0 and report["recompile_limit_hits"] == 0, report
    assert result.steps == 3 and all(math.isfinite(loss) for _, loss in result.losses)


def test_a_bf16_step_stays_close_to_fp32(tiny_base, monkeypatch):
    monkeypatch.setenv("DECISION_COMPILE", "0")
    fp32, bf16 = tiny_run(tiny_base, "fp32", steps=1), tiny_run(tiny_base, "bf16", steps=1)
    assert bf16.precision == "bfloat16" and fp32.precision == "fp32"
    assert bf16.losses[0][1] == pytest.approx(fp32.losses[0][1], rel=2e-2)
