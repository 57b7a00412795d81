"""Temperature calibration, family-free: one temperature per question type, fitted on logits of decisions the
model was not trained on (the validation split) against gold.

The temperature minimises the negative log-likelihood of the gold label (one-hot by default, or the soft gold
distribution) over log T in [log 0.5, log 5] (`scipy.optimize.minimize_scalar`, bounded). A type with fewer
than `min_decisions` decisions keeps T = 1. Its guard and `cross_fitted_metrics` split the records they fit on
in two halves, each half scored with the temperatures fitted on the other, so no figure is measured on the
data that fitted it.

Temperatures have one shape everywhere: a tuple indexed by question type id (choice, score, noul); every
family writes that tuple into its own export layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.decisions import ScoredDecision, cross_fit_halves
from pipeline.scoring.metrics import detailed_metrics, expected_calibration_error
from pipeline.scoring.report import record_draws, record_index, two_sided

T_MIN, T_MAX = 0.5, 5.0
MIN_DECISIONS = 10
INTERVAL_RESAMPLES = 200
LOOSE_RATIO = 1.5  # an interval from T to 1.5 T or wider: calibrated confidence can move by a bin or more
Temperatures = tuple[float, float, float]  # by question type id: choice, score, noul
NO_TEMPERATURES: Temperatures = (1.0, 1.0, 1.0)
Stacked = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # logits, targets, weights, per option count


@dataclass(frozen=True)
class Calibration:
    """Fitted temperatures (by question type id) and a note per type on how each was decided."""

    temperatures: Temperatures
    notes: dict[str, str] = field(default_factory=dict)

    def by_name(self) -> dict[str, float]:
        """{"choice": T, "score": T, "noul": T}, as calibration.json and the MLflow metrics name them."""
        return dict(zip(QUESTION_TYPES, self.temperatures))


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def _by_width(
    logits: list[np.ndarray], targets: list[np.ndarray], weights: np.ndarray | None = None
) -> Stacked:
    """Logits, targets and weights (default 1 each) stacked into one [n, k] triple per option count, so each
    NLL is a few array operations."""
    groups: dict[int, list[int]] = {}
    for i, z in enumerate(logits):
        groups.setdefault(len(z), []).append(i)
    weights = np.ones(len(logits)) if weights is None else np.asarray(weights, dtype=np.float64)
    return [
        (
            np.asarray([logits[i] for i in rows], dtype=np.float64),
            np.asarray([targets[i] for i in rows]),
            weights[rows],
        )
        for rows in groups.values()
    ]


def _mean_nll(log_t: float, stacked: Stacked) -> float:
    t, total = math.exp(log_t), max(1.0, sum(float(w.sum()) for _, _, w in stacked))
    return -sum(float((w[:, None] * y * log_softmax(z / t, axis=1)).sum()) for z, y, w in stacked) / total


def _best_temperature(stacked: Stacked, lo: float, hi: float) -> float:
    found = minimize_scalar(
        _mean_nll,
        bounds=(math.log(lo), math.log(hi)),
        args=(stacked,),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(min(max(math.exp(found.x), lo), hi))


def fit_temperature(
    logits: list[np.ndarray], targets: list[np.ndarray], lo: float = T_MIN, hi: float = T_MAX
) -> float:
    """The temperature in [lo, hi] that minimises the mean NLL (bounded scalar search over log T)."""
    return _best_temperature(_by_width(logits, targets), lo, hi)


def temperature_interval(
    decisions: list[ScoredDecision],
    logits: list[np.ndarray],
    soft: bool = False,
    resamples: int = INTERVAL_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of the temperature `fit_temperature` fits on these decisions, drawing
    whole clusters (`ScoredDecision.cluster`: a group's rows, else a row's decisions) with replacement, so a
    split of a few groups shows how little it pins the temperature down."""
    clusters = record_index([d.cluster for d in decisions])
    draws = record_draws(clusters, resamples, np.random.default_rng(seed))
    targets = _targets(decisions, soft)
    fitted = [_best_temperature(_by_width(logits, targets, drawn[clusters]), T_MIN, T_MAX) for drawn in draws]
    return two_sided(np.asarray(fitted), level)


def temperature_spreads(
    decisions: list[ScoredDecision], logits: list[np.ndarray], soft: bool = False
) -> dict[str, dict[str, Any]]:
    """Per question type with `MIN_DECISIONS` or more: the temperature fitted on all its decisions, the 95%
    bootstrap interval (`temperature_interval`), and how many decisions and clusters it rests on."""
    spreads = {}
    for qtype, name in enumerate(QUESTION_TYPES):
        chosen = [i for i, d in enumerate(decisions) if d.qtype == qtype]
        if len(chosen) < MIN_DECISIONS:
            continue
        part = [decisions[i] for i in chosen], [logits[i] for i in chosen]
        low, high = temperature_interval(*part, soft)
        grouped = any(d.group >= 0 for d in part[0])
        spreads[name] = {
            "temperature": fit_temperature(part[1], _targets(part[0], soft)),
            "low": low,
            "high": high,
            "decisions": len(chosen),
            "drawn": "groups" if grouped else "rows",
            "clusters": len({d.cluster for d in part[0]}),
        }
    return spreads


