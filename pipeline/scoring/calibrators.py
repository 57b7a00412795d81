"""Calibrators chosen by cross-fitted NLL: per-type temperature, per-question temperature, or vector scaling.

A `Calibrator` maps one decision's raw option logits to probabilities. Every kind keeps one temperature per
question type (`pipeline.scoring.calibration`, with its guard); the richer kinds add a transform per question
id that had enough decisions to fit on (the validation split's):

    type_temperature       softmax(z / T_type)
    question_temperature   softmax(z / T_question)
    vector_scaling         softmax(w * z + b), one weight and bias per option (Guo et al. 2017), ridge toward
                           the identity, fitted only where a question has `VECTOR_MIN_PER_OPTION` decisions per
                           option

A question's own transform applies only to a decision of the same type and option count (a request reusing an
id for another question gets its type's temperature). The kind is chosen by the mean NLL of the gold label
with each half of the held-out records scored by the calibrator fitted on the other half, so the choice is
not made on the decisions that fitted it; the winner is then fitted on all of them. The server, the pyfunc,
the smoke test and evaluation all apply it through `Calibrator.probabilities`, from `calibrator.json`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax

from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.calibration import (
    NO_TEMPERATURES,
    Temperatures,
    fit_calibration,
    fit_temperature,
    softmax,
)
from pipeline.scoring.decisions import ScoredDecision, cross_fit_halves

TYPE_TEMPERATURE, QUESTION_TEMPERATURE, VECTOR_SCALING = (
    "type_temperature",
    "question_temperature",
    "vector_scaling",
)
KINDS = (TYPE_TEMPERATURE, QUESTION_TEMPERATURE, VECTOR_SCALING)  # simplest first: a tie keeps the simpler
MIN_QUESTION_DECISIONS = 30
VECTOR_MIN_PER_OPTION = 30
VECTOR_RIDGE = 1e-3  # added to the mean NLL: keeps w near 1 and b near 0 where the data says little
CALIBRATOR_FILE = "calibrator.json"


@dataclass(frozen=True)
class QuestionTransform:
    """One question's own transform: a temperature, or per-option weights and biases (vector scaling)."""

    qtype: int
    options: int
    temperature: float = 1.0
    weights: tuple[float, ...] | None = None
    bias: tuple[float, ...] | None = None

    def fits(self, qtype: int, n_options: int) -> bool:
        return qtype == self.qtype and n_options == self.options

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        z = np.asarray(logits, dtype=np.float64)
        if self.weights is None:
            return softmax(z, self.temperature)
        return softmax(z * np.asarray(self.weights) + np.asarray(self.bias))


