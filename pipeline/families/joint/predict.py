"""Answering with a joint model: a request's records (one per row, or one per question with questions isolated
in the sequence), shared forward passes, and the isolated questions' field vectors cached per question text.

results = answer_joint_requests(load_joint("models/decision-qwen3"), [parse_request(state, questions)])
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.data.answers import ParsedRequest, shape_answers
from pipeline.data.contract import Question, state_text
from pipeline.families.base import UNENCODABLE, Answered, BadQuestion, EncoderRun
from pipeline.families.forward_passes import (
    STATE_VECTOR_TOKENS,
    autocast_context,
    length_batches,
    mean_pooled,
)
from pipeline.families.joint.head import by_windows
from pipeline.families.joint.layout import LoadedJoint, temperature_of
from pipeline.families.joint.records import (
    EncodedRecord,
    RecordTooLong,
    collate_records,
    distinct_field_keys,
    encode_row,
    joined_logits,
)
from pipeline.scoring.calibrators import type_temperatures


def answer_joint_requests(
    loaded: LoadedJoint,
    requests: list[ParsedRequest],
    batch_size: int = 8,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> list[Answered | BadQuestion]:
    """Answer parsed requests in shared forward passes; a request that cannot be encoded fails alone.

    A question whose options were spread over several records gets one softmax over all of them. `usage`
    counts every token read: the state's sequences and every field sequence (cached or not).
    """
    encoded = [_encode(loaded, request) for request in requests]
    records = [record for entry in encoded if not isinstance(entry, BadQuestion) for record in entry]
    passed, vectors = record_pass(loaded, records, batch_size, dtype, encoder)
    logits, states = iter(passed), iter(vectors)
    calibrator = served_calibrator(loaded)
    results: list[Answered | BadQuestion] = []
    for request, entry in zip(requests, encoded):
        if isinstance(entry, BadQuestion):
            results.append(entry)
            continue
        joined = joined_logits(entry, [next(logits) for _ in entry])
        read = [next(states) for _ in entry]  # every record of a row reads the same state sequence
        state_vector = read[0]
        by_id = {qid: calibrator.probabilities(qtype, qid, z) for qid, (qtype, z) in joined.items()}
        answers = shape_answers(request.questions, by_id, request.legends)
        logits_by_id = {qid: z for qid, (_, z) in joined.items()}
        results.append(
            Answered(answers, sum(record.tokens_read for record in entry), state_vector, logits_by_id)
        )
    return results


def _encode(loaded: LoadedJoint, request: ParsedRequest) -> list[EncodedRecord] | BadQuestion:
    try:
        questions = list(request.questions.values())
        return encode_row(loaded.tokenizer, request.state, questions, loaded.layout, loaded.token_cache)
    except RecordTooLong as error:
        return BadQuestion(f"questions: {error}")
    except BadQuestion as error:
        return error
    except UNENCODABLE as error:  # the tokenizer refused this request's text: its own 422, not its batch's
        return BadQuestion(f"the tokenizer cannot encode this request: {type(error).__name__}: {error}")


def served_calibrator(loaded: LoadedJoint):
    """The export's calibrator, else its config's type temperatures."""
    return loaded.calibrator or type_temperatures(tuple(temperature_of(loaded.config, q) for q in range(3)))


def record_logits(
    loaded: LoadedJoint,
    records: list[EncodedRecord],
    batch_size: int = 8,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> list[list[np.ndarray]]:
    """Per record, per question: its options' raw logits (model order); `record_pass`'s logits."""
    return record_pass(loaded, records, batch_size, dtype, encoder)[0]


@torch.inference_mode()
def record_pass(
    loaded: LoadedJoint,
    records: list[EncodedRecord],
    batch_size: int = 8,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> tuple[list[list[np.ndarray]], list[np.ndarray | None]]:
    """Per record, per question: its options' raw logits (model order); and per record, where the state is
    read apart from the questions (`fields_apart`), its state vector from the same pass (the state sequence's
    hidden states averaged: what `joint_state_vectors` computes alone), else None.

    Records are grouped by length, so a pass pads little; padding is masked, so a record's answer does not
    depend on what it was batched with (beyond float rounding). Isolated field vectors come from the model's
    field cache. `encoder` (another runtime's pass of `model.hidden_states`) reads the sequences when given;
    the head runs here either way.
    """
    model = loaded.model
    if model.training:  # eval() walks every module: 1.7 ms a call, so only when it changes anything
        model.eval()
    device = next(model.parameters()).device
    out: list[list[np.ndarray]] = [[] for _ in records]
    vectors: list[np.ndarray | None] = [None] * len(records)
    for indices in length_batches([len(r) for r in records], batch_size):
        chosen = [records[i] for i in indices]
        batch = {k: v.to(device) for k, v in collate_records(chosen, loaded.tokenizer.pad_token_id).items()}
        with autocast_context(device, dtype):
            if "field_spans" in batch:
                keys = distinct_field_keys(chosen)
                batch["field_vectors"] = loaded.field_cache.fill(model, batch, keys, device, encoder)
            if encoder is not None or loaded.fields_apart:  # the backbone's pass here, its states at hand
                batch.update(_encoded(encoder or model.hidden_states, batch, model.state_window))
            logits = model(batch)
        if loaded.fields_apart:
            pooled = _token_mean(batch["state_hidden"], batch["attention_mask"])
            for row, index in enumerate(indices):
                vectors[index] = pooled[row]
        logits = logits.float().cpu().numpy().astype(np.float64)
        for row, index in enumerate(indices):
            out[index] = [logits[row, q, : len(spans)] for q, spans in enumerate(records[index].option_spans)]
    return out, vectors


def _token_mean(hidden: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """[B, H] float32: each row's hidden states averaged over its attended tokens."""
    weights = mask[:, : hidden.shape[1], None].to(hidden.device).float()
    return ((hidden.float() * weights).sum(1) / weights.sum(1).clamp(min=1)).cpu().numpy().astype(np.float32)


def _encoded(encoder: EncoderRun, batch: dict, window: int | None) -> dict[str, torch.Tensor]:
    """The backbone's hidden states of a batch as the head reads them precomputed (`state_hidden`, window by
    window, and `field_hidden` for fields read apart and not cached)."""
    hidden = {"state_hidden": by_windows(encoder, batch["input_ids"], batch["attention_mask"], window)}
    if "field_input_ids" in batch and "field_vectors" not in batch:
        hidden["field_hidden"] = encoder(batch["field_input_ids"], batch["field_attention_mask"])
    return hidden


@torch.inference_mode()
def joint_state_vectors(
    loaded: LoadedJoint, states: list, dtype: torch.dtype | None = None, encoder: EncoderRun | None = None
) -> np.ndarray:
    """Each state's vector: where the state is read apart from the questions (`fields_apart`), its state
    sequence's hidden states averaged, as `record_pass` hands them back while answering (so a served state and
    a training state are read alike); else the backbone's hidden states of the state's first
    `STATE_VECTOR_TOKENS` tokens, averaged."""
    if not states:
        return np.zeros((0, 0), dtype=np.float32)
    if loaded.fields_apart:
        records = [encode_row(loaded.tokenizer, state, [_PROBE], loaded.layout)[0] for state in states]
        return np.stack(record_pass(loaded, records, dtype=dtype, encoder=encoder)[1])
    tokenizer, model = loaded.tokenizer, loaded.model
    if model.training:
        model.eval()
    length = min(STATE_VECTOR_TOKENS, loaded.max_len)
    sequences = [
        tokenizer(state_text(state), truncation=True, max_length=length)["input_ids"] for state in states
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    return mean_pooled(encoder or model.hidden_states, sequences, pad, device, dtype)


# A question for a state read alone (`joint_state_vectors`): fields apart, the state sequence holds the state only.
_PROBE = Question("probe", "noul", "probe", ("false", "true"), (None, None))
