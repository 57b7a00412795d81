"""Temperature calibration and the evaluation metrics, checked against known answers and laya's reference
ECE."""

import numpy as np
import pytest

from pipeline.scoring.calibration import (
    cross_fitted_metrics,
    fit_calibration,
    fit_temperature,
    loose_temperatures,
    softmax,
    temperature_interval,
    temperature_spreads,
)
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.metrics import detailed_metrics, expected_calibration_error, metrics_by_type


def _sampled(rng, n, k, true_temperature):
    """Logits whose labels are drawn from softmax(logits / T): the NLL-optimal temperature is about T."""
    logits = [rng.normal(0, 3, size=k) for _ in range(n)]
    labels = [int(rng.choice(k, p=softmax(z, true_temperature))) for z in logits]
    return logits, labels


@pytest.mark.parametrize("true_temperature", [0.7, 1.0, 2.0, 3.5])
def test_fit_temperature_recovers_the_temperature_that_generated_the_labels(true_temperature):
    rng = np.random.default_rng(0)
    logits, labels = _sampled(rng, 4000, 4, true_temperature)
    fitted = fit_temperature(logits, [np.eye(4)[y] for y in labels])
    assert fitted == pytest.approx(true_temperature, rel=0.1)


def test_fit_temperature_is_clamped():
    rng = np.random.default_rng(1)
    logits, labels = _sampled(rng, 2000, 3, 20.0)
    assert fit_temperature(logits, [np.eye(3)[y] for y in labels]) == pytest.approx(5.0)
    confident = [np.array([10.0, 0.0]) for _ in range(50)]
    assert fit_temperature(confident, [np.array([1.0, 0.0])] * 50) == pytest.approx(0.5)


def _items(labels, qtypes, records=None):
    return [
        ScoredDecision(q, y, (records or list(range(len(labels))))[i], "q", tuple(np.eye(3)[y]))
        for i, (y, q) in enumerate(zip(labels, qtypes))
    ]


def test_a_type_with_too_few_decisions_keeps_t_1_and_says_so():
    rng = np.random.default_rng(2)
    logits, labels = _sampled(rng, 60, 3, 2.0)
    items = _items(labels, [0] * 55 + [2] * 5)
    calibration = fit_calibration(items, logits)
    assert calibration.temperatures[2] == 1.0 and "kept T=1" in calibration.notes["noul"]
    assert calibration.temperatures[1] == 1.0 and "0 decisions" in calibration.notes["score"]
    assert calibration.temperatures[0] > 1.2 and "fitted on 55" in calibration.notes["choice"]


def test_cross_fitted_calibration_improves_an_overconfident_model():
    rng = np.random.default_rng(3)
    logits, labels = _sampled(rng, 600, 3, 3.0)
    items = _items(labels, [0] * 600)
    before = detailed_metrics(items, [softmax(z) for z in logits])
    after = cross_fitted_metrics(items, logits)
    assert after["ece"] < before["ece"] / 2 and after["loss"] < before["loss"]
    assert after["accuracy"] == pytest.approx(before["accuracy"])  # temperature never changes the argmax


def test_ece_agrees_with_laya_reference_including_bin_edges():
    from laya.common import ece_score

    rng = np.random.default_rng(4)
    for trial in range(30):
        n = int(rng.integers(1, 300))
        confidence = rng.uniform(0, 1, n)
        if trial % 2:  # values exactly on the bin edges, and 0 and 1
            confidence = rng.choice(np.linspace(0, 1, 16), n)
        correct = rng.integers(0, 2, n).astype(float)
        assert expected_calibration_error(confidence, correct) == pytest.approx(
            ece_score(confidence, correct), abs=1e-12
        )


