"""Held-out metrics of option probabilities against gold: accuracy, record accuracy, loss, ECE.

ECE uses 15 equal-width bins on the top-label probability with bins (lo, hi] (the first bin [0, e1]), as laya's
reference implementation does.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from pipeline.items import Item

ECE_BINS = 15


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Weighted mean |accuracy - confidence| over equal-width (lo, hi] bins of the top-label probability."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.size == 0:
        return float("nan")
    edges = np.linspace(0.0, 1.0, bins + 1)
    # (lo, hi]: a value on an edge belongs to the bin below it; 0 goes to the first bin.
    which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            total += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(total)


def heldout_metrics(items: list[Item], probabilities: list[np.ndarray]) -> dict[str, float]:
    """Accuracy per decision and per record (all of a record's decisions right), mean soft-CE loss, and ECE."""
    if not items:
        return {"decisions": 0, "accuracy": float("nan"), "record_accuracy": float("nan"), "loss": float("nan"),
                "ece": float("nan")}  # fmt: skip
    confidence = np.array([p.max() for p in probabilities])
    correct = np.array([int(p.argmax()) == it.label for it, p in zip(items, probabilities)])
    loss = np.array([-(np.asarray(it.target) * np.log(np.clip(p, 1e-12, 1.0))).sum()
                     for it, p in zip(items, probabilities)])  # fmt: skip
    by_record: dict[int, bool] = defaultdict(lambda: True)
    for item, right in zip(items, correct):
        by_record[item.record] &= bool(right)
    return {
        "decisions": len(items),
        "accuracy": float(correct.mean()),
        "record_accuracy": float(np.mean(list(by_record.values()))),
        "loss": float(loss.mean()),
        "ece": expected_calibration_error(confidence, correct),
    }
