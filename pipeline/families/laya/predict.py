"""In-process predictions: option probabilities for a state and its questions, temperatures applied.

This is the reference the Decision API, the smoke test and the compatibility tests compare against.

    probs = predict(load_model("data/snapshots/minilm"), "great phone", {"tone": {...}})
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.data import contract
from pipeline.data.answers import InvalidRequest, ParsedRequest, RequestTooLarge, parse_request, shape_answers
from pipeline.data.contract import QUESTION_TYPE_IDS
from pipeline.families.base import UNENCODABLE, Answered, BadQuestion, EncoderRun, cut_state
from pipeline.families.forward_passes import (
    STATE_VECTOR_TOKENS,
    bounded_batches,
    forward_batch_size,
    mean_pooled,
)
from pipeline.families.laya.forward import decision_logits
from pipeline.families.laya.items import Item, collate_parts, item_parts, join_logits
from pipeline.families.laya.packed import PACKED_PASS, packed_logits, packs
from pipeline.families.laya.sequences import question_parts, state_token_ids
from pipeline.families.laya_layout import LoadedModel
from pipeline.scoring.calibration import softmax


def request_items(loaded: LoadedModel, state: Any, questions: list[contract.Question]) -> list[Item]:
    """Model items for validated questions about one state (several sequences for a question whose options do
    not fit one); BadQuestion when they do not fit even so."""
    state_ids = state_token_ids(loaded, state)
    items = []
    for question in questions:
        parts = question_parts(loaded, question, state_ids)
        items.append(Item(parts, QUESTION_TYPE_IDS[question.type], (), -1, 0, question.id))
    return items


def temperature_for(config: dict[str, Any], qtype: int, n_options: int) -> float:
    """The calibrated temperature of a question type (per option count where the config has one)."""
    from laya.common import temp_bucket  # the bucket names the Laya layout uses ("choice:3-5", ...)

    by_options = config.get("temperature_by_options") or {}
    default = (config.get("temperature") or [1.0, 1.0, 1.0])[qtype]
    return float(by_options.get(temp_bucket(qtype, n_options), default))


def predict(loaded: LoadedModel, state: Any, questions: dict[str, Any]) -> dict[str, np.ndarray]:
    """Calibrated option probabilities per question id, options in model order.

    Questions are validated as the Decision API validates them (`answers.parse_request`); any problem is a
    BadQuestion naming the field.
    """
    try:
        parsed = parse_request(state, questions)
    except (InvalidRequest, RequestTooLarge) as error:
        raise BadQuestion(str(error)) from None
    items = request_items(loaded, parsed.state, list(parsed.questions.values()))
    return {item.question_id: p for item, p in zip(items, predict_items(loaded, [items])[0])}


def predict_items(
    loaded: LoadedModel,
    requests: list[list[Item]],
    batch_size: int | None = None,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> list[list[np.ndarray]]:
    """Calibrated probabilities for the items of several requests in shared forward passes
    (`request_item_logits`, then the model's calibration, applied once to an item's options' logits
    joined)."""
    logits = request_item_logits(loaded, requests, batch_size, dtype, encoder)
    return [calibrated_probabilities(loaded, items, z) for items, z in zip(requests, logits)]


@torch.inference_mode()
def request_item_logits(
    loaded: LoadedModel,
    requests: list[list[Item]],
    batch_size: int | None = None,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> list[list[np.ndarray]]:
    """Raw option logits for the items of several requests in shared forward passes.

    The sequences of all requests are grouped by length (little padding), so one pass serves many callers; the
    result keeps each request's own order. An item of several sequences gets all its options' logits joined.
    Padding is masked, so a request's answer does not depend on what it was batched with (beyond float
    rounding). With `encoder` (another runtime's encoder pass) the passes are padded ones of similar lengths,
    the encoder run there and the head here.
    """
    flat = [item for items in requests for item in items]
    model = loaded.model.eval()
    if packs(model) and encoder is None:
        logits = packed_item_logits(model, flat, dtype)
    else:
        logits = padded_item_logits(loaded, flat, batch_size, dtype, encoder)
    out, start = [], 0
    for items in requests:
        out.append(logits[start : start + len(items)])
        start += len(items)
    return out


@torch.inference_mode()
def packed_item_logits(
    model: torch.nn.Module, items: list[Item], dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    """Every item's option logits from the packed pass, `PACKED_PASS` sequences at a time."""
    parts, logits = item_parts(items), []
    for start in range(0, len(parts), PACKED_PASS):
        passed = packed_logits(model, parts[start : start + PACKED_PASS], dtype)
        logits += [z.cpu().numpy().astype(np.float64) for z in passed]
    return join_logits(items, logits)


@torch.inference_mode()
def padded_item_logits(
    loaded: LoadedModel,
    items: list[Item],
    batch_size: int | None,
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
    max_padding: float | None = None,
) -> list[np.ndarray]:
    """Every item's option logits from padded passes of similar lengths (encoders the packed pass does not
    cover), each pass cut short where it would compute more than `max_padding` padding (`bounded_batches`)."""
    device = next(loaded.model.parameters()).device
    parts = item_parts(items)
    logits: list[np.ndarray | None] = [None] * len(parts)
    size = batch_size or forward_batch_size(device)
    for indices in bounded_batches([len(part) for part in parts], size, max_padding):
        batch = {
            k: v.to(device)
            for k, v in collate_parts([parts[i] for i in indices], loaded.tokenizer.pad_token_id).items()
        }
        scores = decision_logits(loaded.model, batch, dtype, encoder).cpu().numpy().astype(np.float64)
        for row, index in enumerate(indices):
            logits[index] = scores[row, : len(parts[index].markers)]
    return join_logits(items, logits)


def calibrated_probabilities(loaded: LoadedModel, items, logits: list[np.ndarray]) -> list[np.ndarray]:
    """Probabilities with the model's own calibration applied, as the server answers: its calibrator.json,
    else the config's temperatures. `items` are Items or ScoredDecisions (a type and a question id each)."""
    if loaded.calibrator is not None:
        return [loaded.calibrator.probabilities(it.qtype, it.question_id, z) for it, z in zip(items, logits)]
    return [softmax(z, temperature_for(loaded.config, it.qtype, len(z))) for it, z in zip(items, logits)]


def answer_requests(
    loaded: LoadedModel,
    requests: list[ParsedRequest],
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> list[Answered | BadQuestion]:
    """Answer several parsed requests in shared forward passes; a request that cannot be encoded fails
    alone."""
    encoded: list[list[Item] | BadQuestion] = []
    for request in requests:
        try:
            encoded.append(request_items(loaded, request.state, list(request.questions.values())))
        except BadQuestion as error:
            encoded.append(error)
        except (
            UNENCODABLE
        ) as error:  # the tokenizer refused this request's text: its own 422, not its batch's
            encoded.append(
                BadQuestion(f"the tokenizer cannot encode this request: {type(error).__name__}: {error}")
            )
    good = [items for items in encoded if not isinstance(items, BadQuestion)]
    logits = iter(request_item_logits(loaded, good, dtype=dtype, encoder=encoder))
    results: list[Answered | BadQuestion] = []
    for request, items in zip(requests, encoded):
        if isinstance(items, BadQuestion):
            results.append(items)
            continue
        raw = next(logits)
        probabilities = calibrated_probabilities(loaded, items, raw)
        by_id = {item.question_id: p for item, p in zip(items, probabilities)}
        answers = shape_answers(request.questions, by_id, request.legends)
        logits_by_id = {item.question_id: z for item, z in zip(items, raw)}
        results.append(Answered(answers, sum(len(item) for item in items), logits=logits_by_id))
    return results


@torch.inference_mode()
def laya_state_vectors(
    loaded: LoadedModel,
    states: list[Any],
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
) -> np.ndarray:
    """Each state's vector: the encoder's hidden states of `[CLS] state [SEP]` (its first
    `STATE_VECTOR_TOKENS`), mean-pooled; through `encoder` (another runtime's pass) when given."""
    tokenizer, model = loaded.tokenizer, loaded.model.eval()
    room = min(STATE_VECTOR_TOKENS, loaded.max_len) - 2
    sequences = [
        [tokenizer.cls_token_id, *cut_state(state_token_ids(loaded, state), room), tokenizer.sep_token_id]
        for state in states
    ]
    run = encoder or (lambda ids, mask: model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state)
    device = next(model.parameters()).device
    return mean_pooled(run, sequences, tokenizer.pad_token_id, device, dtype)