def test_metrics_by_type_report_brier_kl_and_score_mae():
    items = _items([0, 1, 2], [0, 1, 1])
    items[1] = ScoredDecision(1, 1, 1, "s", (0.2, 0.6, 0.2), True)
    probabilities = [np.array([1.0, 0, 0]), np.array([0.2, 0.6, 0.2]), np.array([0, 0.5, 0.5])]
    report = metrics_by_type(items, probabilities)
    assert set(report) == {"overall", "choice", "score"}
    assert report["choice"]["brier"] == pytest.approx(0.0)
    assert report["score"]["kl_soft"] == pytest.approx(0.0)
    assert report["score"]["score_mae"] == pytest.approx((0.0 + 0.5) / 2)


def test_a_temperature_that_would_hurt_held_out_calibration_is_not_used():
    # Even records come from an underconfident model, odd ones from an overconfident one: a temperature fitted
    # on either half is wrong for the other, and T = 1 (between them) is the better calibrated choice.
    rng = np.random.default_rng(5)
    logits, labels = [], []
    for record in range(800):
        z = rng.normal(0, 2, size=3)
        logits.append(z)
        labels.append(int(rng.choice(3, p=softmax(z, 0.4 if record % 2 else 2.5))))
    items = _items(labels, [0] * 800, list(range(800)))
    ece_at_1 = detailed_metrics(items, [softmax(z) for z in logits])["ece"]
    guarded = fit_calibration(items, logits)
    unguarded = fit_calibration(items, logits, guard=False)
    assert guarded.temperatures[0] == 1.0 and "made the cross-fitted ECE worse" in guarded.notes["choice"]
    assert unguarded.temperatures[0] != 1.0
    assert cross_fitted_metrics(items, logits)["ece"] <= ece_at_1 + 1e-9


def test_a_temperature_that_helps_is_kept():
    rng = np.random.default_rng(6)
    logits, labels = _sampled(rng, 800, 3, 3.0)
    assert fit_calibration(_items(labels, [0] * 800), logits).temperatures[0] > 2.0


def _grouped(items, group_size):
    """The same decisions with every `group_size` consecutive rows in one group (a speaker, a source)."""
    return [
        ScoredDecision(d.qtype, d.label, d.record, d.question_id, d.target, group=d.record // group_size)
        for d in items
    ]


def test_the_temperature_interval_holds_the_true_temperature_and_narrows_with_more_decisions():
    rng = np.random.default_rng(7)
    logits, labels = _sampled(rng, 4000, 3, 2.0)
    items = _items(labels, [0] * 4000)
    few_low, few_high = temperature_interval(items[:100], logits[:100])
    many_low, many_high = temperature_interval(items, logits)
    assert many_low < 2.0 < many_high and few_low < 2.0 < few_high
    assert many_high / many_low < 1.2 < few_high / few_low


def test_the_interval_draws_whole_groups_so_a_few_groups_pin_the_temperature_less_than_as_many_rows():
    # Rows in groups that each lean one way (their own temperature) are few independent draws, not many.
    rng = np.random.default_rng(8)
    logits, labels = [], []
    for t in rng.choice([1.0, 4.0], size=10):
        z, y = _sampled(rng, 40, 3, float(t))
        logits += z
        labels += y
    rows = _items(labels, [0] * len(labels))
    by_row, by_group = temperature_interval(rows, logits), temperature_interval(_grouped(rows, 40), logits)
    assert by_group[1] / by_group[0] > by_row[1] / by_row[0]


def test_loose_temperatures_are_named_with_their_interval_and_what_narrows_it():
    rng = np.random.default_rng(9)
    logits, labels = _sampled(rng, 4000, 3, 2.0)
    tight = temperature_spreads(_items(labels, [0] * 4000), logits)
    choice = tight["choice"]
    assert set(tight) == {"choice"} and (choice["decisions"], choice["drawn"]) == (4000, "rows")
    assert loose_temperatures(tight) is None
    few = _grouped(_items(labels[:60], [0] * 60), 10)
    loose = temperature_spreads(few, logits[:60])
    assert loose["choice"]["clusters"] == 6 and loose["choice"]["drawn"] == "groups"
    line = loose_temperatures(loose)
    assert line is not None and "choice T" in line and "60 decisions in 6 groups" in line
    assert "validate.validation_fraction" in line
