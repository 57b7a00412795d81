"""Every reason code of the data contract is produced by a row built to trigger it, and counts add up."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.data import contract, synthetic
from pipeline.data.validate import validate_rows

BROKEN = synthetic.broken_rows()


def test_every_reason_code_has_a_broken_row():
    assert {reason for _, reason, _ in BROKEN} == set(contract.REASONS)


@pytest.mark.parametrize(("row", "reason", "count"), BROKEN, ids=[r for _, r, _ in BROKEN])
def test_broken_row_is_skipped_with_its_reason(row, reason, count):
    report = validate_rows([row]).report
    assert report.skipped == {reason: count}
    assert report.examples[reason]["row"] == 0
    assert report.kept + sum(report.skipped.values()) == report.decisions


def test_clean_row_is_kept_with_normalised_gold():
    data = validate_rows([synthetic.clean_row(__import__("random").Random(1))])
    assert data.report.skipped == {} and data.report.kept == 3
    by_id = {d.question.id: d for d in data.records[0].decisions}
    assert by_id["is_negative"].question.options == ("false", "true")
    assert by_id["intensity"].question.options == ("0", "1", "2", "3", "4")


@pytest.mark.parametrize(
    ("question", "gold", "label", "probabilities"),
    [
        ({"type": "choice", "criteria": ["a", "b"]}, "b", 1, None),
        ({"type": "choice", "criteria": {"x": "desc", "y": None}}, {"label": "x"}, 0, None),
        ({"type": "choice", "criteria": ["1", "2"]}, 2, 1, None),  # numeric labels of numeric ids
        (
            {"type": "choice", "criteria": ["a", "b"]},
            {"probabilities": {"a": 0.25, "b": 0.75}},
            1,
            (0.25, 0.75),
        ),
        (
            {"type": "choice", "criteria": ["a", "b"]},
            {"label": "a", "probabilities": [0.6, 0.4]},
            0,
            (0.6, 0.4),
        ),
        ({"type": "score", "criteria": ["lo", "mid", "hi"]}, 2, 2, None),
        ({"type": "score", "criteria": ["lo", "mid", "hi"]}, 1.0, 1, None),  # integral float
        ({"type": "score", "criteria": ["the only level"]}, 0, 0, None),  # one level: certain, but a decision
        ({"type": "noul", "criteria": None}, True, 1, None),
        ({"type": "noul"}, "false", 0, None),
        ({"type": "noul", "criteria": {"true": "yes", "false": "no"}}, {"noul": 0.8}, 1, (0.2, 0.8)),
        ({"type": "noul", "criteria": None}, {"label": "true", "noul": 0.4}, 1, (0.6, 0.4)),
    ],
)
def test_gold_forms_are_parsed(question, gold, label, probabilities):
    data = validate_rows([{"state": {"turns": ["hi"]}, "questions": {"q": question}, "gold": {"q": gold}}])
    assert data.report.kept == 1, data.report.skipped
    decided = data.records[0].decisions[0].gold
    assert decided.label == label
    if probabilities is None:
        assert decided.probabilities is None
    else:
        assert all(math.isclose(a, b) for a, b in zip(decided.probabilities, probabilities))


@pytest.mark.parametrize(
    ("levels", "reason"), [(0, "bad_criteria"), (1, None), (10, None), (11, "too_many_options")]
)
def test_score_questions_take_one_to_ten_levels(levels, reason):
    question = {"type": "score", "criteria": [f"level {i}" for i in range(levels)]}
    report = validate_rows([{"state": "s", "questions": {"q": question}, "gold": {"q": 0}}]).report
    assert report.skipped == ({reason: 1} if reason else {})


def test_cells_as_json_text_and_answers_column_are_accepted():
    row = {"state": '{"user": "hello"}', "questions": '{"q": {"type": "noul"}}', "answers": '{"q": "true"}'}
    data = validate_rows([row])
    assert data.report.kept == 1
    assert data.records[0].state == {"user": "hello"}


@pytest.mark.parametrize(
    ("gold", "reason"),
    [
        ({"q": 1.5}, "gold_label_not_an_option"),
        ({"q": {"noul": 0.4}}, "gold_probabilities_invalid"),  # noul on a choice question
        ({"q": {"probabilities": {"a": 0.5, "z": 0.5}}}, "gold_probabilities_invalid"),
        ({"q": {"probabilities": [float("nan"), 1.0]}}, "gold_probabilities_invalid"),
        ({"q": {"label": "z", "probabilities": [0.5, 0.4]}}, "gold_label_not_an_option"),
    ],
)
def test_bad_gold_is_skipped(gold, reason):
    row = {"state": "s", "questions": {"q": {"type": "choice", "criteria": ["a", "b"]}}, "gold": gold}
    assert validate_rows([row]).report.skipped == {reason: 1}


@pytest.mark.parametrize("criteria", [{"0": "lo", "1": "hi"}, {"low": "lo", "high": "hi"}])
def test_score_criteria_given_as_a_map_are_skipped_as_bad_criteria(criteria):
    # A level is its position in a list (docs/data-format.md); the Decision API refuses a map too, so no row
    # trains on a question the served model would refuse.
    row = {"state": "s", "questions": {"q": {"type": "score", "criteria": criteria}}, "gold": {"q": 1}}
    report = validate_rows([row]).report
    assert report.skipped == {"bad_criteria": 1} and report.examples["bad_criteria"]["question_id"] == "q"


def test_mixed_rows_count_up(synthetic_rows):
    report = validate_rows(synthetic_rows).report
    assert report.kept > 0 and report.skipped
    assert report.kept + sum(report.skipped.values()) == report.decisions


json_leaf = st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=True) | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["choice", "score", "noul", "rank", 3])},
    optional={"instructions": json_value, "criteria": json_value},
)
row = st.fixed_dictionaries(
    {},
    optional={
        "state": json_value,
        "questions": st.dictionaries(st.sampled_from(["a", "b", "c"]), question | json_value, max_size=3)
        | json_value,
        "gold": st.dictionaries(st.sampled_from(["a", "b", "c"]), json_value, max_size=3) | json_value,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row, max_size=6))
def test_arbitrary_rows_never_raise_and_counts_add_up(rows):
    report = validate_rows(rows).report
    assert report.kept + sum(report.skipped.values()) == report.decisions
    assert report.decisions >= len(rows)
    assert set(report.skipped) <= set(contract.REASONS)


def test_a_too_long_example_counts_characters_as_the_limits_do():
    # It printed len(str(spec)), the Python repr of the question dict: 20,063 for a question the limit counts
    # as 20,003.
    question = {
        "type": "choice",
        "instructions": "x" * (contract.MAX_QUESTION_CHARS - 1),
        "criteria": ["ab", "c"],
    }
    report = validate_rows([{"state": "late", "questions": {"q": question}, "gold": {"q": "ab"}}]).report
    assert report.skipped == {"too_long": 1}
    chars = (
        f"{contract.MAX_QUESTION_CHARS + 2:,} question characters (at most {contract.MAX_QUESTION_CHARS:,})"
    )
    assert report.examples["too_long"]["value"] == f"{chars} / 4 state characters (at most 200,000)"
