"""The joint family's questions are isolated (docs/serving.md): an answer depends on its question and the
state alone.

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


def holds(loaded, batch: dict, text: str) -> bool:
    """Whether any sequence of the batch holds `text`'s tokens, in a row."""
    part = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    rows = [*batch["input_ids"].tolist(), *batch.get("field_input_ids", torch.empty(0, 0)).tolist()]
    return any(row[i : i + len(part)] == part for row in rows for i in range(len(row)))


def test_the_model_input_never_holds_a_question_id(loaded):
    questions = list(parse_request(STATE, {"zebra_crossing": TONE}).questions.values())
    batch = collate_records(
        encode_row(loaded.tokenizer, STATE, questions, loaded.layout), loaded.tokenizer.pad_token_id
    )
    assert not holds(loaded, batch, " zebra_crossing") and not holds(loaded, batch, "zebra_crossing")
    assert holds(loaded, batch, " tone") or holds(loaded, batch, "tone")  # the instructions are there


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


def test_an_export_written_before_isolation_reads_its_questions_as_it_was_trained(tiny_base, tmp_path):
    import json

    from pipeline.families.joint.layout import JOINT_CONFIG, export_joint, load_joint
    from pipeline.scoring.calibrators import Calibrator

    _, loaded = load_joint_on(tiny_base)
    export_joint(loaded, tmp_path / "old", Calibrator(), {})
    config = json.loads((tmp_path / "old" / JOINT_CONFIG).read_text())
    del config["head"]["isolated"]  # what every export before the change holds
    (tmp_path / "old" / JOINT_CONFIG).write_text(json.dumps(config))
    old = load_joint(tmp_path / "old")
    assert not old.isolated and not old.model.head.isolated
    questions = list(parse_request(STATE, {"zebra": TONE}).questions.values())
    records = encode_row(old.tokenizer, STATE, questions, old.layout)
    assert records[0].field_sequences is None
    batch = collate_records(records, old.tokenizer.pad_token_id)
    assert holds(old, batch, " zebra") or holds(old, batch, "zebra")
    [answered] = answer_joint_requests(old, [parse_request(STATE, {"zebra": TONE, **OTHERS})])
    assert sum(answered.answers["zebra"]["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)
