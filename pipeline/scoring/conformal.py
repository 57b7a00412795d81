"""Split-conformal prediction sets per question type (the LAC score, Sadinle et al. 2019).

A decision's nonconformity is 1 - P(gold option). On the calibration half, the threshold q is the
ceil((n + 1)(1 - alpha))-th smallest score; a test decision's set is every option with P >= 1 - q. With
exchangeable decisions the set holds the gold option with probability at least 1 - alpha. Both halves take a
turn (records split by parity, as cross-fitting does), so every decision is scored once by a threshold set on
the other half. A few lines, tested against the guarantee; MAPIE and crepes wrap scikit-learn estimators,
and here the probabilities already exist.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.decisions import ScoredDecision, cross_fit_halves


def conformal_threshold(scores: np.ndarray, alpha: float) -> float:
    """The split-conformal quantile of calibration scores (1.0, every option, when too few to reach 1 -
    alpha)."""
    n = len(scores)
    rank = math.ceil((n + 1) * (1 - alpha))
    if rank > n:
        return 1.0
    return float(np.sort(scores)[rank - 1])


def prediction_set(probabilities: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the options whose nonconformity 1 - p is within the threshold."""
    return np.flatnonzero(1.0 - np.asarray(probabilities) <= threshold + 1e-12)


def conformal_report(
    decisions: list[ScoredDecision], probabilities: list[np.ndarray], alpha: float
) -> dict[str, Any]:
    """Per question type: target coverage, achieved coverage and mean set size (and options, for scale)."""
    if not 0 < alpha < 1:
        raise ValueError(f"--conformal: alpha must be between 0 and 1 (e.g. 0.1); got {alpha}")
    report = {}
    for qtype, name in enumerate(QUESTION_TYPES):
        rows = [i for i, d in enumerate(decisions) if d.qtype == qtype]
        if rows:
            report[name] = _type_report([decisions[i] for i in rows], [probabilities[i] for i in rows], alpha)
    return {"alpha": alpha, "target_coverage": 1 - alpha, "by_type": report}


def _type_report(
    decisions: list[ScoredDecision], probabilities: list[np.ndarray], alpha: float
) -> dict[str, float]:
    scores = np.array([1.0 - float(p[d.label]) for d, p in zip(decisions, probabilities)])
    halves = cross_fit_halves(decisions)
    covered, sizes = [], []
    for calibrate_on, test_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        threshold = conformal_threshold(scores[calibrate_on], alpha)
        for i in test_on:
            chosen = prediction_set(probabilities[i], threshold)
            covered.append(decisions[i].label in chosen)
            sizes.append(len(chosen))
    return {
        "decisions": len(decisions),
        "coverage": float(np.mean(covered)) if covered else float("nan"),
        "mean_set_size": float(np.mean(sizes)) if sizes else float("nan"),
        "mean_options": float(np.mean([len(p) for p in probabilities])),
    }
