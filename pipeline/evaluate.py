"""Evaluate a model on decision rows: metrics per question type and overall, reliability and confusion plots.

The model answers as it would when served: its calibrated temperatures are applied. A LoRA fine-tune folder
(adapters plus head) is evaluated on top of the base it names.

    decision evaluate --model runs/export --data data/processed/vader.jsonl --slice 0:2000
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.adapters import load_for_inference
from pipeline.forward import score_items
from pipeline.items import Item, build_items
from pipeline.metrics import metrics_by_type
from pipeline.plots import confusion_matrix, reliability_diagram
from pipeline.predict import calibrated_probabilities
from pipeline.read import RowSlice
from pipeline.validate import validate_file


def evaluate_model(model_dir: str | Path, data: str | Path, plots_dir: str | Path | None = None,
                   row_slice: RowSlice = RowSlice(), device: str = "cpu", progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Metrics of `model_dir` on every usable decision of `data`, and the PNG plots written to `plots_dir`."""
    loaded = load_for_inference(model_dir)
    validated = validate_file(data, row_slice)
    items, skipped = build_items(validated.records, loaded)
    loaded.model.to(device)
    logits = score_items(loaded.model, items, loaded.tokenizer.pad_token_id, torch.device(device), 64,
                         progress=progress, logits=True)  # fmt: skip
    probabilities = calibrated_probabilities(loaded, items, logits)
    report = {
        "model": str(model_dir), "data": str(data), "rows": validated.report.rows,
        "decisions": validated.report.decisions, "skipped": {**validated.report.skipped, **skipped},
        "metrics": metrics_by_type(items, probabilities), "plots": [],
    }  # fmt: skip
    if plots_dir is not None:
        report["plots"] = [
            str(p) for p in write_plots(validated.records, items, probabilities, Path(plots_dir))
        ]
    return report


def write_plots(records, items: list[Item], probabilities: list[np.ndarray], folder: Path) -> list[Path]:
    """The overall reliability diagram and one confusion matrix per question id."""
    written = [reliability_diagram(items, probabilities, folder / "reliability.png", "all decisions")]
    options = {d.question.id: d.question.options for r in records for d in r.decisions}
    for question_id in sorted({it.question_id for it in items}):
        chosen = [i for i, it in enumerate(items) if it.question_id == question_id]
        written.append(confusion_matrix([items[i] for i in chosen], [probabilities[i] for i in chosen],
                                        options[question_id], folder / f"confusion_{_safe(question_id)}.png",
                                        f"question {question_id}"))  # fmt: skip
    return written


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]


def score_heldout(
    model_dir: str | Path, data: str | Path, split_config, device: str = "cpu"
) -> dict[str, Any]:
    """Metrics of `model_dir` (its own temperatures) on the held-out split of `data`: what the gate compares."""
    from pipeline.metrics import detailed_metrics
    from pipeline.split import split_holdout

    loaded = load_for_inference(model_dir)
    heldout = split_holdout(validate_file(data).records, split_config).heldout
    items, _ = build_items(heldout, loaded)
    loaded.model.to(device)
    logits = score_items(
        loaded.model, items, loaded.tokenizer.pad_token_id, torch.device(device), 64, logits=True
    )
    return detailed_metrics(items, calibrated_probabilities(loaded, items, logits))
