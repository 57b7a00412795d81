"""The joint family on an encoder reads the questions apart from the state: each row is `[CLS] state [SEP]`,
the questions one field sequence shared by every row that asks them, and `head` trains the decision head on
the frozen encoder's hidden states, computed once."""

from dataclasses import replace

import pytest
import torch

from pipeline.data.contract import Question
from pipeline.data.validate import validate_file
from pipeline.families.joint.records import RecordTooLong, collate_records, encode_record
from pipeline.families.joint.training import collate_examples
from pipeline.training.loop import train
from tests.tiny import JOINT_HEAD as HEAD
from tests.tiny import load_joint_on, write_learnable_rows

CPU = torch.device("cpu")
TONE = Question(
    "tone", "choice", "What is the tone?", ("negative", "neutral", "positive"), (None, None, None)
)
GOOD = Question("good", "noul", "The text is positive.", ("false", "true"), (None, None))


@pytest.fixture(scope="module")
def rows(tiny_base, tmp_path_factory):
    path = write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 32)
    return validate_file(path).records


def test_a_row_is_its_state_and_the_questions_are_a_shared_field_sequence(tiny_base):
    _, loaded = load_joint_on(tiny_base)
    tok = loaded.tokenizer
    assert loaded.fields_apart
    a = encode_record(tok, "great film", [TONE, GOOD], 96, fields_apart=True)
    b = encode_record(tok, "bad", [TONE, GOOD], 96, fields_apart=True)
    assert a.ids[0] == tok.cls_token_id and a.ids[-1] == tok.sep_token_id and len(a.ids) < len(a.field_ids)
    assert a.field_ids == b.field_ids and a.option_spans == b.option_spans
    for spans, tokens in zip(a.option_spans, a.option_tokens):
        assert [tuple(a.field_ids[s:e]) for s, e in spans] == list(tokens)
    batch = collate_records([a, b, encode_record(tok, "ok", [GOOD], 96, fields_apart=True)], tok.pad_token_id)
    assert batch["field_input_ids"].shape[0] == 2 and batch["field_index"].tolist() == [0, 0, 1]
    with pytest.raises(RecordTooLong, match="the questions need"):
        encode_record(tok, "ok", [TONE, GOOD], 12, fields_apart=True)


def test_a_rows_answer_does_not_depend_on_its_batch_mates_questions(tiny_base, rows):
    family, loaded = load_joint_on(tiny_base)
    examples, _ = family.build_examples(loaded, rows[:3])
    other, _ = family.build_examples(loaded, [replace(rows[3], decisions=rows[3].decisions[:1])])
    pad = loaded.tokenizer.pad_token_id
    with torch.no_grad():
        alone = loaded.model(collate_examples(examples[:1], pad))
        mixed = loaded.model(collate_examples([examples[0], other[0], examples[1]], pad))
    torch.testing.assert_close(mixed[0, : alone.shape[1], : alone.shape[2]], alone[0], atol=1e-5, rtol=1e-5)


def test_cached_features_give_the_live_forward_pass(tiny_base, rows):
    family, loaded = load_joint_on(tiny_base)
    examples, _ = family.build_examples(loaded, rows[:6])
    cached = family.training_examples(loaded, examples, HEAD, CPU)
    assert all(e.features is not None and e.features.state.dtype == torch.float16 for e in cached)
    pad = loaded.tokenizer.pad_token_id
    with torch.no_grad():
        live = loaded.model(collate_examples(examples, pad))
        from_cache = loaded.model(collate_examples(cached, pad))
    torch.testing.assert_close(from_cache, live, atol=2e-2, rtol=2e-2)  # fp16 features


def test_scoring_from_full_precision_features_scores_as_the_backbone_does(tiny_base, rows):
    """A fit scores its held-out and validation rows for the base, each candidate and the fine-tune from features
    computed once: the logits are the live model's."""
    family, loaded = load_joint_on(tiny_base)
    examples, _ = family.build_examples(loaded, rows[:12])
    scoring = family.scoring_examples(loaded, examples, HEAD, CPU)
    assert all(e.features is not None and e.features.state.dtype == torch.float32 for e in scoring)
    live, from_cache = (family.score(loaded, group, CPU, 8)[1] for group in (examples, scoring))
    assert len(live) == len(from_cache) == sum(len(e.targets) for e in examples)
    for a, b in zip(live, from_cache):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-5, rtol=1e-5)
    lora = replace(HEAD, method="lora")  # a backbone that trains: nothing to compute once
    assert family.scoring_examples(loaded, examples, lora, CPU) is examples


def test_head_trains_the_head_and_leaves_the_backbone_as_it_was(tiny_base, rows):
    family, loaded = load_joint_on(tiny_base)
    before = {n: p.clone() for n, p in loaded.model.lm.named_parameters()}
    head_before = {n: p.clone() for n, p in loaded.model.head.named_parameters()}
    examples, _ = family.build_examples(loaded, rows)
    family.prepare(loaded, HEAD)
    ready = family.training_examples(loaded, examples, HEAD, CPU)
    result = train(loaded.model, ready, HEAD, CPU, family.batch_task(loaded, HEAD))
    assert result.losses[-1][1] < 0.6 * result.losses[0][1], result.losses
    assert all(torch.equal(before[n], p) for n, p in loaded.model.lm.named_parameters())
    assert any(not torch.equal(head_before[n], p) for n, p in loaded.model.head.named_parameters())


def test_the_laya_family_refuses_head_by_name(tiny_base, tmp_path):
    from pipeline.config import ConfigError
    from pipeline.data.split import TrainSource
    from pipeline.training.fit import fit

    data = write_learnable_rows(tmp_path / "rows.jsonl", 8)
    with pytest.raises(ConfigError, match="laya family trains with"):
        fit(TrainSource(data).validated(), tiny_base, replace(HEAD, family="laya"))
