"""Certified automation: per question, the lowest confidence threshold at which the error among the answers it
automates is at most ε with probability at least 1 - δ, and how that holds on rows it was not fitted on.

The method is Learn-then-Test (Angelopoulos et al., 2021) with fixed-sequence tests. The candidate thresholds
are a grid fixed before any label is read: the confidences at which the fit rows' n most sure answers would be
automated, for n from the fewest that can show an error below ε at all (with no error, the Clopper-Pearson bound
of n answers is 1 - δ^(1/n)) to every answer. Each threshold is tested with the one-sided Clopper-Pearson upper
bound on the error among the answers it automates. A walk goes down the grid from the surest end and stops at the
first bound above ε; since one error among the very surest answers would stop it at once, walks start at
several label-free counts (the fewest, twice that, four times, ...), each at δ over the number of walks. The
certified threshold is the lowest any walk passed. Tests in a fixed order, and a Bonferroni split between the
walks, keep the chance that the certified threshold's true error is above ε at δ or less, whatever the number
of thresholds, with no assumption but exchangeable rows. A question with too few rows, or whose bound never
falls to ε, automates nothing and says why.

    certificates = certify(decisions, probabilities, CertifyConfig())   # on the validation split
    report = automation_report(heldout, probabilities, certificates)     # coverage and error, with intervals
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import beta

from pipeline.config import CertifyConfig
from pipeline.data.contract import QUESTION_TYPES
from pipeline.scoring.decisions import ScoredDecision

GRID_STEPS = 200
"""Thresholds tested between the surest `min_decisions` answers and all of them (at most; fewer rows, fewer)."""
REPORT_CONFIDENCE = 0.95
"""The two-sided level of the intervals `automation_report` gives."""


@dataclass(frozen=True)
class Certificate:
    """One question's automation rule and the evidence for it."""

    question_id: str
    qtype: str
    target_error: float
    delta: float
    threshold: float | None
    """Automate an answer whose confidence is at least this; None: automate nothing (`reason` says why)."""
    fit_decisions: int
    """Decisions of the question the rule was fitted on (never trained on)."""
    automated: int = 0
    """Of them, how many the threshold automates ..."""
    errors: int = 0
    """... how many of those were wrong ..."""
    error_bound: float | None = None
    """... and the Clopper-Pearson upper bound on their error at 1 - δ (at most ε when certified)."""
    reason: str | None = None
    """Why nothing is automated (too few decisions, the bound never falls below ε, the type is not certified)."""
    score_error: str = "exact"
    options: tuple[str, ...] = ()
    """The question's options as certified (choice ids, score levels, false/true): a request asking the same
    question id with other options is not what was certified."""
    heldout: dict[str, Any] | None = None
    """What the rule automated on the held-out rows (`AutomationFigures` as a dict: coverage and realised error
    with 95% intervals), which `/v1/models` and the model card show."""

    @property
    def certified(self) -> bool:
        return self.threshold is not None

    @property
    def fit_coverage(self) -> float:
        """The share of the fit decisions the threshold automates."""
        return self.automated / self.fit_decisions if self.fit_decisions else 0.0

    def automates(self, confidence: float) -> bool:
        return self.threshold is not None and confidence >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Certificate:
        return cls(**values | {"options": tuple(values.get("options", ()))})

    def matches(self, qtype: str, options: tuple[str, ...]) -> bool:
        """Whether a question of this id asks what was certified: the same type and options."""
        return qtype == self.qtype and tuple(options) == self.options


def uncertified(
    decisions: list[ScoredDecision], config: CertifyConfig, reason: str
) -> dict[str, Certificate]:
    """Every question of `decisions` automating nothing, for `reason` (no rows to certify on, say)."""
    types = {d.question_id: QUESTION_TYPES[d.qtype] for d in decisions}
    certificates = {}
    for question, qtype in sorted(types.items()):
        epsilon, delta = config.for_question(question)
        certificates[question] = Certificate(
            question, qtype, epsilon, delta, None, 0, reason=reason, score_error=config.score_error
        )
    return certificates


