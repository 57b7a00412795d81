"""`scoring.precision`: a lower precision against fp32 on the same decisions (argmax agreement, accuracy and ECE
changes, per question and overall), and the verdict against the `quantize:` bounds that `--precision auto`
obeys."""

import numpy as np
import pytest

from pipeline.config import ConfigError, QuantizeConfig
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.precision import compare_precisions, verdict


def decision(question: str, label: int, record: int) -> ScoredDecision:
    return ScoredDecision(0, label, record, question, tuple(float(k == label) for k in range(2)))


DECISIONS = [decision("a", 0, 0), decision("a", 1, 1), decision("b", 0, 0), decision("b", 1, 1)]
FP32 = [np.array([0.9, 0.1]), np.array([0.2, 0.8]), np.array([0.6, 0.4]), np.array([0.45, 0.55])]


def test_the_same_answers_agree_everywhere_and_change_nothing():
    figures = compare_precisions(DECISIONS, FP32, FP32)
    assert figures["overall"]["argmax_agreement"] == 1.0
    assert figures["overall"]["accuracy_change"] == 0.0 and figures["overall"]["ece_change"] == 0.0
    assert set(figures["by_question"]) == {"a", "b"}
    assert verdict(figures["overall"], QuantizeConfig())[0]


def test_a_flipped_answer_counts_against_its_question_and_overall():
    flipped = [*FP32[:3], np.array([0.55, 0.45])]  # b's second decision flips to a wrong answer
    figures = compare_precisions(DECISIONS, FP32, flipped)
    assert figures["by_question"]["a"]["argmax_agreement"] == 1.0
    assert figures["by_question"]["b"]["argmax_agreement"] == 0.5
    assert figures["overall"]["argmax_agreement"] == 0.75
    assert figures["overall"]["accuracy_change"] == pytest.approx(-0.25)
    passes, why = verdict(figures["overall"], QuantizeConfig())
    assert not passes and "argmax agreement 75.00% < 99%" in why and "accuracy -0.2500" in why


def test_a_rise_in_ece_alone_fails_and_a_fall_passes():
    overall = {"decisions": 100, "argmax_agreement": 1.0, "accuracy_change": 0.0, "ece_change": 0.006}
    assert not verdict(overall, QuantizeConfig())[0]
    assert verdict(overall | {"ece_change": -0.02}, QuantizeConfig())[0]
    assert verdict(overall, QuantizeConfig(max_ece_rise=0.01))[0]


def test_nothing_measured_never_passes():
    assert verdict({"decisions": 0}, QuantizeConfig()) == (False, "no decisions to measure it on")


@pytest.mark.parametrize(
    "values",
    [{"min_agreement": 0.0}, {"min_agreement": 1.5}, {"max_accuracy_drop": -0.1}, {"max_ece_rise": 1.0}],
)
def test_bounds_out_of_range_are_refused_by_name(values):
    with pytest.raises(ConfigError, match=f"quantize.{next(iter(values))}"):
        QuantizeConfig(**values)
