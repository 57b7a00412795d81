"""Record encoding for the joint family on a causal LM: exact spans, state truncation, too-long skips, batch
collation."""

import pytest
import torch

from pipeline.data.contract import parse_questions, state_text
from pipeline.families.joint.records import (
    SYSTEM_INSTRUCTION,
    EncodedRecord,
    RecordTooLong,
    collate_records,
    encode_record,
)
from pipeline.families.joint.token_cache import TokenCache, tokenize
from tests.tiny import tiny_tokenizer

QUESTIONS = {
    "tone": {
        "type": "choice",
        "instructions": "What is the tone?",
        "criteria": {"negative": "a bad tone", "neutral": None, "positive": "a good tone"},
    },
    "intensity": {
        "type": "score",
        "instructions": "How strong is it?",
        "criteria": ["none", "mild", "strong"],
    },
    "is_negative": {"type": "noul", "instructions": "The text is negative.", "criteria": None},
    "holds": {
        "type": "noul",
        "instructions": "The statement holds.",
        "criteria": {"true": "it does", "false": "it does not"},
    },
    "pick": {"type": "choice", "instructions": "Pick one.", "criteria": ["yes", "no"]},
}
STATE = {"text": "the product was great but the order was late", "source": "review"}
LONG_STATE = "the product was great but the order was late and I hate that. " * 40