def certificates_json(certificates: dict[str, Certificate]) -> str:
    """The certificates as the run folder and the export keep them (`certificates.json`)."""
    return json.dumps({q: c.to_dict() for q, c in sorted(certificates.items())}, indent=2, sort_keys=True)


def read_certificates(text: str | bytes | None) -> dict[str, Certificate]:
    """Certificates as `certificates_json` wrote them; none for None (a model exported before certificates)."""
    if not text:
        return {}
    return {q: Certificate.from_dict(values) for q, values in json.loads(text).items()}


def min_decisions(target_error: float, delta: float) -> int:
    """The fewest answers whose Clopper-Pearson bound can fall to ε (none of them wrong): n with
    1 - δ^(1/n) <= ε."""
    return max(1, math.ceil(math.log(delta) / math.log(1.0 - target_error)))


def error_upper_bound(errors: int, n: int, delta: float) -> float:
    """The one-sided Clopper-Pearson upper bound at 1 - δ on an error rate seen as `errors` in `n`."""
    if n == 0 or errors >= n:
        return 1.0
    return float(beta.ppf(1.0 - delta, errors + 1, n - errors))


def error_lower_bound(errors: int, n: int, delta: float) -> float:
    """The one-sided Clopper-Pearson lower bound at 1 - δ on an error rate seen as `errors` in `n`: a true
    error at or below it shows so few errors with probability at most δ (0 with no error seen)."""
    if errors == 0:
        return 0.0
    return float(beta.ppf(delta, errors, n - errors + 1))


def clopper_pearson(successes: int, n: int, confidence: float = REPORT_CONFIDENCE) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval of a rate seen as `successes` in `n` ((0, 1) when n is 0)."""
    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, n - successes + 1))
    high = 1.0 if successes == n else float(beta.ppf(1.0 - tail, successes + 1, n - successes))
    return low, high


def confidence_and_error(
    probabilities: np.ndarray, label: int, qtype: str, score_error: str = "exact"
) -> tuple[float, bool]:
    """An answer's confidence and whether it is wrong. The answer is the most probable option; its confidence is
    that option's probability (for noul, the larger of P(true) and P(false)), except a score question judged
    `off_by_more_than_one`, whose confidence is the probability within one level of the answer."""
    answer = int(np.argmax(probabilities))
    if qtype == "score" and score_error == "off_by_more_than_one":
        near = probabilities[max(0, answer - 1) : answer + 2].sum()
        return float(near), abs(answer - label) > 1
    return float(probabilities[answer]), answer != label


def fitted_answers(
    decisions: list[ScoredDecision], probabilities: list[np.ndarray], score_error: str
) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """Per question id: (its type, confidences, errors as 0/1), in decision order."""
    grouped: dict[str, tuple[str, list[float], list[bool]]] = {}
    for decision, p in zip(decisions, probabilities, strict=True):
        qtype = QUESTION_TYPES[decision.qtype]
        confidence, wrong = confidence_and_error(np.asarray(p), decision.label, qtype, score_error)
        entry = grouped.setdefault(decision.question_id, (qtype, [], []))
        entry[1].append(confidence)
        entry[2].append(wrong)
    return {q: (t, np.array(c), np.array(e, dtype=float)) for q, (t, c, e) in grouped.items()}


def certify(
    decisions: list[ScoredDecision], probabilities: list[np.ndarray], config: CertifyConfig
) -> dict[str, Certificate]:
    """Each question's certificate from calibrated answers on rows never trained on (module docstring)."""
    config.unasked({d.question_id for d in decisions})
    answers = fitted_answers(decisions, probabilities, config.score_error)
    return {
        question: certify_question(question, qtype, confidences, errors, config)
        for question, (qtype, confidences, errors) in sorted(answers.items())
    }


