"""In-process predictions: option probabilities for a state and its questions, temperatures applied.

This is the reference the Decision API, the smoke test and the compatibility tests compare against.

    probs = predict(load_model("data/snapshots/minilm"), "great phone", {"tone": {...}})
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline import contract
from pipeline.forward import decision_logits
from pipeline.items import Item, collate
from pipeline.model import QUESTION_TYPE_IDS, LoadedModel, internal_question


class BadQuestion(ValueError):
    """A question that cannot be answered (its definition is invalid, or its options do not fit)."""


def question_items(loaded: LoadedModel, state: Any, questions: dict[str, Any]) -> list[Item]:
    """One model item per question (targets empty), in the order given."""
    from laya.common import build_sequence, encode_text

    parsed = contract.parse_questions(questions)
    if parsed.error:
        raise BadQuestion(f"questions: {parsed.error}")
    tok = loaded.tokenizer
    text = contract.state_text(state).replace(tok.mask_token, " ")
    state_ids = encode_text(tok, text, add_special_tokens=False)["input_ids"][: loaded.max_len]
    items = []
    for spec in parsed.specs:
        if not spec.criteria_ok:
            raise BadQuestion(f"questions.{spec.id}: invalid definition (type {spec.type!r})")
        ids, markers = build_sequence(tok, None, internal_question(spec.question), loaded.max_len,
                                      loaded.head_max_len, state_ids=state_ids)  # fmt: skip
        if len(markers) != spec.n_options:
            raise BadQuestion(
                f"questions.{spec.id}: only {len(markers)} of {spec.n_options} options fit the context"
            )
        items.append(Item(tuple(ids), tuple(markers), QUESTION_TYPE_IDS[spec.type], (), -1, 0, spec.id))
    return items


def temperature_for(config: dict[str, Any], qtype: int, n_options: int) -> float:
    """The calibrated temperature of a question type (per option count where the config has one)."""
    from laya.common import temp_bucket  # the bucket names the Laya layout uses ("choice:3-5", ...)

    by_options = config.get("temperature_by_options") or {}
    default = (config.get("temperature") or [1.0, 1.0, 1.0])[qtype]
    return float(by_options.get(temp_bucket(qtype, n_options), default))


@torch.no_grad()
def predict(loaded: LoadedModel, state: Any, questions: dict[str, Any]) -> dict[str, np.ndarray]:
    """Calibrated option probabilities per question id, options in model order."""
    items = question_items(loaded, state, questions)
    device = next(loaded.model.parameters()).device
    batch = {k: v.to(device) for k, v in collate(items, loaded.tokenizer.pad_token_id).items()}
    logits = decision_logits(loaded.model.eval(), batch).cpu().numpy().astype(np.float64)
    answers = {}
    for row, item in enumerate(items):
        z = logits[row, : len(item.markers)] / temperature_for(loaded.config, item.qtype, len(item.markers))
        p = np.exp(z - z.max())
        answers[item.question_id] = p / p.sum()
    return answers
