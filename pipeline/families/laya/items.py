"""Turn validated records into model items: one token sequence per decision, tokenised once.

Sequence (DESIGN.md 3, built by laya's sequence builder so our models and laya's agree token for token):
`[CLS] "<type> question: <instructions>" [SEP] [MASK] option [MASK] option ... [SEP] <state> [SEP]`.
A decision whose options cannot be told apart or do not fit the context is skipped with its reason, never a
crash in the middle of training.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.data.contract import NOUL_OPTIONS, QUESTION_TYPE_IDS, Decision, Question, Record, state_text
from pipeline.families.laya_layout import LoadedModel
from pipeline.scoring.decisions import ScoredDecision

ITEM_REASONS = ("options_collapsed", "options_beyond_max_len")


@dataclass(frozen=True, slots=True)
class Item:
    """One decision as the model sees it, with its training target."""

    ids: tuple[int, ...]
    markers: tuple[int, ...]
    qtype: int
    target: tuple[float, ...]
    label: int
    record: int  # index of the record in the list given to `build_items`
    question_id: str
    soft: bool = False  # the target is a soft gold distribution, not one-hot

    def __len__(self) -> int:
        return len(self.ids)

    def scored(self) -> ScoredDecision:
        """The decision as metrics and calibration see it."""
        return ScoredDecision(self.qtype, self.label, self.record, self.question_id, self.target, self.soft)


def build_items(records: list[Record], loaded: LoadedModel) -> tuple[list[Item], dict[str, int]]:
    """Items for every usable decision, and counts of the decisions skipped by reason."""
    from laya.common import build_sequence

    tok, skipped, items = loaded.tokenizer, Counter(), []
    heads: dict = {}
    for index, record in enumerate(records):
        state_ids = state_token_ids(loaded, record.state)
        for decision in record.decisions:
            question = internal_question(decision.question)
            reason = _head_problem(heads, decision, question, loaded)
            if reason:
                skipped[reason] += 1
                continue
            ids, markers = build_sequence(tok, None, question, loaded.max_len, loaded.head_max_len,
                                          state_ids=state_ids)  # fmt: skip
            items.append(_item(decision, ids, markers, index))
    return items, dict(skipped)


def state_token_ids(loaded: LoadedModel, state) -> list[int]:
    """The state's token ids as every sequence of it carries them (mask tokens blanked, capped at max_len)."""
    from laya.common import encode_text

    text = state_text(state).replace(loaded.tokenizer.mask_token, " ")
    return encode_text(loaded.tokenizer, text, add_special_tokens=False)["input_ids"][: loaded.max_len]


def _head_problem(cache: dict, decision: Decision, question: dict, loaded: LoadedModel) -> str | None:
    from laya.common import build_head

    key = decision.question  # questions repeat across rows: check each distinct one once
    if key not in cache:
        _ids, markers, stats = build_head(loaded.tokenizer, question, loaded.head_max_len)
        if stats["options_distinct"] < stats["options"] or len(markers) != len(decision.question.options):
            cache[key] = "options_collapsed"
        elif markers and markers[-1] >= loaded.max_len:
            cache[key] = "options_beyond_max_len"
        else:
            cache[key] = None
    return cache[key]


def _item(decision: Decision, ids: list[int], markers: list[int], record: int) -> Item:
    n = len(decision.question.options)
    gold = decision.gold
    target = gold.probabilities or tuple(1.0 if i == gold.label else 0.0 for i in range(n))
    qtype = QUESTION_TYPE_IDS[decision.question.type]
    return Item(tuple(ids), tuple(markers), qtype, tuple(target), gold.label, record, decision.question.id,
                gold.probabilities is not None)  # fmt: skip


def collate(items: list[Item], pad_id: int, length: int | None = None) -> dict[str, torch.Tensor]:
    """Pad a list of items into one batch (to `length` when given, e.g. a compile bucket)."""
    n, width = len(items), max(len(it) for it in items)
    width = max(width, length or 0)
    k = max(len(it.markers) for it in items)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    marker_pos = np.zeros((n, k), dtype=np.int64)
    marker_mask = np.zeros((n, k), dtype=bool)
    target = np.zeros((n, k), dtype=np.float32)
    for row, item in enumerate(items):
        ids[row, : len(item)] = item.ids
        attention[row, : len(item)] = 1
        marker_pos[row, : len(item.markers)] = item.markers
        marker_mask[row, : len(item.markers)] = True
        target[row, : len(item.target)] = item.target
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(attention),
        "marker_pos": torch.from_numpy(marker_pos),
        "marker_mask": torch.from_numpy(marker_mask),
        "qtype": torch.tensor([it.qtype for it in items], dtype=torch.long),
        "target": torch.from_numpy(target),
        "label": torch.tensor([it.label for it in items], dtype=torch.long),
    }


def internal_question(question: Question) -> dict[str, Any]:
    """A validated question in laya's internal form (`t`, `ins`, `crit`)."""
    if question.type == "choice":
        criteria: Any = dict(zip(question.options, question.descriptions))
    elif question.type == "score":
        criteria = [d if d is not None else f"level {i}" for i, d in enumerate(question.descriptions)]
    else:
        criteria = {o: d for o, d in zip(NOUL_OPTIONS, question.descriptions) if d is not None} or None
    return {"t": question.type, "ins": question.instructions, "crit": criteria}
