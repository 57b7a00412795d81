"""Answer shaping (docs/serving.md): the Jev confidence, x_ extras, noul without confidence, 4-decimal
figures."""

import numpy as np
import pytest

from pipeline.data.answers import InvalidRequest, jev_confidence, parse_request, request_parts, shape_answer
from pipeline.data.contract import Question

CHOICE = Question("tone", "choice", "Tone?", ("negative", "neutral", "positive"), (None, None, None))
SCORE = Question("level", "score", "How much?", ("0", "1", "2", "3"), ("none", "some", "much", None))
NOUL = Question("late", "noul", "It was late.", ("false", "true"), (None, None))


@pytest.mark.parametrize(
    ("probabilities", "confidence"),
    [
        ([1 / 3, 1 / 3, 1 / 3], 0.0),  # uniform: nothing beyond chance
        ([0.0, 1.0, 0.0], 1.0),  # certain
        ([0.6, 0.3, 0.1], 0.4),  # (0.6 - 1/3) / (1 - 1/3)
        ([0.25, 0.75], 0.5),
        ([1.0], 1.0),  # one level: certain by definition
    ],
)
def test_the_jev_confidence_runs_from_chance_to_certainty(probabilities, confidence):
    assert jev_confidence(np.asarray(probabilities)) == pytest.approx(confidence, abs=1e-12)


def test_a_near_uniform_answer_is_never_below_zero_or_above_one():
    assert jev_confidence(np.full(7, 1 / 7) - 1e-17) == 0.0
    assert jev_confidence(np.asarray([1.0 + 1e-12, 0.0])) == 1.0


def test_choice_answers_carry_the_jev_confidence_and_the_top_probability():
    answer = shape_answer(CHOICE, np.asarray([0.6, 0.3, 0.1]))
    assert answer == {
        "type": "choice",
        "choice": "negative",
        "probabilities": {"negative": 0.6, "neutral": 0.3, "positive": 0.1},
        "confidence": 0.4,
        "x_top_probability": 0.6,
    }
    assert shape_answer(CHOICE, np.full(3, 1 / 3))["confidence"] == 0.0


def test_score_answers_use_the_same_formula_over_their_levels():
    answer = shape_answer(SCORE, np.asarray([0.1, 0.2, 0.3, 0.4]))
    assert answer["confidence"] == pytest.approx(0.2, abs=1e-4)  # (0.4 - 1/4) / (3/4)
    assert answer["x_top_probability"] == 0.4 and answer["score"] == 2.0
    assert answer["legend"] == {"0": "none", "1": "some", "2": "much", "3": "level 3"}


def test_noul_answers_have_no_confidence_only_the_x_extra():
    answer = shape_answer(NOUL, np.asarray([0.2, 0.8]))
    assert answer == {"type": "noul", "noul": 0.8, "x_confidence": 0.8}
    assert shape_answer(NOUL, np.asarray([0.9, 0.1]))["x_confidence"] == 0.9


def test_every_extra_starts_with_x_and_every_figure_has_four_decimals():
    jev_fields = {
        "choice": {"type", "choice", "probabilities", "confidence"},
        "score": {"type", "score", "legend", "probabilities", "confidence"},
        "noul": {"type", "noul"},
    }
    rng = np.random.default_rng(0)
    for question in (CHOICE, SCORE, NOUL):
        answer = shape_answer(question, rng.dirichlet(np.ones(len(question.options))))
        assert all(key.startswith("x_") for key in set(answer) - jev_fields[question.type]), answer
        figures = [v for k, v in answer.items() if isinstance(v, float)]
        figures += list(answer.get("probabilities", {}).values())
        assert figures and all(value == round(value, 4) for value in figures)


def test_a_request_answers_through_the_same_shapes():
    parsed = parse_request("s", {"q": {"type": "score", "criteria": [{"level": "low"}, "high"]}})
    assert parsed.legends == {"q": [{"level": "low"}, "high"]}  # a JSON-valued level is kept as sent


@pytest.mark.parametrize(
    ("question", "words"),
    [
        (
            {"type": "score", "criteria": {"0": "low", "1": "high"}},
            "a list (not an object)",
        ),  # the legend form
        ({"type": "score", "criteria": {"low": "a", "high": "b"}}, "a list (not an object)"),
        ({"type": "choice", "criteria": ["only"]}, "a choice takes 2 to 255 options, got 1"),
    ],
)
def test_requests_the_contract_refuses_name_the_criteria_field(question, words):
    with pytest.raises(InvalidRequest) as refused:
        parse_request("s", {"q": question})
    [error] = refused.value.errors
    assert error["loc"] == ["body", "questions", "q", "criteria"] and words in error["msg"]


def _choice(n_options: int, width: int) -> dict:
    return {
        "type": "choice",
        "instructions": "Which?",
        "criteria": [f"{i:0{width}d}" for i in range(n_options)],
    }


def test_a_request_is_cut_into_parts_of_whole_questions_in_order_each_within_the_characters():
    questions = {f"q{i}": _choice(100, 10) for i in range(7)}  # 1,006 characters each
    questions["score"] = {"type": "score", "instructions": "How much?", "criteria": ["none", "some", "much"]}
    request = parse_request("a state", questions)
    parts = request_parts(request, 2_500)
    assert [list(part.questions) for part in parts] == [
        ["q0", "q1"],
        ["q2", "q3"],
        ["q4", "q5"],
        ["q6", "score"],
    ]
    assert all(part.state == "a state" for part in parts)
    assert parts[-1].legends == {"score": ["none", "some", "much"]} and parts[0].legends == {}
    assert request_parts(request, 100_000) == [request]  # a small request stays whole
    # a question over the size is a part of its own, never cut
    assert [len(part.questions) for part in request_parts(request, 500)] == [1] * 8
