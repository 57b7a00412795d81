"""Champion against challenger on the same held-out decisions: a paired bootstrap of the NLL difference (and of
the accuracy difference, whose interval the gate reads).

Both models answer the same decisions (matched by record and question id; a decision one of them skipped is
left out of both). The NLL gain is the champion's mean NLL minus the challenger's (positive: the challenger is
better). Records (whole groups, where the rows have a `group`) are resampled with replacement, all resamples
at once, and the gain is recomputed over each draw; its lower `confidence` quantile above zero means the
challenger is better beyond the noise of which records (or groups) happened to be held out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.report import bootstrap_means, record_draws, record_index, two_sided

RESAMPLES = 2000
# Below this many records a percentile bootstrap has too few distinct resamples to bound anything (one
# record's interval is a single point): a comparison says so rather than name a winner.
MIN_RECORDS_TO_JUDGE = 20

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
    accuracy_gain_low: float | None = None
    """The challenger's accuracy minus the champion's: the two-sided `confidence` interval of the same draws
    (None: not measured, and the gate reads the points)."""
    accuracy_gain_high: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_comparison(
    champion: Scored, challenger: Scored, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> PairedComparison:
    """The two models' NLL and accuracy on their common decisions, and the bootstrap bound on the NLL gain."""
    _, nll, right, record_of = _matched(
        champion, challenger, "champion and challenger share no held-out decision"
    )
    draws = record_draws(record_of, resamples, np.random.default_rng(seed))
    low = float(np.quantile(bootstrap_means(nll[:, 0] - nll[:, 1], record_of, draws), 1 - confidence))
    accuracy_low, accuracy_high = _interval(right[:, 1] - right[:, 0], record_of, draws, confidence)
    return PairedComparison(
        decisions=len(nll),
        champion_nll=float(nll[:, 0].mean()),
        challenger_nll=float(nll[:, 1].mean()),
        champion_accuracy=float(right[:, 0].mean()),
        challenger_accuracy=float(right[:, 1].mean()),
        nll_gain=float((nll[:, 0] - nll[:, 1]).mean()),
        nll_gain_low=low,
        confidence=confidence,
        accuracy_gain_low=accuracy_low,
        accuracy_gain_high=accuracy_high,
    )


def _matched(
    a: Scored, b: Scored, empty: str
) -> tuple[list[tuple[int, str]], np.ndarray, np.ndarray, np.ndarray]:
    """The decisions both answered (by record and question id, sorted), with [n, 2] NLLs and right-or-wrong of
    A and B, and each decision's index (0..n-1) of what the bootstrap draws: its record, or its group where
    the rows have groups (`ScoredDecision.cluster`); ValueError `empty` (+ " to compare on") when none."""
    ours, theirs = _by_key(a), _by_key(b)
    keys = sorted(ours.keys() & theirs.keys())
    if not keys:
        raise ValueError(f"{empty} to compare on")
    nll = np.array([[_nll(*ours[k]), _nll(*theirs[k])] for k in keys])
    right = np.array([[_right(*ours[k]), _right(*theirs[k])] for k in keys], dtype=float)
    return keys, nll, right, record_index([ours[k][0].cluster for k in keys])


def _by_key(scored: Scored) -> dict[tuple[int, str], tuple[ScoredDecision, np.ndarray]]:
    decisions, probabilities = scored
    return {(d.record, d.question_id): (d, p) for d, p in zip(decisions, probabilities)}


def _nll(decision: ScoredDecision, p: np.ndarray) -> float:
    return -math.log(max(float(p[decision.label]), 1e-12))


def _right(decision: ScoredDecision, p: np.ndarray) -> bool:
    return int(np.argmax(p)) == decision.label


@dataclass(frozen=True)
class QuestionDifference:
    """Two models on one question's shared decisions (or on all of them, `question` "all"): accuracy and NLL
    of each, and B minus A with a two-sided record-bootstrap interval at `confidence`."""

    question: str
    decisions: int
    accuracy_a: float
    accuracy_b: float
    accuracy_gain: float  # B - A: positive when B is right more often
    accuracy_gain_low: float
    accuracy_gain_high: float
    nll_a: float
    nll_b: float
    nll_gain: float  # A - B: positive when B is the better calibrated guess
    nll_gain_low: float
    nll_gain_high: float
    records: int = 0
    """The records the decisions come from: what the bootstrap resamples."""

    @property
    def b_less_accurate(self) -> bool:
        """B is less accurate than A beyond the bootstrap noise (the interval alone, however few the
        records)."""
        return self.accuracy_gain_high < 0

    @property
    def verdict(self) -> str:
        """Which model is better on this question beyond the bootstrap noise, in words."""
        if self.records < MIN_RECORDS_TO_JUDGE:
            return f"too few records to tell ({self.records} < {MIN_RECORDS_TO_JUDGE})"
        if self.accuracy_gain_low > 0:
            return "B more accurate"
        if self.b_less_accurate:
            return "A more accurate"
        if self.nll_gain_low > 0:
            return "B: lower NLL, accuracy level"
        if self.nll_gain_high < 0:
            return "A: lower NLL, accuracy level"
        return "no difference beyond noise"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"verdict": self.verdict}


def per_question_differences(
    a: Scored, b: Scored, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> list[QuestionDifference]:
    """A against B on the decisions both answered (matched by record and question id): one row for all of
    them, then one per question id. Records are resampled with replacement (a record's decisions move
    together), the same draws for every row."""
    keys, nll, right, record_of = _matched(a, b, "the two models share no decision")
    draws = record_draws(record_of, resamples, np.random.default_rng(seed))
    questions = np.array([k[1] for k in keys])
    rows = [("all", np.ones(len(keys), dtype=bool))] + [
        (str(q), questions == q) for q in sorted(set(questions))
    ]
    return [_difference(name, chosen, nll, right, record_of, draws, confidence) for name, chosen in rows]


def _difference(
    name: str,
    chosen: np.ndarray,
    nll: np.ndarray,
    right: np.ndarray,
    record_of: np.ndarray,
    draws: np.ndarray,
    confidence: float,
) -> QuestionDifference:
    accuracy_low, accuracy_high = _interval(
        right[chosen, 1] - right[chosen, 0], record_of[chosen], draws, confidence
    )
    nll_low, nll_high = _interval(nll[chosen, 0] - nll[chosen, 1], record_of[chosen], draws, confidence)
    return QuestionDifference(
        question=name,
        decisions=int(chosen.sum()),
        accuracy_a=float(right[chosen, 0].mean()),
        accuracy_b=float(right[chosen, 1].mean()),
        accuracy_gain=float((right[chosen, 1] - right[chosen, 0]).mean()),
        accuracy_gain_low=accuracy_low,
        accuracy_gain_high=accuracy_high,
        nll_a=float(nll[chosen, 0].mean()),
        nll_b=float(nll[chosen, 1].mean()),
        nll_gain=float((nll[chosen, 0] - nll[chosen, 1]).mean()),
        nll_gain_low=nll_low,
        nll_gain_high=nll_high,
        records=len(np.unique(record_of[chosen])),
    )


def _interval(
    gain: np.ndarray, record_of: np.ndarray, draws: np.ndarray, confidence: float
) -> tuple[float, float]:
    """The two-sided `confidence` interval of the mean gain over the record-bootstrap `draws`."""
    return two_sided(bootstrap_means(gain, record_of, draws), confidence)