def certify_question(
    question: str, qtype: str, confidences: np.ndarray, errors: np.ndarray, config: CertifyConfig
) -> Certificate:
    """One question's certificate: fixed-sequence walks down the label-free grid of thresholds (module
    docstring), from several starts (`sequence_starts`), each at δ over their number."""
    epsilon, delta = config.for_question(question)
    plain = Certificate(
        question, qtype, epsilon, delta, None, len(confidences), score_error=config.score_error
    )
    if qtype not in config.types:
        return _refused(plain, f"{qtype} questions are not automated (certify.types)")
    starts = sequence_starts(epsilon, delta, len(confidences))
    if not starts:
        needed = min_decisions(epsilon, delta)
        return _refused(plain, f"too few decisions to certify: {len(confidences)}, at least {needed} needed")
    order = np.argsort(-confidences, kind="stable")
    surest, wrong_so_far = confidences[order], np.cumsum(errors[order])
    level = delta / len(starts)
    grid = threshold_grid(starts[0], len(confidences))
    passed = None
    for start in starts:
        for n in (n for n in grid if n >= start):
            tested = _tested(surest, wrong_so_far, n, level)
            if tested[3] > epsilon:
                break
            if passed is None or tested[1] > passed[1]:
                passed = tested
    if passed is None:
        return _never_below(plain, surest, wrong_so_far, starts[0], level)
    threshold, automated, wrong, bound = passed
    return Certificate(
        question,
        qtype,
        epsilon,
        delta,
        threshold,
        len(confidences),
        automated=automated,
        errors=wrong,
        error_bound=bound,
        score_error=config.score_error,
    )


def sequence_starts(epsilon: float, delta: float, total: int) -> list[int]:
    """Where the fixed-sequence walks start, as counts of the surest answers: the fewest that can certify at all
    (`min_decisions` at δ over the number of starts), then twice that, and so on while within `total` ([] where
    even one walk cannot start). A walk that meets an error among the very surest answers stops at once; the
    later starts still test the larger counts, where a few errors are within ε. Fixed by the counts alone, so
    each walk's tests stay valid."""
    starts: list[int] = []
    while True:
        count = len(starts) + 1
        first = min_decisions(epsilon, delta / count)
        more = [first * 2**j for j in range(count)]
        if more[-1] > total:
            return starts
        starts = more


def threshold_grid(first: int, total: int, steps: int = GRID_STEPS) -> list[int]:
    """How many of the surest answers each tested threshold automates, surest first: from `first` to `total`,
    at most `steps` of them (fixed by the counts alone, before any label is read)."""
    return [int(n) for n in np.unique(np.rint(np.linspace(first, total, num=min(steps, total - first + 1))))]


def _tested(
    surest: np.ndarray, wrong_so_far: np.ndarray, n: int, level: float
) -> tuple[float, int, int, float]:
    """(threshold, automated, errors, bound) of the threshold that automates the surest `n` answers (ties
    go together)."""
    threshold = float(surest[n - 1])
    automated = int(np.searchsorted(-surest, -threshold, side="right"))
    wrong = int(wrong_so_far[automated - 1])
    return threshold, automated, wrong, error_upper_bound(wrong, automated, level)


def _refused(plain: Certificate, reason: str) -> Certificate:
    return Certificate(**{**plain.to_dict(), "reason": reason})


def _never_below(
    plain: Certificate, surest: np.ndarray, wrong: np.ndarray, needed: int, level: float
) -> Certificate:
    """Refused where no tested threshold's bound fell to ε: the surest answers' errors and bound, and so how far
    there is to go."""
    errors = int(wrong[needed - 1])
    bound = error_upper_bound(errors, needed, level)
    reason = (
        f"the error bound never falls to {plain.target_error:g}: the surest {needed} answers hold {errors} "
        f"error(s), bound {bound:.3f}"
    )
    return Certificate(**{**plain.to_dict(), "errors": errors, "error_bound": bound, "reason": reason})


@dataclass(frozen=True)
class AutomationFigures:
    """What a certificate automates on rows it was not fitted on, with 95% intervals."""

    decisions: int
    automated: int
    errors: int
    coverage: float
    coverage_low: float
    coverage_high: float
    error: float | None
    """The realised error among the automated answers (None: nothing automated)."""
    error_low: float | None = None
    error_high: float | None = None
    target_error: float | None = None

    @property
    def within_target(self) -> bool | None:
        """Whether the realised error is at most ε (None: nothing automated, or no single ε)."""
        if self.error is None or self.target_error is None:
            return None
        return self.error <= self.target_error


