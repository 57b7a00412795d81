"""Evaluate a model of any family on decision rows: metrics per question type and overall, reliability and
confusion plots; and the champion's score on a held-out split, as the promotion gate compares it.

The model answers as it would when served: its calibrated temperatures are applied. A LoRA fine-tune folder
(adapters plus head) is evaluated on top of the base it names.

    decision evaluate --model runs/export --data data/processed/vader.jsonl --slice 0:2000
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import ValidateConfig
from pipeline.data.read import RowSlice
from pipeline.data.split import split_holdout
from pipeline.data.validate import Record, validate_file
from pipeline.families import load_decision_model
from pipeline.scoring.calibration import softmax
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import detailed_metrics, metrics_by_type
from pipeline.scoring.plots import write_plots


def evaluate_model(model_dir: str | Path, data: str | Path, plots_dir: str | Path | None = None,
                   row_slice: RowSlice = RowSlice(), device: str = "cpu", progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Metrics of `model_dir` on every usable decision of `data`, and the PNG plots written to `plots_dir`."""
    validated = validate_file(data, row_slice)
    decisions, skipped, probabilities, family = score_records(model_dir, validated.records, device, progress)
    report = {
        "model": str(model_dir), "family": family, "data": str(data), "rows": validated.report.rows,
        "decisions": validated.report.decisions, "skipped": {**validated.report.skipped, **skipped},
        "metrics": metrics_by_type(decisions, probabilities), "plots": [],
    }  # fmt: skip
    if plots_dir is not None:
        options = {d.question.id: d.question.options for r in validated.records for d in r.decisions}
        report["plots"] = [str(p) for p in write_plots(decisions, probabilities, options, Path(plots_dir))]
    return report


def score_records(model_dir: str | Path, records: list[Record], device: str = "cpu", progress: bool = False
                  ) -> tuple[list[ScoredDecision], dict[str, int], list[np.ndarray], str]:  # fmt: skip
    """(decisions, skipped by reason, probabilities, family name) of `model_dir` on `records`, as served."""
    model = load_decision_model(model_dir).to(device)
    family = model.family
    examples, skipped = family.build_examples(model.loaded, records)
    decisions, logits = family.score(model.loaded, examples, torch.device(device), 64, progress)
    temperatures = family.served_temperatures(model.loaded, decisions)
    return decisions, skipped, [softmax(z, t) for z, t in zip(logits, temperatures)], family.name


def score_heldout(model_dir: str | Path, data: str | Path, split_config: ValidateConfig,
                  device: str = "cpu") -> dict[str, Any]:  # fmt: skip
    """Metrics of `model_dir` (its own temperatures) on the held-out split of `data`: what the gate compares."""
    heldout = split_holdout(validate_file(data).records, split_config).heldout
    decisions, _, probabilities, _ = score_records(model_dir, heldout, device)
    return detailed_metrics(decisions, probabilities)
