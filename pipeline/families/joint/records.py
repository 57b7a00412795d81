"""Encode one decision row ("record") as a single token sequence for the joint family's head.

The joint family reads every question of a row in one backbone pass (a causal LM or an encoder), then pools
the hidden states over each question's field text and each option's id text. The layout is built from
separately tokenised pieces whose ids are concatenated, so every recorded span is exact by construction:

    [BOS] <SYSTEM_INSTRUCTION>\\n\\nState:\\n<state text>\\n\\nQuestions:\\n
    - <id> (<type>): <instructions>\\n  options: ["<option>",...] or {"<option>":"<description>"|null,...}\\n

The question span is the `- <id> ... options:` piece; an option's span is the tokens of its quoted id (JSON
text, non-ASCII kept).

On an encoder the questions can also be read apart from the state (`encode_record(..., fields_apart=True)`):
the state is its own sequence `[CLS] <state text> [SEP]`, and the questions are one field sequence `[CLS]
Questions:\n- <id> ... [SEP]` that every row with the same questions shares, so a batch encodes it once (and a
frozen backbone once per run). The spans then index the field sequence; the head lets the question and option
fields attend to the state's hidden states. A row then costs its state's tokens, not its questions'. The
options are compact JSON: a list of ids, or an object of id to description (null where an option has none)
when any option is described. The state gets whatever is left of `max_len` after the questions and keeps its
first tokens when too long (`contract.STATE_TRUNCATION`; each record says how many it kept of how many,
`state_tokens` of `state_length`).

Questions isolated (every fresh head since the Decision API's invariance contract, `encode_row`): no question
id is written; on an encoder each question and each option is a field sequence of its own (`encode_isolated`),
on a causal LM each question is a record of its own, its options spread over several where they do not fit.

    record = encode_record(tokenizer, state, questions, max_len=2048)
    batch = collate_records([record, ...], pad_id=tokenizer.pad_token_id)
    records = encode_row(tokenizer, state, questions, loaded.layout)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import orjson
import torch

from pipeline.data.contract import QUESTION_TYPE_IDS, Question, state_text
from pipeline.families.base import cut_state
from pipeline.families.joint.token_cache import TokenCache, tokenize

SYSTEM_INSTRUCTION = "Answer each question about the state. Each question lists its allowed options."
_STATE_OPEN = "\n\nState:\n"
_QUESTIONS_OPEN = "\n\nQuestions:\n"

Span = tuple[int, int]


class RecordTooLong(ValueError):
    """The questions alone do not fit in max_len (a `too_long` skip, never a crash)."""


@dataclass(frozen=True, slots=True)
class EncodedRecord:
    """One row as one token sequence, with the [start, end) token spans a head pools over."""

    ids: tuple[int, ...]  # the whole sequence
    question_spans: tuple[Span, ...]  # per question: its field text (id, type, instructions)
    option_spans: tuple[tuple[Span, ...], ...]  # per question, per option (model order): the quoted id
    option_tokens: tuple[tuple[tuple[int, ...], ...], ...]  # per question, per option: ids[start:end]
    qtypes: tuple[int, ...]  # pipeline.data.contract.QUESTION_TYPE_IDS
    question_ids: tuple[str, ...]
    state_tokens: int  # state tokens kept
    # Not compared (two records of the same tokens are the same record, whatever room they had): the state's
    # tokens as serialised (`state_text`) before the cut, and the room the sequence leaves it (`cut_state`).
    state_length: int = field(compare=False)
    state_room: int = field(compare=False)
    field_ids: tuple[int, ...] | None = (
        None  # fields apart: the questions' own sequence, which the spans index
    )
    # Questions isolated, on an encoder: per question, its own sequence then one per option; each question's
    # span indexes its own sequence, each option's span its option's sequence.
    field_sequences: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def state_truncated(self) -> bool:
        return self.state_tokens < self.state_length

    @property
    def fields_apart(self) -> bool:
        return self.field_ids is not None or self.field_sequences is not None

    @property
    def tokens_read(self) -> int:
        """Every token the backbone reads for this record: the state's sequence and every field sequence."""
        fields = len(self.field_ids or ()) + sum(len(s) for q in self.field_sequences or () for s in q)
        return len(self.ids) + fields


