"""In-process predictions: option probabilities for a state and its questions, temperatures applied.

This is the reference the Decision API, the smoke test and the compatibility tests compare against.

    probs = predict(load_model("data/snapshots/minilm"), "great phone", {"tone": {...}})
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline import contract
from pipeline.calibrate import softmax
from pipeline.forward import decision_logits
from pipeline.items import Item, collate, state_token_ids
from pipeline.model import QUESTION_TYPE_IDS, LoadedModel, internal_question


class BadQuestion(ValueError):
    """A question that cannot be answered (its definition is invalid, or its options do not fit)."""


def question_items(loaded: LoadedModel, state: Any, questions: dict[str, Any]) -> list[Item]:
    """One model item per question (targets empty), in the order given."""
    from laya.common import build_sequence

    parsed = contract.parse_questions(questions)
    if parsed.error:
        raise BadQuestion(f"questions: {parsed.error}")
    tok = loaded.tokenizer
    state_ids = state_token_ids(loaded, state)
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
    rows = [logits[row, : len(item.markers)] for row, item in enumerate(items)]
    return {item.question_id: p for item, p in zip(items, calibrated_probabilities(loaded, items, rows))}


def calibrated_probabilities(
    loaded: LoadedModel, items: list[Item], logits: list[np.ndarray]
) -> list[np.ndarray]:
    """Probabilities with the model's own temperatures applied, as the server answers."""
    return [softmax(z, temperature_for(loaded.config, it.qtype, len(z))) for it, z in zip(items, logits)]
