"""The joint family's questions are isolated (DESIGN.md 5): an answer depends on its question and the state alone.

On an encoder each question and each option is a field sequence of its own and the head's fields attend within
their question; on a causal LM each question is read after the state in a sequence of its own. So renaming a
question, adding or removing others, reordering them or changing batch-mates leaves an answer as it was, and a
question with 255 options or a one-level score is answered like any other.
"""

import pytest
import torch

from pipeline.data.answers import parse_request
from pipeline.families.joint.predict import answer_joint_requests
from pipeline.families.joint.records import collate_records, encode_row
from tests.invariance import INTENSITY, OTHERS, POSITIVE, STATE, TONE, assert_same
from tests.tiny import load_joint_on, write_tiny_causal_lm


@pytest.fixture(scope="module", params=["encoder", "causal_lm"])
def loaded(request, tiny_base, tmp_path_factory):
    base = tiny_base
    if request.param == "causal_lm":
        base = write_tiny_causal_lm(tmp_path_factory.mktemp("causal_lm") / "qwen3")
    _, model = load_joint_on(base)
    assert model.isolated
    return model


def answers(loaded, questions: dict, state=STATE) -> dict:
    [result] = answer_joint_requests(loaded, [parse_request(state, questions)])
    return result.answers


def test_renaming_a_question_leaves_its_answer(loaded):
    before = answers(loaded, {"tone": TONE, "intensity": INTENSITY})
    after = answers(loaded, {"q_7f3": TONE, "how_strong": INTENSITY})
    assert_same(before["tone"], after["q_7f3"])
    assert_same(before["intensity"], after["how_strong"])


def test_other_questions_and_their_order_leave_an_answer(loaded):
    alone = answers(loaded, {"tone": TONE})
    crowded = answers(loaded, {**OTHERS, "tone": TONE, "positive": POSITIVE})
    reordered = answers(loaded, dict(reversed(list({**OTHERS, "tone": TONE, "positive": POSITIVE}.items()))))
    assert_same(alone["tone"], crowded["tone"])
    assert_same(alone["tone"], reordered["tone"])
    assert_same(crowded["positive"], reordered["positive"])


def test_batch_mates_leave_an_answer(loaded):
    request = parse_request(STATE, {"tone": TONE, "positive": POSITIVE})
    mates = [
        parse_request("no", OTHERS),
        parse_request(STATE * 3, {"x": {**TONE, "criteria": list("abcdefg")}}),
    ]
    alone = answer_joint_requests(loaded, [request])[0].answers
    loaded.field_cache.vectors.clear()  # the field vectors computed beside the mates, not looked up
    together = answer_joint_requests(loaded, [mates[0], request, mates[1]])[1].answers
    for question in ("tone", "positive"):
        assert_same(alone[question], together[question])


def test_the_model_input_never_holds_a_question_id(loaded):
    layout = loaded.layout
    named = {"zebra_crossing": TONE}
    [record] = [r for r in encode_row(loaded.tokenizer, STATE, list(parse_request(STATE, named).questions.values()),
                                      layout)]  # fmt: skip
    batch = collate_records([record], loaded.tokenizer.pad_token_id)
    text = " ".join(loaded.tokenizer.decode(row) for row in batch.get("field_input_ids", batch["input_ids"]))
    assert "zebra" not in text and "crossing" not in text
    assert "tone" in text


def test_a_field_sequence_is_shared_by_every_row_that_asks_the_question(tiny_base):
    _, loaded = load_joint_on(tiny_base)
    questions = list(parse_request("a", {"tone": TONE, "positive": POSITIVE}).questions.values())
    a = encode_row(loaded.tokenizer, "good", questions, loaded.layout)[0]
    b = encode_row(
        loaded.tokenizer, "a much longer state than the other one", questions[::-1], loaded.layout
    )[0]
    assert a.field_sequences == b.field_sequences[::-1]
    batch = collate_records([a, b], loaded.tokenizer.pad_token_id)
    assert batch["field_input_ids"].shape[0] == 1 + 3 + 1 + 2  # each question and each option once
    assert torch.equal(batch["question_field"][0], batch["question_field"][1].flip(0))


@pytest.mark.parametrize("n_options", [2, 64, 255])
def test_choice_questions_take_2_to_255_options_in_one_softmax(loaded, n_options):
    options = [f"option {i}" for i in range(n_options)]
    answer = answers(loaded, {"pick": {"type": "choice", "instructions": "Pick one.", "criteria": options}})[
        "pick"
    ]
    assert list(answer["probabilities"]) == options
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("levels", [1, 2, 10])
def test_score_questions_take_1_to_10_levels(loaded, levels):
    criteria = [f"level {i}" for i in range(levels)]
    answer = answers(loaded, {"s": {"type": "score", "instructions": "How much?", "criteria": criteria}})["s"]
    assert len(answer["probabilities"]) == levels
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)


def test_usage_counts_every_token_read(loaded):
    [one] = answer_joint_requests(loaded, [parse_request(STATE, {"tone": TONE})])
    [two] = answer_joint_requests(loaded, [parse_request(STATE, {"tone": TONE, **OTHERS})])
    [many] = answer_joint_requests(
        loaded, [parse_request(STATE, {"tone": {**TONE, "criteria": list("abcdefghij")}})]
    )
    assert two.input_tokens > one.input_tokens and many.input_tokens > one.input_tokens