def encode_record(
    tokenizer: Any,
    state: Any,
    questions: list[Question],
    max_len: int,
    min_state_tokens: int = 8,
    fields_apart: bool = False,
    fields_max_len: int | None = None,
    isolated: bool = False,
    state_windows: int = 1,
    cache: TokenCache | None = None,
) -> EncodedRecord:
    """Encode a row's state and all its questions into at most `max_len` tokens (each sequence, fields apart).

    `isolated`: no question id is written (a question is its type, instructions and options); fields apart,
    each question and each option gets a sequence of its own (`encode_isolated`); in the sequence, call it
    with one question per record (`encode_row`). `state_windows` (fields apart only): windows of `max_len` the
    state may fill (`windowed_state`). `cache`: the question texts' ids kept from row to row (a server's, a
    run's).

    Raises RecordTooLong when the questions leave fewer than `min_state_tokens` for the state (or fewer than
    the whole state, when it is shorter), when the questions alone exceed `max_len` (fields apart), or when an
    option's id tokenises to nothing.
    """
    if not questions:
        raise ValueError("a record needs at least one question")
    if fields_apart and isolated:
        return encode_isolated(
            tokenizer, state, questions, max_len, fields_max_len or max_len, state_windows, cache
        )
    if fields_apart:
        return _encode_apart(
            tokenizer, state, questions, max_len, fields_max_len or max_len, state_windows, cache
        )
    pieces = [_question_pieces(q, with_id=not isolated) for q in questions]
    texts = [SYSTEM_INSTRUCTION + _STATE_OPEN, state_text(state), _QUESTIONS_OPEN]
    texts += [text for question in pieces for text, _ in question]
    tokens = _tokenize(tokenizer, texts, texts[1], cache)
    # A causal LM's sequence opens with its BOS token, an encoder's with its CLS token (what it was trained
    # on).
    opener = (
        tokenizer.bos_token_id
        if tokenizer.bos_token_id is not None
        else getattr(tokenizer, "cls_token_id", None)
    )
    bos = [opener] if opener is not None else []
    prefix, state_ids = bos + tokens[texts[0]], tokens[texts[1]]
    fixed = len(prefix) + len(tokens[_QUESTIONS_OPEN]) + sum(len(tokens[t]) for q in pieces for t, _ in q)
    kept = _state_budget(max_len - fixed, len(state_ids), min_state_tokens, fixed, max_len)
    ids = prefix + cut_state(state_ids, kept) + tokens[_QUESTIONS_OPEN]
    question_spans, option_spans = [], []
    for question, question_pieces in zip(questions, pieces):
        question_span, spans = _append_question(ids, question_pieces, tokens, question.id)
        question_spans.append(question_span)
        option_spans.append(spans)
    return EncodedRecord(
        ids=tuple(ids),
        question_spans=tuple(question_spans),
        option_spans=tuple(option_spans),
        option_tokens=tuple(tuple(tuple(ids[s:e]) for s, e in spans) for spans in option_spans),
        qtypes=tuple(QUESTION_TYPE_IDS[q.type] for q in questions),
        question_ids=tuple(q.id for q in questions),
        state_tokens=kept,
        state_length=len(state_ids),
        state_room=max_len - fixed,
    )


