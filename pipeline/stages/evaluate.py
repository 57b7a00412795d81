"""Evaluate a model on decision rows: metrics per question type and overall, reliability and confusion plots.

The model answers as it would when served: its calibrated temperatures are applied. A LoRA fine-tune folder
(adapters plus head) is evaluated on top of the base it names.

    decision evaluate --model runs/export --data data/processed/vader.jsonl --slice 0:2000
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipeline.families.laya.adapters import load_for_inference
from pipeline.families.laya.forward import score_items
from pipeline.families.laya.items import build_items
from pipeline.scoring.metrics import metrics_by_type
from pipeline.scoring.plots import write_plots
from pipeline.families.laya.predict import calibrated_probabilities
from pipeline.data.read import RowSlice
from pipeline.data.validate import validate_file


def evaluate_model(model_dir: str | Path, data: str | Path, plots_dir: str | Path | None = None,
                   row_slice: RowSlice = RowSlice(), device: str = "cpu", progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Metrics of `model_dir` on every usable decision of `data`, and the PNG plots written to `plots_dir`."""
    validated = validate_file(data, row_slice)
    items, skipped, probabilities = score_records(model_dir, validated.records, device, progress)
    report = {
        "model": str(model_dir), "data": str(data), "rows": validated.report.rows,
        "decisions": validated.report.decisions, "skipped": {**validated.report.skipped, **skipped},
        "metrics": metrics_by_type(items, probabilities), "plots": [],
    }  # fmt: skip
    if plots_dir is not None:
        report["plots"] = [
            str(p) for p in write_plots(items, probabilities, _options(validated.records), Path(plots_dir))
        ]
    return report


def _options(records) -> dict[str, tuple[str, ...]]:
    return {d.question.id: d.question.options for r in records for d in r.decisions}


def score_records(model_dir: str | Path, records, device: str = "cpu", progress: bool = False):
    """(items, skipped by reason, probabilities) of `model_dir` on `records`, its temperatures applied."""
    loaded = load_for_inference(model_dir)
    items, skipped = build_items(records, loaded)
    loaded.model.to(device)
    logits = score_items(loaded.model, items, loaded.tokenizer.pad_token_id, torch.device(device), 64,
                         progress=progress, logits=True)  # fmt: skip
    return items, skipped, calibrated_probabilities(loaded, items, logits)


def score_heldout(
    model_dir: str | Path, data: str | Path, split_config, device: str = "cpu"
) -> dict[str, Any]:
    """Metrics of `model_dir` (its own temperatures) on the held-out split of `data`: what the gate compares."""
    from pipeline.scoring.metrics import detailed_metrics
    from pipeline.data.split import split_holdout

    heldout = split_holdout(validate_file(data).records, split_config).heldout
    items, _, probabilities = score_records(model_dir, heldout, device)
    return detailed_metrics(items, probabilities)
