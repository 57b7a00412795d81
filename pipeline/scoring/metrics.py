"""Held-out metrics of option probabilities against gold: accuracy, record accuracy, loss, ECE, Brier, KL,
MAE.

ECE uses 15 equal-width bins on the top-label probability with bins (lo, hi] (the first bin [0, e1]), as
laya's reference implementation does.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from pipeline.data.contract import QUESTION_TYPES, SCORE_TYPE_ID
from pipeline.scoring.decisions import ScoredDecision

ECE_BINS = 15


def ece_bin_index(confidence: np.ndarray, bins: int = ECE_BINS) -> np.ndarray:
    """The bin of each confidence among `bins` equal-width (lo, hi] bins (the first bin is [0, e1])."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    # A value on an edge belongs to the bin below it; 0 goes to the first bin.
    return np.clip(np.searchsorted(edges, np.asarray(confidence), side="left") - 1, 0, bins - 1)


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Weighted mean |accuracy - confidence| over equal-width (lo, hi] bins of the top-label probability."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.size == 0:
        return float("nan")
    which = ece_bin_index(confidence, bins)
    total = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            total += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(total)


def heldout_metrics(items: list[ScoredDecision], probabilities: list[np.ndarray]) -> dict[str, float]:
    """Accuracy per decision and per record (all of a record's decisions right), mean soft-CE loss, and
    ECE."""
    if not items:
        return {
            "decisions": 0,
            "accuracy": float("nan"),
            "record_accuracy": float("nan"),
            "loss": float("nan"),
            "ece": float("nan"),
        }
    confidence = np.array([p.max() for p in probabilities])
    correct = np.array([int(p.argmax()) == it.label for it, p in zip(items, probabilities)])
    loss = np.array(
        [
            -(np.asarray(it.target) * np.log(np.clip(p, 1e-12, 1.0))).sum()
            for it, p in zip(items, probabilities)
        ]
    )
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


def detailed_metrics(items: list[ScoredDecision], probabilities: list[np.ndarray]) -> dict[str, float]:
    """`heldout_metrics` plus Brier score, KL from the soft gold (where present) and score MAE."""
    metrics = heldout_metrics(items, probabilities)
    if not items:
        return metrics | {"brier": float("nan"), "kl_soft": float("nan"), "score_mae": float("nan")}
    brier = [float(((p - np.eye(len(p))[it.label]) ** 2).sum()) for it, p in zip(items, probabilities)]
    kl = [
        float((t * (np.log(np.clip(t, 1e-12, 1)) - np.log(np.clip(p, 1e-12, 1)))).sum())
        for it, p in zip(items, probabilities)
        if it.soft
        for t in [np.asarray(it.target)]
    ]
    mae = [
        abs(float(np.dot(np.arange(len(p)), p)) - it.label)
        for it, p in zip(items, probabilities)
        if it.qtype == SCORE_TYPE_ID
    ]
    return metrics | {
        "brier": float(np.mean(brier)),
        "kl_soft": float(np.mean(kl)) if kl else float("nan"),
        "score_mae": float(np.mean(mae)) if mae else float("nan"),
    }


def metrics_by_type(
    items: list[ScoredDecision], probabilities: list[np.ndarray]
) -> dict[str, dict[str, float]]:
    """`detailed_metrics` overall and for each question type present."""
    report = {"overall": detailed_metrics(items, probabilities)}
    for qtype, name in enumerate(QUESTION_TYPES):
        chosen = [i for i, it in enumerate(items) if it.qtype == qtype]
        if chosen:
            report[name] = detailed_metrics([items[i] for i in chosen], [probabilities[i] for i in chosen])
    return report
