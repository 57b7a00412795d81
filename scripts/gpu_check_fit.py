"""The GPU check's `default_fit` row: the fine-tune `make run` trains by default (params.yaml's `train`: the
joint family's head on a frozen encoder, both lexical heads kept together, precision `auto`) through the
stage's own `pipeline.training.fit`, on the GPU against the same fit on the CPU.

What a GPU user meets first is this path, not LoRA: the features are computed once on the device, each head
trains on them, and the two answer together. The CPU fit is the reference (the test suite runs it every time).
Two things are compared, on rows whose tone a word in the text gives away (`tests.tiny.write_learnable_rows`),
validated and split as the stage does:

- the base's held-out pass before any step (frozen encoder, fresh heads, no dropout: the same arithmetic on both
  devices): its logits within `FP32_LOGITS` of the CPU's (relative, as vectors) in fp32, `AUTO_LOGITS` at precision
  `auto` (a fresh head's probabilities are all near uniform, so they are compared as logits);
- what training reached: held-out accuracy within `ACCURACY_DROP` of the CPU's. The trained probabilities are not
  compared one by one: the lexical heads' dropout draws its masks from each device's own random stream, so the
  two runs take different steps from the first (the first GPU run found them 0.13 apart at most, 93% the same
  answer, on rows with random labels).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from pipeline.config import ValidateConfig, load_params
from pipeline.data.split import SplitData, TrainSource
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.metrics import heldout_metrics
from pipeline.training.fit import Trained, fit
from scripts.gpu_check_setup import Outcome, Setup, judged
from scripts.gpu_check_train import relative
from tests.tiny import write_learnable_rows

FP32_LOGITS = 1e-3
"""Largest relative difference of the base's held-out logits (before training), the GPU's fp32 pass against
the CPU's."""
AUTO_LOGITS = 0.1
"""... the GPU's `auto`-precision pass (bf16 where native: 8 bits of mantissa) against the CPU's fp32 pass."""
ACCURACY_DROP = 0.05
"""The most the GPU's trained held-out accuracy may be below the CPU's."""
ROWS = 400
"""Learnable rows: 240 train, 80 validation and 80 held-out decisions."""
STEPS = 60
"""Optimizer steps of each head."""


def split_data(setup: Setup) -> SplitData:
    """Learnable rows written under the check's folder, validated and split as the stage's validation does."""
    rows = write_learnable_rows(setup.work / "learnable.jsonl", ROWS, seed=0)
    split = ValidateConfig(holdout_fraction=0.2, validation_fraction=0.25, validation_min_decisions=10)
    return TrainSource(rows, split_config=split).validated()


def check_default_fit(setup: Setup) -> Outcome:
    """params.yaml's default fine-tune on the CPU (fp32), on the GPU in fp32 and on the GPU at precision
    `auto`."""
    defaults = load_params().train
    config = replace(
        defaults,
        max_steps=STEPS,
        min_steps=STEPS,
        warmup_steps=5,
        checkpoint_every_steps=0,
        checkpoint_every_minutes=0.0,
    )
    data = split_data(setup)
    runs = {"cpu fp32": _timed_fit(data, setup, replace(config, precision="fp32"), "cpu")}
    if setup.device.type == "cuda":
        runs["cuda fp32"] = _timed_fit(data, setup, replace(config, precision="fp32"), "cuda")
        runs["cuda auto"] = _timed_fit(data, setup, config, "cuda")
    reference = runs["cpu fp32"][0]
    reference_accuracy = _accuracy(reference)
    numbers: dict[str, Any] = {
        "config": {"family": config.family, "method": config.method, "lexicon": config.lexicon}
    }
    problems = []
    for label, (trained, seconds) in runs.items():
        figures = numbers[label] = _figures(trained, reference, reference_accuracy, seconds)
        problems += [f"{label}: {problem}" for problem in _problems(label, figures)]
    summary = "; ".join(
        f"{label}{'' if f['precision'] in label else ' (' + f['precision'] + ')'}: "
        f"{f['s_per_step'] * 1e3:.1f} ms/step, {f['seconds']:.1f} s in all, base pass vs cpu "
        f"{f['base_difference']:.1e}, trained accuracy {f['accuracy']:.3f}"
        for label, f in numbers.items()
        if label != "config"
    )
    return judged(problems, f"kept {numbers['cpu fp32']['kept']}; " + summary, numbers)


def _timed_fit(data: SplitData, setup: Setup, config, device: str) -> tuple[Trained, float]:
    started = time.perf_counter()
    trained = fit(data, setup.bases.laya, config, device)
    return trained, time.perf_counter() - started


def _accuracy(trained: Trained) -> float:
    return heldout_metrics(trained.heldout, plain_probabilities(trained.tuned_logits))["accuracy"]


def _figures(
    trained: Trained, reference: Trained, reference_accuracy: float, seconds: float
) -> dict[str, Any]:
    base, reference_base = (torch.from_numpy(np.concatenate(t.base_logits)) for t in (trained, reference))
    accuracy = _accuracy(trained)
    return {
        "kept": trained.run.choice.get("kept"),
        "precision": trained.run.precision,
        "steps": trained.run.steps,
        "s_per_step": trained.run.s_per_step,
        "seconds": seconds,
        "finite": bool(np.isfinite(np.concatenate(plain_probabilities(trained.tuned_logits))).all()),
        "base_difference": relative(base, reference_base),
        "accuracy": accuracy,
        "accuracy_below_cpu": reference_accuracy - accuracy,
    }


def _problems(label: str, figures: dict[str, Any]) -> list[str]:
    problems = [] if figures["kept"] == "ensemble" else [f"kept {figures['kept']!r}, not the ensemble"]
    if not figures["finite"]:
        problems.append("a held-out probability is not finite")
    largest = FP32_LOGITS if label.endswith("fp32") else AUTO_LOGITS
    if not figures["base_difference"] <= largest:
        problems.append(f"base pass vs cpu {figures['base_difference']:.1e} > {largest:.0e}")
    if not figures["accuracy_below_cpu"] <= ACCURACY_DROP:
        problems.append(
            f"trained accuracy {figures['accuracy_below_cpu']:.3f} below the cpu's (> {ACCURACY_DROP})"
        )
    return problems