@dataclass(frozen=True)
class Calibrator:
    """Type temperatures (the fallback) and the per-question transforms of the chosen kind."""

    kind: str = TYPE_TEMPERATURE
    temperatures: Temperatures = NO_TEMPERATURES
    questions: dict[str, QuestionTransform] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def probabilities(self, qtype: int, question_id: str, logits: np.ndarray) -> np.ndarray:
        own = self.questions.get(question_id)
        if own is not None and own.fits(qtype, len(logits)):
            return own.probabilities(logits)
        return softmax(logits, self.temperatures[qtype])

    def apply(self, decisions: list[ScoredDecision], logits: list[np.ndarray]) -> list[np.ndarray]:
        return [self.probabilities(d.qtype, d.question_id, z) for d, z in zip(decisions, logits)]

    def by_name(self) -> dict[str, float]:
        return dict(zip(QUESTION_TYPES, self.temperatures))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "temperatures": self.by_name(),
            "notes": self.notes,
            "questions": {
                q: {k: v for k, v in vars(t).items() if v is not None} for q, t in self.questions.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibrator:
        if data.get("kind") not in KINDS:
            raise ValueError(
                f"unknown calibrator kind {data.get('kind')!r}; expected one of {', '.join(KINDS)}"
            )
        temperatures = tuple(float(data["temperatures"].get(n, 1.0)) for n in QUESTION_TYPES)
        questions = {
            q: QuestionTransform(
                int(t["qtype"]),
                int(t["options"]),
                float(t.get("temperature", 1.0)),
                _floats(t.get("weights")),
                _floats(t.get("bias")),
            )
            for q, t in (data.get("questions") or {}).items()
        }
        return cls(data["kind"], temperatures, questions, dict(data.get("notes") or {}))  # type: ignore[arg-type]


def _floats(values) -> tuple[float, ...] | None:
    return None if values is None else tuple(float(v) for v in values)


def type_temperatures(temperatures: Temperatures) -> Calibrator:
    """The calibrator of a model that holds only type temperatures (every export before calibrator.json)."""
    return Calibrator(TYPE_TEMPERATURE, temperatures)


def as_calibrator(value: Calibrator | tuple[float, ...] | list[float]) -> Calibrator:
    """A calibrator as given, or type temperatures (choice, score, noul) as one."""
    return value if isinstance(value, Calibrator) else Calibrator(TYPE_TEMPERATURE, tuple(value))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Choice:
    """The chosen calibrator (fitted on every decision it was given) and each kind's cross-fitted mean NLL."""

    calibrator: Calibrator
    nll: dict[str, float]
    cross_fitted: list[np.ndarray]  # the winner's probabilities, each half scored by the other half's fit


def choose_calibrator(
    decisions: list[ScoredDecision],
    logits: list[np.ndarray],
    soft: bool = False,
    kinds: tuple[str, ...] = KINDS,
) -> Choice:
    """Of `kinds`, the kind with the lowest cross-fitted NLL, refitted on all decisions; kinds that cannot fit
    are left out (type temperatures then, which always fit)."""
    if not decisions:
        return Choice(Calibrator(notes={"chosen": "no decisions to fit on: T = 1"}), {}, [])
    kept = _kept_types(decisions, logits, soft)
    scored = {}
    for kind in [k for k in KINDS if k in kinds] or [TYPE_TEMPERATURE]:
        probabilities = cross_fitted_probabilities(kind, decisions, logits, soft, kept)
        if probabilities is not None:
            scored[kind] = (mean_nll(decisions, probabilities), probabilities)
    if not scored:  # none of `kinds` adds anything over type temperatures here
        probabilities = cross_fitted_probabilities(TYPE_TEMPERATURE, decisions, logits, soft, kept)
        scored[TYPE_TEMPERATURE] = (mean_nll(decisions, probabilities), probabilities)
    best = min(scored, key=lambda kind: (round(scored[kind][0], 6), KINDS.index(kind)))
    calibrator = fit_calibrator(best, decisions, logits, soft, kept)
    notes = {
        **calibrator.notes,
        "chosen": f"{best}: lowest cross-fitted NLL among "
        + ", ".join(f"{k} {v[0]:.4f}" for k, v in scored.items()),
    }
    calibrator = Calibrator(calibrator.kind, calibrator.temperatures, calibrator.questions, notes)
    return Choice(calibrator, {k: v[0] for k, v in scored.items()}, scored[best][1])


def mean_nll(decisions: list[ScoredDecision], probabilities: list[np.ndarray]) -> float:
    """Mean negative log-likelihood of the gold label."""
    return float(
        np.mean([-math.log(max(float(p[d.label]), 1e-12)) for d, p in zip(decisions, probabilities)])
    )


def _kept_types(decisions: list[ScoredDecision], logits: list[np.ndarray], soft: bool) -> set[int]:
    """Types whose temperature the guard keeps at 1 on all decisions: every kind's fallback serves them at
    1."""
    final = fit_calibration(decisions, logits, soft)
    return {qtype for qtype, t in enumerate(final.temperatures) if t == 1.0}


def fit_calibrator(
    kind: str,
    decisions: list[ScoredDecision],
    logits: list[np.ndarray],
    soft: bool = False,
    kept: set[int] | None = None,
) -> Calibrator:
    """A calibrator of `kind` fitted on these decisions; types in `kept` keep T = 1 (the guard's verdict)."""
    guarded = kept is None
    base = fit_calibration(decisions, logits, soft, guard=guarded)
    temperatures = tuple(1.0 if kept and q in kept else t for q, t in enumerate(base.temperatures))
    fit_one = {
        TYPE_TEMPERATURE: None,
        QUESTION_TEMPERATURE: _question_temperature,
        VECTOR_SCALING: _vector_scaling,
    }[kind]
    questions = {}
    if fit_one is not None:
        for qid, rows in _by_question(decisions).items():
            transform = fit_one(
                decisions[rows[0]], [logits[i] for i in rows], [_target(decisions[i], soft) for i in rows]
            )
            if transform is not None:
                questions[qid] = transform
    return Calibrator(kind, temperatures, questions, dict(base.notes))  # type: ignore[arg-type]


def _by_question(decisions: list[ScoredDecision]) -> dict[str, list[int]]:
    """Decision indices per (question id) whose type and option count agree with its first decision."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(decisions):
        groups.setdefault(d.question_id, []).append(i)
    first = {q: decisions[rows[0]] for q, rows in groups.items()}
    return {
        q: [
            i
            for i in rows
            if decisions[i].qtype == first[q].qtype and decisions[i].n_options == first[q].n_options
        ]
        for q, rows in groups.items()
    }


def _target(decision: ScoredDecision, soft: bool) -> np.ndarray:
    return (
        np.asarray(decision.target, dtype=np.float64) if soft else np.eye(decision.n_options)[decision.label]
    )


def _question_temperature(
    first: ScoredDecision, logits: list[np.ndarray], targets: list[np.ndarray]
) -> QuestionTransform | None:
    if len(logits) < MIN_QUESTION_DECISIONS:
        return None
    return QuestionTransform(first.qtype, first.n_options, fit_temperature(logits, targets))


def _vector_scaling(
    first: ScoredDecision, logits: list[np.ndarray], targets: list[np.ndarray]
) -> QuestionTransform | None:
    k = first.n_options
    if len(logits) < VECTOR_MIN_PER_OPTION * k:
        return None
    weights, bias = fit_vector_scaling(np.asarray(logits), np.asarray(targets))
    return QuestionTransform(first.qtype, k, weights=tuple(weights), bias=tuple(bias))


def fit_vector_scaling(
    logits: np.ndarray, targets: np.ndarray, ridge: float = VECTOR_RIDGE
) -> tuple[np.ndarray, np.ndarray]:
    """Per-option weights and biases minimising mean NLL + ridge * (|w - 1|^2 + |b|^2) (L-BFGS, exact
    gradient)."""
    n, k = logits.shape

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:k], theta[k:]
        log_p = log_softmax(logits * w + b, axis=1)
        residual = np.exp(log_p) - targets  # d(mean NLL)/d(scaled logits), times n
        value = -(targets * log_p).sum() / n + ridge * (((w - 1) ** 2).sum() + (b**2).sum())
        grad_w = (residual * logits).sum(0) / n + 2 * ridge * (w - 1)
        grad_b = residual.sum(0) / n + 2 * ridge * b
        return float(value), np.concatenate([grad_w, grad_b])

    start = np.concatenate([np.ones(k), np.zeros(k)])
    found = minimize(loss, start, jac=True, method="L-BFGS-B")
    return found.x[:k], found.x[k:]


def cross_fitted_probabilities(
    kind: str,
    decisions: list[ScoredDecision],
    logits: list[np.ndarray],
    soft: bool = False,
    kept: set[int] | None = None,
) -> list[np.ndarray] | None:
    """Each half of the records (by record parity) scored by a `kind` calibrator fitted on the other half;
    None when the kind would add nothing over per-type temperatures (no question has enough decisions)."""
    kept = _kept_types(decisions, logits, soft) if kept is None else kept
    halves = cross_fit_halves(decisions)
    out: list[np.ndarray | None] = [None] * len(decisions)
    added = False
    for fit_on, score_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        fitted = fit_calibrator(kind, [decisions[i] for i in fit_on], [logits[i] for i in fit_on], soft, kept)
        added |= bool(fitted.questions)
        for i in score_on:
            out[i] = fitted.probabilities(decisions[i].qtype, decisions[i].question_id, logits[i])
    if kind != TYPE_TEMPERATURE and not added:
        return None
    return out  # type: ignore[return-value]
