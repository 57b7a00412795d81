"""Champion against challenger on the same held-out decisions: a paired bootstrap of the NLL difference.

Both models answer the same decisions (matched by record and question id; a decision one of them skipped is
left out of both). The NLL gain is the champion's mean NLL minus the challenger's (positive: the challenger is
better). Records are resampled with replacement, all resamples at once, and the gain is recomputed over each
draw; its lower `confidence` quantile above zero means the challenger is better beyond the noise of which
records happened to be held out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline.scoring.decisions import ScoredDecision

RESAMPLES = 2000

Scored = tuple[list[ScoredDecision], list[np.ndarray]]


@dataclass(frozen=True)
class PairedComparison:
    decisions: int
    champion_nll: float
    challenger_nll: float
    champion_accuracy: float
    challenger_accuracy: float
    nll_gain: float  # champion NLL - challenger NLL: positive when the challenger is better
    nll_gain_low: float  # the gain's lower bound at `confidence` (one-sided, record bootstrap)
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_comparison(champion: Scored, challenger: Scored, confidence: float = 0.95,
                      resamples: int = RESAMPLES, seed: int = 0) -> PairedComparison:  # fmt: skip
    """The two models' NLL and accuracy on their common decisions, and the bootstrap bound on the NLL gain."""
    ours, theirs = _by_key(champion), _by_key(challenger)
    keys = sorted(ours.keys() & theirs.keys())
    if not keys:
        raise ValueError("champion and challenger share no held-out decision to compare on")
    nll = np.array([[_nll(*ours[k]), _nll(*theirs[k])] for k in keys])
    right = np.array([[_right(*ours[k]), _right(*theirs[k])] for k in keys], dtype=float)
    _, record_of = np.unique([k[0] for k in keys], return_inverse=True)
    low = _gain_bound(nll[:, 0] - nll[:, 1], record_of, confidence, resamples, seed)
    return PairedComparison(len(keys), float(nll[:, 0].mean()), float(nll[:, 1].mean()), float(right[:, 0].mean()),
                            float(right[:, 1].mean()), float((nll[:, 0] - nll[:, 1]).mean()), low, confidence)  # fmt: skip


def _by_key(scored: Scored) -> dict[tuple[int, str], tuple[ScoredDecision, np.ndarray]]:
    decisions, probabilities = scored
    return {(d.record, d.question_id): (d, p) for d, p in zip(decisions, probabilities)}


def _nll(decision: ScoredDecision, p: np.ndarray) -> float:
    return -math.log(max(float(p[decision.label]), 1e-12))


def _right(decision: ScoredDecision, p: np.ndarray) -> bool:
    return int(np.argmax(p)) == decision.label


def _gain_bound(
    gain: np.ndarray, record_of: np.ndarray, confidence: float, resamples: int, seed: int
) -> float:
    """The lower `confidence` quantile of the mean gain over record-level bootstrap draws."""
    n_records = int(record_of.max()) + 1
    summed = np.bincount(record_of, weights=gain, minlength=n_records)
    counted = np.bincount(record_of, minlength=n_records).astype(np.float64)
    draws = np.random.default_rng(seed).multinomial(
        n_records, np.full(n_records, 1 / n_records), size=resamples
    )
    means = (draws @ summed) / (draws @ counted)
    return float(np.quantile(means, 1 - confidence))
