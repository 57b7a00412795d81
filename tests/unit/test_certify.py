"""Certified automation (`scoring.certify`): on a model whose calibration is known, the certified threshold's true
error stays within ε in at least 1 - δ of simulated validation draws, where the naive threshold's does not; a
question automates nothing, saying why, where it cannot be certified; the held-out report's intervals hold."""

import numpy as np
import pytest

from pipeline.config import CertifyConfig, ConfigError
from pipeline.data.contract import QUESTION_TYPE_IDS
from pipeline.scoring.certify import (
    Certificate,
    automation_report,
    certificates_json,
    certify,
    certify_question,
    confidence_and_error,
    min_decisions,
    read_certificates,
    sequence_starts,
)
from pipeline.scoring.decisions import ScoredDecision

EPSILON, DELTA, DRAWS, ROWS = 0.05, 0.05, 200, 1000


def calibrated_draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A yes/no model calibrated by construction: confidence 0.5 + x/2 with x ~ Beta(3, 1), and each answer
    wrong with probability 1 - confidence."""
    confidence = 0.5 + 0.5 * rng.beta(3, 1, n)
    return confidence, (rng.uniform(size=n) < 1 - confidence).astype(float)


def true_error(threshold: float) -> float:
    """The exact error among answers at or above `threshold` for `calibrated_draw`'s model: E[(1 - x) / 2 | x >= a]
    with density 3x^2."""
    a = 2 * threshold - 1
    return (0.25 - a**3 + 0.75 * a**4) / (1 - a**3) / 2


def naive_threshold(confidence: np.ndarray, errors: np.ndarray) -> float | None:
    """What users do by hand: the lowest threshold whose error on these rows is at most ε."""
    order = np.argsort(-confidence)
    n = np.arange(1, len(order) + 1)
    within = np.cumsum(errors[order]) / n <= EPSILON
    return float(confidence[order][n[within].max() - 1]) if within.any() else None


def test_the_certified_error_holds_in_1_minus_delta_of_draws_and_the_naive_threshold_does_not():
    rng = np.random.default_rng(52)
    certified, naive, covered = [], [], []
    for _ in range(DRAWS):
        confidence, errors = calibrated_draw(rng, ROWS)
        certificate = certify_question("q", "noul", confidence, errors, CertifyConfig())
        # Automating nothing (a draw whose surest answers erred) errs nowhere.
        certified.append(not certificate.certified or true_error(certificate.threshold) <= EPSILON)
        covered.append(certificate.fit_coverage)
        naive.append(true_error(naive_threshold(confidence, errors)) <= EPSILON)
    assert np.mean(certified) >= 1 - DELTA, np.mean(certified)
    assert np.mean(naive) < 1 - DELTA, np.mean(
        naive
    )  # about half the draws: it stops where the noise lets it
    assert np.mean(covered) > 0.15  # and not by automating next to nothing: the best true share is about 0.55


def test_fewer_rows_than_a_bound_can_rest_on_automate_nothing_and_say_how_many_are_needed():
    needed = min_decisions(EPSILON, DELTA)
    assert needed == 59 and sequence_starts(EPSILON, DELTA, needed - 1) == []
    certificate = certify_question(
        "tone", "choice", np.full(needed - 1, 0.99), np.zeros(needed - 1), CertifyConfig()
    )
    assert not certificate.certified and certificate.reason == (
        f"too few decisions to certify: {needed - 1}, at least {needed} needed"
    )


def test_a_model_wrong_at_every_confidence_is_never_certified_and_says_its_bound():
    confidence = np.linspace(0.6, 0.99, 400)
    errors = (np.arange(400) % 5 == 0).astype(float)  # 20% wrong everywhere
    certificate = certify_question("tone", "choice", confidence, errors, CertifyConfig())
    assert certificate.threshold is None and certificate.reason.startswith(
        "the error bound never falls to 0.05"
    )


def test_types_overrides_and_score_errors():
    assert certify_question(
        "x", "score", np.full(500, 0.99), np.zeros(500), CertifyConfig(types=["choice"])
    ).reason
    assert certify_question("x", "score", np.full(500, 0.99), np.zeros(500), CertifyConfig()).certified
    loose = CertifyConfig(questions={"tone": {"target_error": 0.2}})
    assert loose.for_question("tone") == (0.2, DELTA) and loose.for_question("other") == (EPSILON, DELTA)
    p = np.array([0.05, 0.45, 0.4, 0.1])
    assert confidence_and_error(p, 2, "score") == (pytest.approx(0.45), True)  # exact: another level is wrong
    assert confidence_and_error(p, 2, "score", "off_by_more_than_one") == (pytest.approx(0.9), False)
    assert confidence_and_error(p, 3, "score", "off_by_more_than_one")[1] is True


def decisions_of(question: str, labels: list[int], qtype: str = "noul") -> list[ScoredDecision]:
    return [
        ScoredDecision(
            QUESTION_TYPE_IDS[qtype], label, i, question, tuple(float(k == label) for k in range(2))
        )
        for i, label in enumerate(labels)
    ]


def test_an_override_of_a_question_the_data_never_asks_is_refused_by_name():
    rows = decisions_of("tone", [1] * 100)
    probabilities = [np.array([0.02, 0.98])] * 100
    with pytest.raises(ConfigError, match=r"certify\.questions: topic: no such question in the data"):
        certify(rows, probabilities, CertifyConfig(questions={"topic": {"delta": 0.1}}))


@pytest.mark.parametrize(
    "bad", [{"target_error": 0.0}, {"target_error": 1.0}, {"delta": -0.1}, {"delta": 1.5}]
)
def test_rates_outside_0_1_are_refused_naming_the_key(bad):
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=rf"certify\.{key}: must lie in \(0, 1\)"):
        CertifyConfig(**bad)


def test_the_held_out_report_measures_coverage_and_error_with_intervals_and_takes_a_veto():
    rng = np.random.default_rng(7)
    confidence, errors = calibrated_draw(rng, 2000)
    fit = certify_question("q", "noul", confidence[:1000], errors[:1000], CertifyConfig())
    labels = [1 - int(wrong) for wrong in errors[1000:]]  # the answer is `true`; wrong where the label is not
    held = decisions_of("q", labels)
    probabilities = [np.array([1 - c, c]) for c in confidence[1000:]]
    report = automation_report(held, probabilities, {"q": fit})
    figures = report.by_question["q"]
    expected = (confidence[1000:] >= fit.threshold).mean()
    assert (
        figures.coverage == pytest.approx(expected)
        and figures.coverage_low <= expected <= figures.coverage_high
    )
    assert figures.error_low <= true_error(fit.threshold) <= figures.error_high
    assert report.overall.automated == figures.automated and report.curves["q"][0][1] == pytest.approx(
        1 / 1000
    )
    vetoed = automation_report(held, probabilities, {"q": fit}, automate=np.zeros(1000, dtype=bool))
    assert vetoed.overall.automated == 0 and vetoed.overall.error is None
    uncertified = automation_report(held, probabilities, {})
    assert uncertified.by_question["q"].automated == 0  # no certificate: nothing automated


def test_certificates_round_trip_through_their_file():
    certificate = Certificate(
        "tone", "choice", 0.05, 0.05, 0.91, fit_decisions=1000, automated=300, errors=4, error_bound=0.031
    )
    assert read_certificates(certificates_json({"tone": certificate})) == {"tone": certificate}
    assert read_certificates(None) == {} and certificate.automates(0.95) and not certificate.automates(0.9)