def _encode_apart(
    tokenizer: Any,
    state: Any,
    questions: list[Question],
    max_len: int,
    fields_max_len: int,
    state_windows: int = 1,
    cache: TokenCache | None = None,
) -> EncodedRecord:
    pieces = [_question_pieces(q) for q in questions]
    texts = [state_text(state), _QUESTIONS_OPEN.lstrip()] + [text for q in pieces for text, _ in q]
    tokens = _tokenize(tokenizer, texts, texts[0], cache)
    cls, sep = _encoder_bounds(tokenizer)
    room = max(0, max_len - len(cls) - len(sep))
    state_ids = cut_state(tokens[texts[0]], room * state_windows)
    fields = cls + tokens[texts[1]]
    question_spans, option_spans = [], []
    for question, question_pieces in zip(questions, pieces):
        question_span, spans = _append_question(fields, question_pieces, tokens, question.id)
        question_spans.append(question_span)
        option_spans.append(spans)
    fields += sep
    if len(fields) > fields_max_len:
        raise RecordTooLong(f"the questions need {len(fields)} tokens, more than {fields_max_len}")
    return EncodedRecord(
        ids=windowed_state(state_ids, cls, sep, room),
        question_spans=tuple(question_spans),
        option_spans=tuple(option_spans),
        option_tokens=tuple(tuple(tuple(fields[s:e]) for s, e in spans) for spans in option_spans),
        qtypes=tuple(QUESTION_TYPE_IDS[q.type] for q in questions),
        question_ids=tuple(q.id for q in questions),
        state_tokens=len(state_ids),
        state_length=len(tokens[texts[0]]),
        state_room=room * state_windows,
        field_ids=tuple(fields),
    )


def encode_row(
    tokenizer: Any,
    state: Any,
    questions: list[Question],
    layout: RecordLayout,
    cache: TokenCache | None = None,
) -> list[EncodedRecord]:
    """A row's records as `layout` reads it: one record, or one per question (isolated in the sequence: a
    causal LM reads each question after the state alone, so no question sees another). `cache`: as
    `encode_record`."""
    encode = partial(
        encode_record,
        tokenizer,
        state,
        max_len=layout.max_len,
        fields_apart=layout.fields_apart,
        fields_max_len=layout.fields_max_len,
        isolated=layout.isolated,
        state_windows=layout.state_windows,
        cache=cache,
    )
    if layout.isolated and not layout.fields_apart:
        return [part for question in questions for part in _option_runs(encode, question)]
    return [encode(questions)]


def _option_runs(encode, question: Question) -> list[EncodedRecord]:
    """One record for the question, or, where its options do not fit one sequence, one per consecutive run of
    them (halved until each fits): the records share the question's id, and a reader joins their option logits
    into one softmax (`joined_logits`)."""
    try:
        return [encode([question])]
    except RecordTooLong:
        if len(question.options) < 2:
            raise
    half = len(question.options) // 2
    runs = []
    for part in (slice(0, half), slice(half, None)):
        runs += _option_runs(
            encode,
            replace(question, options=question.options[part], descriptions=question.descriptions[part]),
        )
    return runs


def joined_logits(
    records: list[EncodedRecord], logits: list[list[np.ndarray]]
) -> dict[str, tuple[int, np.ndarray]]:
    """Per question id: its type and its option logits, a question spread over several records joined in
    order."""
    joined: dict[str, tuple[int, list[np.ndarray]]] = {}
    for record, per_question in zip(records, logits):
        for qid, qtype, z in zip(record.question_ids, record.qtypes, per_question):
            joined.setdefault(qid, (qtype, []))[1].append(z)
    return {qid: (qtype, np.concatenate(parts)) for qid, (qtype, parts) in joined.items()}


@dataclass(frozen=True, slots=True)
class RecordLayout:
    """How a joint model reads a row: the state's window, the questions apart or in the sequence, isolated or
    not."""

    max_len: int
    fields_apart: bool = False
    fields_max_len: int | None = None
    isolated: bool = False
    state_windows: int = 1
    """Fields apart: a long state fills up to this many sequences of `max_len` (`windowed_state`)."""


def windowed_state(state_ids: list[int], cls: list[int], sep: list[int], room: int) -> tuple[int, ...]:
    """The state's sequence: `[CLS] <room tokens> [SEP]` per window, one after another in one flat sequence.

    Every window but the last is exactly `room` + 2 tokens (the layout's `max_len`), so the backbone finds
    them again at fixed strides (`head.by_windows`) and reads each as a sequence of its own; a state that fits
    is one window, as it always was. The head pools and attends over the windows' hidden states together.
    """
    if not state_ids or room <= 0:
        return tuple(cls + sep)
    pieces = (cls + state_ids[start : start + room] + sep for start in range(0, len(state_ids), room))
    return tuple(token for piece in pieces for token in piece)


