"""The laya family on questions whose options do not fit one Laya sequence: several ordinary sequences, one
softmax across them, in serving, scoring and training; a question that fits is read as before, bit for bit;
score questions of 1 to 10 levels."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.data.answers import parse_request
from pipeline.data.contract import MAX_CHOICE_OPTIONS, MAX_QUESTIONS, QUESTION_TYPE_IDS
from pipeline.data.validate import validate_rows
from pipeline.families.base import Answered, BadQuestion
from pipeline.families.laya.family import LayaFamily
from pipeline.families.laya.forward import decision_logits
from pipeline.families.laya.items import build_items, collate, collate_parts
from pipeline.families.laya.packed import packed_logits
from pipeline.families.laya.predict import predict, request_items, temperature_for
from pipeline.families.laya.sequences import Part, internal_question, question_parts, state_token_ids
from pipeline.families.laya.training import laya_batch_task, summed_loss
from pipeline.families.laya_layout import load_model
from pipeline.scoring.calibration import fit_calibration, softmax
from pipeline.scoring.calibrators import QUESTION_TEMPERATURE, Calibrator, QuestionTransform
from pipeline.training.loop import train

CPU = torch.device("cpu")
STATE = "the order was late and the box was broken"
TONE = {
    "type": "choice",
    "instructions": "what tone",
    "criteria": {"negative": None, "neutral": "none", "positive": None},
}
SQUEEZED = {  # fits one sequence only with every option cut short, as laya.Agent reads it
    "type": "choice",
    "instructions": "which one",
    "criteria": {f"o{i}": "good product order okay fine" for i in range(20)},
}
MANY = {
    "type": "choice",
    "instructions": "which product is it about",
    "criteria": [f"product {i}" for i in range(MAX_CHOICE_OPTIONS)],
}


@pytest.fixture
def loaded(tiny_base):
    loaded = load_model(tiny_base)
    loaded.model.eval()
    return loaded


def _question(raw):
    return parse_request(STATE, {"q": raw}).questions["q"]


def _joined_logits(loaded, parts) -> np.ndarray:
    return np.concatenate([z.numpy().astype(np.float64) for z in packed_logits(loaded.model, list(parts))])


@pytest.mark.parametrize("raw", [TONE, SQUEEZED], ids=["tone", "squeezed"])
def test_a_question_that_fits_is_read_in_layas_own_sequence_bit_for_bit(loaded, raw):
    from laya.common import build_head, build_sequence

    question = _question(raw)
    internal, qtype = internal_question(question), QUESTION_TYPE_IDS["choice"]
    ids, markers = build_sequence(loaded.tokenizer, STATE, internal, loaded.max_len, loaded.head_max_len)
    parts = question_parts(loaded, question, state_token_ids(loaded, STATE))
    assert parts == (Part(tuple(ids), tuple(markers), qtype),)
    if raw is SQUEEZED:
        assert build_head(loaded.tokenizer, internal, loaded.head_max_len)[2]["tokens_per_option"] is not None

    logits = packed_logits(loaded.model, list(parts))[0].numpy().astype(np.float64)
    expected = softmax(logits, temperature_for(loaded.config, qtype, len(logits)))
    assert np.array_equal(predict(loaded, STATE, {"q": raw})["q"], expected)


def test_too_many_options_are_read_in_several_ordinary_laya_sequences(loaded):
    from laya.common import build_head, build_sequence

    question = _question(MANY)
    internal, state = internal_question(question), tuple(state_token_ids(loaded, STATE))
    parts = question_parts(loaded, question, list(state))
    assert len(parts) > 2 and sum(len(part.markers) for part in parts) == MAX_CHOICE_OPTIONS
    start = 0
    for part in parts:
        run = list(range(start, start + len(part.markers)))
        ids, markers = build_sequence(
            loaded.tokenizer, STATE, internal, loaded.max_len, loaded.head_max_len, option_order=run
        )
        assert part == Part(tuple(ids), tuple(markers), QUESTION_TYPE_IDS["choice"])
        head, _markers, stats = build_head(loaded.tokenizer, internal, loaded.head_max_len, option_order=run)
        assert stats["tokens_per_option"] is None and len(head) <= loaded.head_max_len + 3  # options whole
        assert part.ids[: markers[0]] == parts[0].ids[: parts[0].markers[0]]  # the same question, uncut
        assert part.ids[len(head) :] == (*state, loaded.tokenizer.sep_token_id)  # and the whole state
        start += len(part.markers)


def test_the_parts_take_one_softmax_with_the_calibration_applied_once(loaded):
    parts = question_parts(loaded, _question(MANY), state_token_ids(loaded, STATE))
    joined = _joined_logits(loaded, parts)
    tempered = replace(loaded, config={**loaded.config, "temperature_by_options": {"choice:11+": 2.5}})
    p = predict(tempered, STATE, {"q": MANY})["q"]
    assert len(p) == MAX_CHOICE_OPTIONS and p.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(p, softmax(joined, 2.5), rtol=1e-9)
    assert p[: len(parts[0].markers)].sum() < 0.9, "the first part was normalised on its own"

    own = Calibrator(QUESTION_TEMPERATURE, questions={"q": QuestionTransform(0, MAX_CHOICE_OPTIONS, 3.0)})
    np.testing.assert_allclose(
        predict(replace(loaded, calibrator=own), STATE, {"q": MANY})["q"], softmax(joined, 3.0), rtol=1e-9
    )


def test_a_fitting_question_answers_the_same_beside_a_split_one(loaded):
    together = predict(loaded, STATE, {"tone": TONE, "many": MANY})
    np.testing.assert_allclose(together["tone"], predict(loaded, STATE, {"tone": TONE})["tone"], atol=1e-6)
    np.testing.assert_allclose(together["many"], predict(loaded, STATE, {"many": MANY})["many"], atol=1e-6)


@pytest.mark.slow
def test_sixty_four_questions_with_long_option_lists_are_answered_and_every_token_counted(loaded):
    questions = {
        f"q{k}": {
            "type": "choice",
            "instructions": f"which item {k}",
            "criteria": [f"item {k} {i}" for i in range(64 + k)],
        }
        for k in range(MAX_QUESTIONS)
    }
    request = parse_request(STATE, questions)
    (answered,) = LayaFamily().answer(loaded, [request])
    assert isinstance(answered, Answered) and list(answered.answers) == list(questions)
    for qid, answer in answered.answers.items():
        assert list(answer["probabilities"]) == questions[qid]["criteria"]
        assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=MAX_CHOICE_OPTIONS * 5e-5)
    items = request_items(loaded, request.state, list(request.questions.values()))
    assert answered.input_tokens == sum(len(part) for item in items for part in item.parts)
    assert (
        all(len(item.parts) > 1 for item in items) and answered.input_tokens > MAX_QUESTIONS * loaded.max_len
    )


def test_options_that_do_not_fit_even_one_run_per_sequence_are_a_clear_bad_question(loaded):
    cramped = replace(loaded, config={**loaded.config, "max_len": 40})
    with pytest.raises(BadQuestion, match=r"questions\.q: option \d+ does not fit a sequence of max_len=40"):
        predict(cramped, STATE, {"q": MANY})
    fine, bad = LayaFamily().answer(
        cramped, [parse_request(STATE, {"t": TONE}), parse_request(STATE, {"q": MANY})]
    )
    assert isinstance(fine, Answered) and isinstance(bad, BadQuestion) and bad.question_id == "q"


def _many_rows(n: int, options: int = MAX_CHOICE_OPTIONS) -> list[dict]:
    states = ["the order was late", "great product", "the box was broken", "fine okay"]
    many = {**MANY, "criteria": MANY["criteria"][:options]}
    return [
        {
            "state": states[i % len(states)],
            "questions": {"q": many, "tone": TONE},
            "gold": {"q": f"product {7 * i % 40}", "tone": "neutral"},
        }
        for i in range(n)
    ]


def test_a_split_decision_is_scored_and_trained_through_one_softmax(loaded):
    items, skipped = build_items(validate_rows(_many_rows(2)).records, loaded)
    split = [item for item in items if item.question_id == "q"]
    assert skipped == {} and len(split) == 2 and all(len(item.parts) > 2 for item in split)

    batch = collate(items, loaded.tokenizer.pad_token_id)
    expected = 0.0
    for item in items:
        parts = decision_logits(loaded.model, collate_parts(list(item.parts), loaded.tokenizer.pad_token_id))
        z = torch.cat([row[: len(part.markers)] for row, part in zip(parts, item.parts)])
        expected -= torch.log_softmax(z, -1)[item.label].item()
    assert summed_loss(loaded.model, batch, None).item() == pytest.approx(expected, rel=1e-5)

    decisions, logits = LayaFamily().score(loaded, items, CPU)
    for item, decision, z in zip(items, decisions, logits):
        assert len(z) == len(decision.target) == len(item.target)
    np.testing.assert_allclose(logits[0], _joined_logits(loaded, items[0].parts), atol=1e-5)


def test_training_on_split_decisions_lowers_their_loss(tiny_base):
    loaded = load_model(tiny_base)
    items, _skipped = build_items(validate_rows(_many_rows(8, options=48)).records, loaded)
    assert all(len(item.parts) > 1 for item in items if item.question_id == "q")
    config = TrainConfig(
        method="full",
        micro_batch=4,
        grad_accum=2,
        full_lr=1e-3,
        head_lr=1e-3,
        log_every=2,
        precision="fp32",
        max_steps=12,
        epochs=12,
    )
    task = laya_batch_task(loaded.tokenizer.pad_token_id)
    result = train(loaded.model, items, config, CPU, task)
    assert result.losses[-1][1] < 0.8 * result.losses[0][1], result.losses
    assert all(torch.isfinite(p).all() for p in loaded.model.parameters())


@pytest.mark.parametrize("levels", [1, 10])
def test_score_questions_of_one_to_ten_levels(loaded, levels):
    raw = {
        "type": "score",
        "instructions": "how late",
        "criteria": [f"level text {i}" for i in range(levels)],
    }
    cold = replace(loaded, config={**loaded.config, "temperature": [1.0, 0.5, 1.0]})
    (answered,) = LayaFamily().answer(cold, [parse_request(STATE, {"s": raw})])
    answer = answered.answers["s"]
    assert list(answer["probabilities"]) == [str(i) for i in range(levels)]
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0, abs=levels * 5e-5)
    if levels == 1:
        assert predict(cold, STATE, {"s": raw})["s"].tolist() == [1.0]
        assert (
            answer["probabilities"] == {"0": 1.0} and answer["score"] == 0.0 and answer["confidence"] == 1.0
        )


def test_a_one_level_score_trains_and_calibrates(loaded):
    raw = {"type": "score", "instructions": "how late", "criteria": ["late"]}
    rows = [
        {"state": s, "questions": {"s": raw}, "gold": {"s": 0}} for s in ("late", "fine", "okay", "great")
    ]
    items, skipped = build_items(validate_rows(rows).records, loaded)
    assert skipped == {} and len(items) == 4
    assert summed_loss(loaded.model, collate(items, loaded.tokenizer.pad_token_id), None).item() == 0.0
    decisions, logits = LayaFamily().score(loaded, items, CPU)
    calibration = fit_calibration(decisions, logits, min_decisions=2)
    assert all(np.isfinite(calibration.temperatures))
    assert [p.tolist() for p in LayaFamily().served_probabilities(loaded, decisions, logits)] == [[1.0]] * 4