@dataclass(frozen=True)
class AutomationReport:
    """Coverage and realised error per question and overall (`automation_report`)."""

    by_question: dict[str, AutomationFigures]
    overall: AutomationFigures
    curves: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    """Per question, the coverage-risk curve on these rows: (threshold, coverage, error among automated)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def automation_report(
    decisions: list[ScoredDecision],
    probabilities: list[np.ndarray],
    certificates: dict[str, Certificate],
    score_error: str = "exact",
    automate: np.ndarray | None = None,
) -> AutomationReport:
    """What the certificates automate on `decisions` (rows they were not fitted on: the held-out split), per
    question and overall, with the coverage-risk curve of each question. `automate` (a bool per decision) can
    veto answers the certificates would automate: the novelty gate's verdict, say."""
    answers = fitted_answers(decisions, probabilities, score_error)
    allowed = np.ones(len(decisions), dtype=bool) if automate is None else np.asarray(automate, dtype=bool)
    order = _positions(decisions)
    by_question, pooled, curves = {}, ([], []), {}
    for question, (_, confidences, errors) in sorted(answers.items()):
        certificate = certificates.get(question)
        chosen = np.array(
            [certificate is not None and certificate.automates(c) for c in confidences], dtype=bool
        )
        chosen &= allowed[order[question]]
        epsilon = certificate.target_error if certificate else None
        by_question[question] = automation_figures(chosen, errors, epsilon)
        pooled[0].append(chosen)
        pooled[1].append(errors)
        curves[question] = coverage_risk_curve(confidences, errors)
    flat = [np.concatenate(part) if part else np.zeros(0) for part in pooled]
    epsilons = {c.target_error for c in certificates.values()}
    overall = automation_figures(
        flat[0].astype(bool), flat[1], epsilons.pop() if len(epsilons) == 1 else None
    )
    return AutomationReport(by_question, overall, curves)


def _positions(decisions: list[ScoredDecision]) -> dict[str, np.ndarray]:
    """Each question's decisions' positions in `decisions`, in order."""
    positions: dict[str, list[int]] = {}
    for index, decision in enumerate(decisions):
        positions.setdefault(decision.question_id, []).append(index)
    return {question: np.array(indices) for question, indices in positions.items()}


def automation_figures(
    chosen: np.ndarray, errors: np.ndarray, target_error: float | None
) -> AutomationFigures:
    """Coverage and the error among `chosen` answers, with 95% Clopper-Pearson intervals."""
    n, automated = len(chosen), int(chosen.sum())
    wrong = int(errors[chosen].sum()) if automated else 0
    coverage_low, coverage_high = clopper_pearson(automated, n)
    error_low, error_high = clopper_pearson(wrong, automated) if automated else (None, None)
    return AutomationFigures(
        decisions=n,
        automated=automated,
        errors=wrong,
        coverage=automated / n if n else 0.0,
        coverage_low=coverage_low,
        coverage_high=coverage_high,
        error=wrong / automated if automated else None,
        error_low=error_low,
        error_high=error_high,
        target_error=target_error,
    )


def coverage_risk_curve(
    confidences: np.ndarray, errors: np.ndarray, points: int = 50
) -> list[tuple[float, float, float]]:
    """(threshold, coverage, error among automated) at `points` thresholds, surest first."""
    if len(confidences) == 0:
        return []
    order = np.argsort(-confidences, kind="stable")
    wrong = np.cumsum(errors[order])
    curve = []
    for n in threshold_grid(1, len(order), points):
        curve.append((float(confidences[order][n - 1]), n / len(order), float(wrong[n - 1] / n)))
    return curve


def best_in_sample(confidences: np.ndarray, errors: np.ndarray, target_error: float) -> float:
    """The largest coverage any threshold reaches on these very rows with an error at most ε: an optimistic
    yardstick (the threshold is chosen on the rows it is measured on)."""
    order = np.argsort(-confidences, kind="stable")
    n = np.arange(1, len(order) + 1)
    within = np.cumsum(errors[order]) / n <= target_error
    return float(n[within].max() / len(order)) if within.any() else 0.0