def encode_isolated(
    tokenizer: Any,
    state: Any,
    questions: list[Question],
    max_len: int,
    fields_max_len: int,
    state_windows: int = 1,
    cache: TokenCache | None = None,
) -> EncodedRecord:
    """Fields apart and isolated: the state's sequence `[CLS] <state> [SEP]`; per question a sequence `[CLS]
    (<type>): <instructions> [SEP]`, and per option `[CLS] (<type>): <instructions> option: "<id>"[:
    "<description>"] [SEP]`. A question's field depends on its own text alone and an option's on its question
    and itself, so an answer cannot move with the question's id, the other questions, their order or how many
    options there are; each sequence is the same in every row that asks it (encoded once per batch,
    cacheable).
    """
    pieces = [_isolated_pieces(q) for q in questions]
    texts = [state_text(state)] + [t for question, options in pieces for t in (question, *_flat(options))]
    tokens = _tokenize(tokenizer, texts, texts[0], cache)
    cls, sep = _encoder_bounds(tokenizer)
    room = max(0, max_len - len(cls) - len(sep))
    state_ids = cut_state(tokens[texts[0]], room * state_windows)
    sequences, question_spans, option_spans = [], [], []
    for question, (question_text, options) in zip(questions, pieces):
        own, spans = _isolated_sequences_of(question.id, cls + tokens[question_text], options, tokens, sep)
        _check_fits(question.id, own, fields_max_len)
        sequences.append(own)
        question_spans.append((len(cls), len(cls) + len(tokens[question_text])))
        option_spans.append(spans)
    return EncodedRecord(
        ids=windowed_state(state_ids, cls, sep, room),
        question_spans=tuple(question_spans),
        option_spans=tuple(option_spans),
        option_tokens=tuple(
            tuple(seqs[1 + i][s:e] for i, (s, e) in enumerate(spans))
            for seqs, spans in zip(sequences, option_spans)
        ),
        qtypes=tuple(QUESTION_TYPE_IDS[q.type] for q in questions),
        question_ids=tuple(q.id for q in questions),
        state_tokens=len(state_ids),
        state_length=len(tokens[texts[0]]),
        state_room=room * state_windows,
        field_sequences=tuple(sequences),
    )


_OPTION_OPEN = " option: "


def _isolated_sequences_of(
    question_id: str,
    opened: list[int],
    options: list[tuple[str, str]],
    tokens: dict[str, list[int]],
    sep: list[int],
) -> tuple[tuple[tuple[int, ...], ...], tuple[Span, ...]]:
    """A question's own sequence then one per option (`opened` is `[CLS]` and the question's text), and each
    option's span (its quoted id) in its sequence."""
    start = len(opened) + len(tokens[_OPTION_OPEN])
    sequences, spans = [tuple(opened + sep)], []
    for quoted, rest in options:
        if not tokens[quoted]:
            raise RecordTooLong(f"question {question_id!r}: option {quoted} tokenises to no tokens")
        spans.append((start, start + len(tokens[quoted])))
        sequences.append(tuple(opened + tokens[_OPTION_OPEN] + tokens[quoted] + tokens[rest] + sep))
    return tuple(sequences), tuple(spans)


def _isolated_pieces(question: Question) -> tuple[str, list[tuple[str, str]]]:
    """The question's text, and per option its quoted id and the text after it (its description, or
    nothing)."""
    options = [
        (_json(option), "" if description is None else ": " + _json(description))
        for option, description in zip(question.options, question.descriptions)
    ]
    return f"({question.type}): {question.instructions}", options


def _flat(options: list[tuple[str, str]]) -> list[str]:
    return [_OPTION_OPEN] + [text for pair in options for text in pair]


def _check_fits(question_id: str, sequences: list[tuple[int, ...]], fields_max_len: int) -> None:
    longest = max(len(s) for s in sequences)
    if longest > fields_max_len:
        raise RecordTooLong(
            f"question {question_id!r}: its text and longest option need {longest} tokens, "
            f"more than the model's {fields_max_len}"
        )


