"""A fine-tune no better than its base or the class prior on a question is named, and never promoted."""

import numpy as np

from pipeline.config import PromoteConfig
from pipeline.mlops.promotion import gate
from pipeline.scoring.baselines import learning_warnings
from pipeline.scoring.decisions import ScoredDecision

# Question "a": gold mostly option 0 (the prior says 0); question "b": gold alternates.
DECISIONS = [
    ScoredDecision(0, label, i, qid, (1.0, 0.0))
    for i, (qid, label) in enumerate(
        [("a", 0), ("a", 0), ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 0), ("b", 1)]
    )
]
MAJORITY = {"a": 0, "b": 0}
RIGHT = [np.array([1.0, 0.0]) if d.label == 0 else np.array([0.0, 1.0]) for d in DECISIONS]
ALWAYS_0 = [np.array([1.0, 0.0]) for _ in DECISIONS]
CALIBRATED = {"accuracy": 0.9, "ece": 0.01}


def test_a_fine_tune_that_learned_every_question_has_no_warning():
    assert learning_warnings(DECISIONS, ALWAYS_0, RIGHT, MAJORITY) == []


def test_no_better_than_the_base_or_the_prior_is_named_per_question():
    warnings = learning_warnings(DECISIONS, ALWAYS_0, ALWAYS_0, MAJORITY)
    assert len(warnings) == 4  # both questions, against the base and against the prior
    assert (
        "question 'a'" in warnings[0]
        and "base" in warnings[0]
        and "most common training label" in warnings[1]
    )


def test_the_gate_refuses_an_unlearned_fine_tune_unless_told_not_to():
    warnings = ["question 'a': ..."]
    refused = gate(CALIBRATED, None, True, PromoteConfig(), warnings)
    assert not refused.promote and "no better than its base or the class prior" in refused.reasons[0]
    assert gate(CALIBRATED, None, True, PromoteConfig(refuse_unlearned=False), warnings).promote
    assert gate(CALIBRATED, None, True, PromoteConfig(), []).promote