def loose_temperatures(spreads: dict[str, dict[str, Any]], ratio: float = LOOSE_RATIO) -> str | None:
    """A line for the run's notes when a type's temperature interval spans `ratio` or more (high / low): the
    validation split is too small, or too few groups, to pin it, and the held-out confidence may be off."""
    loose = [
        f"{name} T {s['temperature']:.2f} (95% bootstrap interval {s['low']:.2f}-{s['high']:.2f}, from "
        f"{s['decisions']:,} decisions in {s['clusters']:,} {s['drawn']})"
        for name, s in spreads.items()
        if s["high"] >= ratio * s["low"]
    ]
    if not loose:
        return None
    return (
        "the validation split pins the calibrator's temperatures only loosely: " + "; ".join(loose) + ". "
        "Held-out confidence may be off by as much; more validation rows narrow it "
        "(validate.validation_fraction, validate.validation_max_decisions)."
    )


def _targets(decisions: list[ScoredDecision], soft: bool) -> list[np.ndarray]:
    return [
        np.asarray(d.target, dtype=np.float64) if soft else np.eye(d.n_options)[d.label] for d in decisions
    ]


def fit_calibration(
    decisions: list[ScoredDecision],
    logits: list[np.ndarray],
    soft: bool = False,
    min_decisions: int = MIN_DECISIONS,
    guard: bool = True,
) -> Calibration:
    """One temperature per question type from decisions the model did not train on and their raw logits.

    With `guard`, a type whose fitted temperature makes its cross-fitted ECE worse than T = 1 keeps T = 1 (and
    its note says so): calibration never makes held-out calibration worse than no calibration.
    """
    temperatures, notes = list(NO_TEMPERATURES), {}
    targets = _targets(decisions, soft)
    for qtype, name in enumerate(QUESTION_TYPES):
        chosen = [i for i, d in enumerate(decisions) if d.qtype == qtype]
        if len(chosen) < min_decisions:
            notes[name] = f"kept T=1: {len(chosen)} decisions to fit on (< {min_decisions})"
            continue
        fitted = fit_temperature([logits[i] for i in chosen], [targets[i] for i in chosen])
        hurt = (
            _cross_fitted_ece([decisions[i] for i in chosen], [logits[i] for i in chosen], soft)
            if guard
            else None
        )
        if hurt is not None and hurt[0] > hurt[1]:
            notes[name] = (
                f"kept T=1: the fitted T={fitted:.3f} made the cross-fitted ECE worse "
                f"({hurt[0]:.4f} vs {hurt[1]:.4f} at T=1)"
            )
            continue
        temperatures[qtype] = fitted
        notes[name] = f"fitted on {len(chosen)} decisions"
    return Calibration((temperatures[0], temperatures[1], temperatures[2]), notes)


def _cross_fitted_ece(
    decisions: list[ScoredDecision], logits: list[np.ndarray], soft: bool
) -> tuple[float, float] | None:
    """(ECE with each half's temperature fitted on the other half, ECE at T = 1) of one type's decisions, or
    None when a half is too small to fit on."""
    halves = cross_fit_halves(decisions)
    if min(len(h) for h in halves) < MIN_DECISIONS:
        return None
    targets = _targets(decisions, soft)
    fitted: list[np.ndarray | None] = [None] * len(decisions)
    for fit_on, score_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        t = fit_temperature([logits[i] for i in fit_on], [targets[i] for i in fit_on])
        for i in score_on:
            fitted[i] = softmax(logits[i], t)
    return _ece(decisions, fitted), _ece(decisions, plain_probabilities(logits))


def _ece(decisions: list[ScoredDecision], probabilities: list[np.ndarray]) -> float:
    confidence = np.array([p.max() for p in probabilities])
    correct = np.array([int(p.argmax()) == d.label for d, p in zip(decisions, probabilities)])
    return expected_calibration_error(confidence, correct)


def plain_probabilities(logits: list[np.ndarray]) -> list[np.ndarray]:
    """Probabilities at T = 1 (the uncalibrated model)."""
    return [softmax(z) for z in logits]


def cross_fitted_metrics(
    decisions: list[ScoredDecision],
    logits: list[np.ndarray],
    soft: bool = False,
    min_decisions: int = MIN_DECISIONS,
) -> dict[str, float]:
    """Held-out metrics after calibration, each half of the records scored with the other half's temperatures.

    A type the guard keeps at T = 1 (`fit_calibration` on all of them) is scored at T = 1, as it will be
    served.
    """
    final = fit_calibration(decisions, logits, soft, min_decisions)
    kept = {qtype for qtype, t in enumerate(final.temperatures) if t == 1.0}
    halves = cross_fit_halves(decisions)
    probabilities: list[np.ndarray | None] = [None] * len(decisions)
    for fit_on, score_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        part = ([decisions[i] for i in fit_on], [logits[i] for i in fit_on])
        fitted = fit_calibration(*part, soft, min_decisions, guard=False)
        for i in score_on:
            qtype = decisions[i].qtype
            probabilities[i] = softmax(logits[i], 1.0 if qtype in kept else fitted.temperatures[qtype])
    return detailed_metrics(decisions, probabilities)