def _encoder_bounds(tokenizer: Any) -> tuple[list[int], list[int]]:
    """An encoder's opening and closing special tokens ([CLS] and [SEP] on BERT), what it was trained on."""
    cls, sep = getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None)
    return ([cls] if cls is not None else []), ([sep] if sep is not None else [])


def _question_pieces(question: Question, with_id: bool = True) -> list[tuple[str, str | None]]:
    """The question's text pieces in order, each tagged "question", "option" or None (not a span); `with_id`
    False leaves the question's id out (isolated questions: an answer must not move with its name)."""
    described = any(d is not None for d in question.descriptions)  # valid JSON: an object, or a list of ids
    opener, closer = (" {", "}\n") if described else (" [", "]\n")
    named = f"{question.id} " if with_id else ""
    pieces: list[tuple[str, str | None]] = [
        (f"- {named}({question.type}): {question.instructions}\n  options:", "question"),
        (opener, None),  # the space opens the next piece: byte-level BPE then reads " [" as it would in prose
    ]
    for i, (option, description) in enumerate(zip(question.options, question.descriptions)):
        if i:
            pieces.append((",", None))
        pieces.append((_json(option), "option"))
        if described:
            pieces.append((":" + orjson.dumps(description).decode(), None))
    pieces.append((closer, None))
    return pieces


def _json(value: str) -> str:
    # Same encoder as the state text: non-ASCII stays readable instead of becoming \u escapes.
    return orjson.dumps(value).decode()


def _tokenize(tokenizer: Any, texts: list[str], state: str, cache: TokenCache | None) -> dict[str, list[int]]:
    """Token ids of each distinct text: the texts other than `state` from `cache` where one is given."""
    return tokenize(tokenizer, texts) if cache is None else cache.tokens(tokenizer, texts, fresh=state)


def _state_budget(budget: int, state_len: int, min_state_tokens: int, fixed: int, max_len: int) -> int:
    """How many state tokens to keep, or RecordTooLong when the questions leave too little room."""
    if budget < max(0, min(min_state_tokens, state_len)):
        raise RecordTooLong(
            f"the questions need {fixed} tokens with the prompt, leaving {max(budget, 0)} of max_len "
            f"{max_len} for the state (min_state_tokens {min_state_tokens})"
        )
    return min(budget, state_len)


def _append_question(
    ids: list[int], pieces: list[tuple[str, str | None]], tokens: dict[str, list[int]], question_id: str
) -> tuple[Span, tuple[Span, ...]]:
    """Append one question's pieces to `ids`; return its question span and its option spans."""
    question_span, option_spans = (0, 0), []
    for text, kind in pieces:
        start = len(ids)
        ids.extend(tokens[text])
        if kind == "question":
            question_span = (start, len(ids))
        elif kind == "option":
            if len(ids) == start:
                raise RecordTooLong(f"question {question_id!r}: option {text} tokenises to no tokens")
            option_spans.append((start, len(ids)))
    return question_span, tuple(option_spans)


