"""A served answer does not depend on what it was batched with: the same request alone and among batch-mates
of other lengths and other questions gets the same probabilities (padding is masked), for every family."""

from dataclasses import replace

import numpy as np
import pytest

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.families import load_decision_model
from pipeline.families.base import Answered, DecisionModel
from tests.tiny import JOINT_HEAD, load_joint_on

QUESTIONS = {
    "tone": {
        "type": "choice",
        "instructions": "What is the tone?",
        "criteria": {"negative": "unhappy", "neutral": "neither", "positive": "happy"},
    },
    "good": {"type": "noul", "instructions": "The text is positive."},
    "level": {"type": "score", "instructions": "How intense is it?", "criteria": ["calm", "mild", "strong"]},
}
MATES = [
    ("a " + "very " * 60 + "long review of a phone that broke", QUESTIONS),
    ("ok", {"good": QUESTIONS["good"]}),
    ({"text": "nested", "meta": {"stars": 2, "tags": ["x", "y"]}}, {"tone": QUESTIONS["tone"]}),
]


def served(model: DecisionModel, bodies) -> list[dict]:
    results = model.answer([parse_request(state, questions) for state, questions in bodies])
    assert all(isinstance(r, Answered) for r in results), results
    return [r.answers for r in results]


@pytest.fixture(params=["laya", "joint", "joint-windows"])
def model(request, tiny_base) -> DecisionModel:
    if request.param == "laya":
        return load_decision_model(tiny_base)
    if request.param == "joint-windows":  # a long state read in windows: the long mate and body span several
        return DecisionModel(*load_joint_on(tiny_base, replace(JOINT_HEAD, state_windows=3)))
    return DecisionModel(*load_joint_on(tiny_base))


@pytest.mark.parametrize("state", ["the battery died after a day", "the battery " + "really " * 45 + "died"])
def test_an_answer_alone_equals_the_same_answer_among_batch_mates(model, state):
    body = (state, QUESTIONS)
    alone = served(model, [body])[0]
    for position in range(len(MATES) + 1):
        mixed = served(model, [*MATES[:position], body, *MATES[position:]])[position]
        for qid, answer in alone.items():
            np.testing.assert_allclose(
                answer_probabilities(mixed[qid]), answer_probabilities(answer), atol=1e-5
            )