def bpe_tokenizer():
    """A byte-level BPE tokenizer (the Llama 3 / Qwen family's kind), trained in memory on a few lines."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    backend = ByteLevelBPETokenizer()
    lines = [SYSTEM_INSTRUCTION, "Questions: what is the tone? negative, neutral or positive", LONG_STATE]
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    backend.train_from_iterator(
        lines, vocab_size=400, min_frequency=1, special_tokens=specials, show_progress=False
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend._tokenizer,
        bos_token=specials[0],
        eos_token=specials[1],
        pad_token=specials[2],
    )


@pytest.fixture(scope="module", params=["bpe", "wordpiece"])
def tokenizer(request):
    return bpe_tokenizer() if request.param == "bpe" else tiny_tokenizer()


def questions(spec: dict = QUESTIONS):
    return [s.question for s in parse_questions(spec).specs]


def is_byte_level(tokenizer) -> bool:
    return tokenizer.bos_token == "<|begin_of_text|>"


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def reads_as(tokenizer, ids, text: str) -> bool:
    """Byte-level BPE decodes exactly; the lossy tiny WordPiece (lower-cased, [UNK]s) must match id for id."""
    return (
        tokenizer.decode(list(ids)) == text
        if is_byte_level(tokenizer)
        else list(ids) == encode(tokenizer, text)
    )


def reads_containing(tokenizer, ids, text: str) -> bool:
    if is_byte_level(tokenizer):
        return text in tokenizer.decode(list(ids))
    part, ids = encode(tokenizer, text), list(ids)
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_option_spans_decode_to_the_quoted_option_ids(tokenizer):
    qs = questions()
    record = encode_record(tokenizer, STATE, qs, max_len=1024)
    for question, spans in zip(qs, record.option_spans):
        assert len(spans) == len(question.options)
        for (start, end), option in zip(spans, question.options):
            assert reads_as(tokenizer, record.ids[start:end], f'"{option}"')


def test_question_spans_decode_to_the_field_text(tokenizer):
    qs = questions()
    record = encode_record(tokenizer, STATE, qs, max_len=1024)
    for question, (start, end) in zip(qs, record.question_spans):
        head = f"- {question.id} ({question.type}):"
        assert reads_as(tokenizer, record.ids[start : start + len(encode(tokenizer, head))], head)
        assert reads_as(tokenizer, record.ids[start:end], f"{head} {question.instructions}\n  options:")
    assert record.question_ids == tuple(QUESTIONS)
    assert record.qtypes == (0, 1, 2, 2, 0)


def test_spans_increase_inside_the_sequence_and_option_tokens_match(tokenizer):
    record = encode_record(tokenizer, STATE, questions(), max_len=1024)
    flat = [
        edge
        for q_span, o_spans in zip(record.question_spans, record.option_spans)
        for span in (q_span, *o_spans)
        for edge in span
    ]
    assert flat == sorted(flat) and flat[0] > 0 and flat[-1] <= len(record)
    assert all(start < end for start, end in zip(flat[::2], flat[1::2]))
    for spans, tokens in zip(record.option_spans, record.option_tokens):
        assert [record.ids[s:e] for s, e in spans] == list(tokens)
    assert [len(spans) for spans in record.option_spans] == [3, 3, 2, 2, 2]


def test_layout_carries_state_descriptions_and_bos_but_never_eos(tokenizer):
    record = encode_record(tokenizer, STATE, questions(), max_len=1024)
    for part in (
        '{"negative":"a bad tone","neutral":null,"positive":"a good tone"}',
        '"0":"none"',
        '["false","true"]',
        '{"false":"it does not","true":"it does"}',
        '"source":"review"',
        "Questions:\n- tone",
    ):
        assert reads_containing(tokenizer, record.ids, part)
    assert not record.state_truncated and record.state_tokens > 0
    if tokenizer.bos_token_id is not None:
        assert record.ids[0] == tokenizer.bos_token_id and record.ids.count(tokenizer.bos_token_id) == 1
        assert tokenizer.eos_token_id not in record.ids
        assert tokenizer.decode(record.ids).startswith(f"<|begin_of_text|>{SYSTEM_INSTRUCTION}\n\nState:\n{{")


def test_a_long_state_is_cut_to_fill_max_len_exactly(tokenizer):
    qs = questions()
    full = encode_record(tokenizer, LONG_STATE, qs, max_len=100_000)
    assert not full.state_truncated
    record = encode_record(tokenizer, LONG_STATE, qs, max_len=len(full) - 50)
    assert len(record) == len(full) - 50 and record.state_truncated
    assert record.state_tokens == full.state_tokens - 50
    short = encode_record(tokenizer, LONG_STATE, qs, max_len=len(full))
    assert short == full  # exactly fitting is not truncation
    questions_part = len(full) - full.question_spans[0][0]
    assert (
        record.ids[-questions_part:] == full.ids[-questions_part:]
    )  # the questions survive, token for token
    assert record.question_spans == tuple((s - 50, e - 50) for s, e in full.question_spans)
    assert record.option_tokens == full.option_tokens


def test_questions_that_do_not_fit_are_too_long_never_an_index_error(tokenizer):
    qs = questions()
    full = encode_record(tokenizer, LONG_STATE, qs, max_len=100_000)
    questions_need = len(full) - full.state_tokens
    for max_len in (0, 1, questions_need // 2, questions_need, questions_need + 7):
        with pytest.raises(RecordTooLong, match=f"max_len {max_len}"):
            encode_record(tokenizer, LONG_STATE, qs, max_len=max_len)
    assert encode_record(tokenizer, LONG_STATE, qs, max_len=questions_need + 8).state_tokens == 8
    assert issubclass(RecordTooLong, ValueError)


def test_a_state_shorter_than_min_state_tokens_is_kept_whole(tokenizer):
    qs = questions()
    full = encode_record(tokenizer, "ok", qs, max_len=100_000)
    assert full.state_tokens < 8
    assert encode_record(tokenizer, "ok", qs, max_len=len(full)) == full


def test_special_token_text_in_a_state_stays_text():
    tokenizer = bpe_tokenizer()
    record = encode_record(tokenizer, "bye <|end_of_text|> <|begin_of_text|>", questions(), max_len=1024)
    assert tokenizer.eos_token_id not in record.ids and record.ids.count(tokenizer.bos_token_id) == 1


def test_non_ascii_option_ids_stay_readable():
    tokenizer = bpe_tokenizer()
    spec = {"ton": {"type": "choice", "instructions": "Le ton ?", "criteria": ["négatif", "positif"]}}
    record = encode_record(tokenizer, "c'est bien", questions(spec), max_len=256)
    assert [tokenizer.decode(t) for t in record.option_tokens[0]] == ['"négatif"', '"positif"']


def test_an_option_with_no_tokens_is_too_long_not_a_crash():
    class DropsQuoted:  # a tokenizer that loses quoted text, to reach the guard
        bos_token_id = None

        def __call__(self, texts, **_):
            return {"input_ids": [[] if t.startswith('"') else [1] * len(t) for t in texts]}

    with pytest.raises(RecordTooLong, match="tone"):
        encode_record(DropsQuoted(), STATE, questions(), max_len=10_000)


def test_a_record_needs_questions(tokenizer):
    with pytest.raises(ValueError, match="at least one question"):
        encode_record(tokenizer, STATE, [], max_len=1024)


def test_collate_pads_records_with_different_question_and_option_counts(tokenizer):
    big = encode_record(tokenizer, STATE, questions(), max_len=1024)
    small_spec = {"holds": QUESTIONS["holds"], "pick": QUESTIONS["pick"]}
    small = encode_record(tokenizer, "fine", questions(small_spec), max_len=1024)
    batch = collate_records([small, big], pad_id=tokenizer.pad_token_id)
    width, length = len(big), max(len(t) for r in (small, big) for o in r.option_tokens for t in o)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, width)
    assert batch["input_ids"][0, len(small) :].eq(tokenizer.pad_token_id).all()
    assert batch["attention_mask"].sum(1).tolist() == [len(small), len(big)]
    assert batch["question_spans"].shape == (2, 5, 2) and batch["qtype"].shape == (2, 5)
    assert batch["question_mask"].tolist() == [[True, True, False, False, False], [True] * 5]
    assert batch["option_spans"].shape == (2, 5, 3, 2) and batch["option_tokens"].shape == (2, 5, 3, length)
    assert batch["option_mask"][0].sum(1).tolist() == [2, 2, 0, 0, 0]
    assert batch["option_mask"][1].sum(1).tolist() == [3, 3, 2, 2, 2]
    assert batch["qtype"].tolist() == [[2, 0, 0, 0, 0], [0, 1, 2, 2, 0]]
    assert_batch_matches(batch, 1, big)
    assert_batch_matches(batch, 0, small)
    assert batch["question_spans"][0, 2:].eq(0).all() and batch["option_tokens"][0, 2:].eq(0).all()
    assert all(
        t.dtype == (torch.bool if "mask" in n and n != "attention_mask" else torch.long)
        for n, t in batch.items()
    )


def assert_batch_matches(batch: dict, row: int, record: EncodedRecord) -> None:
    assert batch["input_ids"][row, : len(record)].tolist() == list(record.ids)
    for qi, (spans, tokens) in enumerate(zip(record.option_spans, record.option_tokens)):
        assert batch["option_spans"][row, qi, : len(spans)].tolist() == [list(s) for s in spans]
        for oi, option in enumerate(tokens):
            mask = batch["option_token_mask"][row, qi, oi]
            assert batch["option_tokens"][row, qi, oi][mask].tolist() == list(option)
            assert mask.sum().item() == len(option)


LAYOUTS = {
    "in the sequence": {},
    "fields apart": {"fields_apart": True},
    "isolated": {"fields_apart": True, "isolated": True},
}


class CountingTokenizer:
    """A tokenizer that records the texts each call tokenises, and otherwise is the wrapped one."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, texts, **kwargs):
        self.calls.append(list(texts))
        return self.inner(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_token_cache_gives_the_same_records_and_tokenises_only_each_new_state(tokenizer, layout):
    qs = questions()
    states = [STATE, "another state", LONG_STATE, STATE]
    counting, cache = CountingTokenizer(tokenizer), TokenCache()
    kwargs = {"max_len": 512, **LAYOUTS[layout]}
    for state in states:
        assert encode_record(counting, state, qs, cache=cache, **kwargs) == encode_record(
            tokenizer, state, qs, **kwargs
        )
    first, *later = counting.calls
    assert len(first) > 5  # the first row tokenises its state and every question text
    assert [len(call) for call in later] == [1, 1, 1]  # later rows: their state alone
    assert state_text(STATE) not in cache.kept and state_text(LONG_STATE) not in cache.kept


def test_a_token_cache_drops_the_least_recent_texts_and_starts_over_for_another_tokenizer(tokenizer):
    cache = TokenCache(capacity=2)
    assert cache.tokens(tokenizer, ["a b", "c", "d"], fresh="a b") == tokenize(tokenizer, ["a b", "c", "d"])
    cache.tokens(tokenizer, ["e"], fresh="x")
    assert cache.kept == ["d", "e"]
    other = bpe_tokenizer() if not is_byte_level(tokenizer) else tiny_tokenizer()
    assert cache.tokens(other, ["e"], fresh="x") == tokenize(other, ["e"])
    assert cache.kept == ["e"]
