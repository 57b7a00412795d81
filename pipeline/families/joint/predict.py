"""Answering with a joint model: a request's records (one per row, or one per question with questions isolated
in the sequence), shared forward passes, and the isolated questions' field vectors cached per question text.

results = answer_joint_requests(load_joint("models/decision-qwen3"), [parse_request(state, questions)])
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.data.answers import ParsedRequest, shape_answers
from pipeline.data.contract import state_text
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
    logits = iter(record_logits(loaded, records, batch_size, dtype, encoder))
    calibrator = served_calibrator(loaded)
    results: list[Answered | BadQuestion] = []
    for request, entry in zip(requests, encoded):
        if isinstance(entry, BadQuestion):
            results.append(entry)
            continue
        joined = joined_logits(entry, [next(logits) for _ in entry])
        by_id = {qid: calibrator.probabilities(qtype, qid, z) for qid, (qtype, z) in joined.items()}
        answers = shape_answers(request.questions, by_id, request.legends)
        results.append(Answered(answers, sum(record.tokens_read for record in entry)))
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


@torch.inference_mode()
def record_logits(
    loaded: LoadedJoint,
    records: list[EncodedRecord],
    batch_size: int = 8,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> list[list[np.ndarray]]:
    """Per record, per question: its options' raw logits (model order).

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
    for indices in length_batches([len(r) for r in records], batch_size):
        chosen = [records[i] for i in indices]
        batch = collate_records(chosen, loaded.tokenizer.pad_token_id)
        with autocast_context(device, dtype):
            if "field_spans" in batch:
                keys = distinct_field_keys(chosen)
                batch["field_vectors"] = loaded.field_cache.fill(model, batch, keys, device, encoder)
            if encoder is not None:
                batch.update(_encoded(encoder, batch, model.state_window))
            logits = model({k: v.to(device) for k, v in batch.items()})
        logits = logits.float().cpu().numpy().astype(np.float64)
        for row, index in enumerate(indices):
            out[index] = [logits[row, q, : len(spans)] for q, spans in enumerate(records[index].option_spans)]
    return out


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
    """Each state's vector: the backbone's hidden states as the head reads them (`hidden_states`) of the state's
    first `STATE_VECTOR_TOKENS` tokens, mean-pooled (the state's mean the head pools); through `encoder`
    (another runtime's pass of `hidden_states`) when given."""
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