def collate_records(records: list[EncodedRecord], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad records into one batch: ids, attention mask, spans, qtypes, option tokens, and their
    masks."""
    n, width = len(records), max(len(r) for r in records)
    q = max(len(r.question_spans) for r in records)
    k = max(len(spans) for r in records for spans in r.option_spans)
    length = max(len(t) for r in records for options in r.option_tokens for t in options)
    batch = {
        "input_ids": np.full((n, width), pad_id, dtype=np.int64),
        "attention_mask": np.zeros((n, width), dtype=np.int64),
        "question_spans": np.zeros((n, q, 2), dtype=np.int64),
        "question_mask": np.zeros((n, q), dtype=bool),
        "option_spans": np.zeros((n, q, k, 2), dtype=np.int64),
        "option_mask": np.zeros((n, q, k), dtype=bool),
        "option_tokens": np.zeros((n, q, k, length), dtype=np.int64),
        "option_token_mask": np.zeros((n, q, k, length), dtype=bool),
        "qtype": np.zeros((n, q), dtype=np.int64),
    }
    for row, record in enumerate(records):
        _fill_row({name: array[row] for name, array in batch.items()}, record)
    if records[0].field_sequences is not None:
        batch |= _isolated_sequences(records, pad_id, q, k)
    elif records[0].fields_apart:
        batch |= _field_sequences(records, pad_id)
    return {name: torch.from_numpy(array) for name, array in batch.items()}


FieldKey = tuple[tuple[int, ...], Span]  # an isolated field sequence and the span its field pools


def field_keys(record: EncodedRecord) -> list[tuple[FieldKey, list[FieldKey]]]:
    """Per question of an isolated record: its own field sequence's key, and its options' keys in order."""
    return [
        ((sequences[0], span), list(zip(sequences[1:], spans)))
        for sequences, span, spans in zip(record.field_sequences, record.question_spans, record.option_spans)
    ]


def distinct_field_keys(records: list[EncodedRecord]) -> list[FieldKey]:
    """The batch's isolated field sequences, each once, in the order `collate_records` lays them out."""
    keys = (key for r in records for question, options in field_keys(r) for key in (question, *options))
    return list(dict.fromkeys(keys))


def _isolated_sequences(records: list[EncodedRecord], pad_id: int, q: int, k: int) -> dict[str, np.ndarray]:
    """Questions isolated: each distinct field sequence once [U, T] with the span its field pools [U, 2], and
    which one each question [B, Q] and each option [B, Q, K] reads (padding reads sequence 0, masked
    later)."""
    if not all(r.field_sequences is not None for r in records):
        raise ValueError("a batch mixes records with isolated questions and records without")
    where: dict[FieldKey, int] = {}
    question_field = np.zeros((len(records), q), dtype=np.int64)
    option_field = np.zeros((len(records), q, k), dtype=np.int64)
    for row, record in enumerate(records):
        for qi, (question_key, option_keys) in enumerate(field_keys(record)):
            question_field[row, qi] = where.setdefault(question_key, len(where))
            for oi, key in enumerate(option_keys):
                option_field[row, qi, oi] = where.setdefault(key, len(where))
    ids, mask = _padded([sequence for sequence, _ in where], pad_id)
    return {
        "field_input_ids": ids,
        "field_attention_mask": mask,
        "field_spans": np.array([span for _, span in where], dtype=np.int64).reshape(-1, 2),
        "question_field": question_field,
        "option_field": option_field,
    }


def _field_sequences(records: list[EncodedRecord], pad_id: int) -> dict[str, np.ndarray]:
    """Fields apart: each distinct field sequence once [U, Tq], and which one each row reads [B]."""
    if not all(r.fields_apart for r in records):
        raise ValueError("a batch mixes records with fields apart and fields in the sequence")
    distinct = list(dict.fromkeys(r.field_ids for r in records))
    ids, mask = _padded(distinct, pad_id)
    where = {field_ids: i for i, field_ids in enumerate(distinct)}
    index = np.array([where[r.field_ids] for r in records], dtype=np.int64)
    return {"field_input_ids": ids, "field_attention_mask": mask, "field_index": index}


def _padded(sequences: list[tuple[int, ...]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids [N, T] and their attention mask."""
    width = max(len(sequence) for sequence in sequences)
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    return ids, mask


def _fill_row(row: dict[str, np.ndarray], record: EncodedRecord) -> None:
    """Write one record into its (zeroed, padded) rows of the batch arrays; the arrays are views."""
    nq = len(record.question_spans)
    row["input_ids"][: len(record)] = record.ids
    row["attention_mask"][: len(record)] = 1
    row["question_spans"][:nq] = record.question_spans
    row["question_mask"][:nq] = True
    row["qtype"][:nq] = record.qtypes
    for qi, (spans, tokens) in enumerate(zip(record.option_spans, record.option_tokens)):
        row["option_spans"][qi, : len(spans)] = spans
        row["option_mask"][qi, : len(spans)] = True
        for oi, option in enumerate(tokens):
            row["option_tokens"][qi, oi, : len(option)] = option
            row["option_token_mask"][qi, oi, : len(option)] = True
