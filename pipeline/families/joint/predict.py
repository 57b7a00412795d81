"""Answering with a joint model: one record per request (every question in one pass), shared forward passes.

results = answer_joint_requests(load_joint("models/decision-qwen3"), [parse_request(state, questions)])
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.data.answers import ParsedRequest, shape_answers
from pipeline.families.base import UNENCODABLE, Answered, BadQuestion
from pipeline.families.forward_passes import autocast_context, length_batches
from pipeline.families.joint.layout import LoadedJoint, temperature_of
from pipeline.families.joint.records import EncodedRecord, RecordTooLong, collate_records, encode_record
from pipeline.scoring.calibrators import type_temperatures


def answer_joint_requests(loaded: LoadedJoint, requests: list[ParsedRequest], batch_size: int = 8,
                          dtype: torch.dtype | None = None) -> list[Answered | BadQuestion]:  # fmt: skip
    """Answer parsed requests, one record each, in shared forward passes; a record too long fails alone."""
    encoded = [_encode(loaded, request) for request in requests]
    records = [record for record in encoded if isinstance(record, EncodedRecord)]
    probabilities = iter(record_probabilities(loaded, records, batch_size, dtype))
    results: list[Answered | BadQuestion] = []
    for request, record in zip(requests, encoded):
        if isinstance(record, BadQuestion):
            results.append(record)
            continue
        by_id = dict(zip(record.question_ids, next(probabilities)))
        results.append(Answered(shape_answers(request.questions, by_id, request.legends), len(record)))
    return results


def _encode(loaded: LoadedJoint, request: ParsedRequest) -> EncodedRecord | BadQuestion:
    questions = list(request.questions.values())
    try:
        return encode_record(
            loaded.tokenizer,
            request.state,
            questions,
            loaded.max_len,
            fields_apart=loaded.fields_apart,
            fields_max_len=loaded.fields_max_len,
        )
    except RecordTooLong as error:
        return BadQuestion(f"questions: {error}")
    except BadQuestion as error:
        return error
    except UNENCODABLE as error:  # the tokenizer refused this request's text: its own 422, not its batch's
        return BadQuestion(f"the tokenizer cannot encode this request: {type(error).__name__}: {error}")


@torch.inference_mode()
def record_probabilities(loaded: LoadedJoint, records: list[EncodedRecord], batch_size: int = 8,
                         dtype: torch.dtype | None = None) -> list[list[np.ndarray]]:  # fmt: skip
    """Per record, per question: the softmax over its own options (model order) at its temperature.

    Records are grouped by length, so a pass pads little; padding is masked, so a record's answer does not
    depend on what it was batched with (beyond float rounding).
    """
    model = loaded.model.eval()
    device = next(model.parameters()).device
    calibrator = loaded.calibrator or type_temperatures(
        tuple(temperature_of(loaded.config, q) for q in range(3))
    )
    out: list[list[np.ndarray]] = [[] for _ in records]
    for indices in length_batches([len(r) for r in records], batch_size):
        batch = collate_records([records[i] for i in indices], loaded.tokenizer.pad_token_id)
        with autocast_context(device, dtype):
            logits = model({k: v.to(device) for k, v in batch.items()})
        logits = logits.float().cpu().numpy().astype(np.float64)
        for row, index in enumerate(indices):
            record = records[index]
            out[index] = [
                calibrator.probabilities(qtype, qid, logits[row, q, : len(spans)])
                for q, (spans, qtype, qid) in enumerate(
                    zip(record.option_spans, record.qtypes, record.question_ids)
                )
            ]
    return out
