"""Turn validated records into model items: one item per decision, its Laya-layout sequences tokenised once.

Sequence (docs/training.md, "Model families"; laya's own sequence builder, so ours and laya's agree to the
token): `[CLS] "<type> question: <instructions>" [SEP] [MASK] option [MASK] option ... [SEP] <state> [SEP]`. A
decision whose options do not fit one sequence holds several, each with a consecutive run of its options
(`sequences.question_parts`); its loss and its answer take one softmax over all of them. A decision whose
options cannot be told apart or do not fit even so is skipped with its reason, never a crash in the middle of
training.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.data.contract import QUESTION_TYPE_IDS, Decision, Record
from pipeline.families.base import StateCut, cuts_by_row
from pipeline.families.laya.sequences import Part, option_problem, question_parts, state_token_ids
from pipeline.families.laya_layout import LoadedModel
from pipeline.scoring.decisions import ScoredDecision

ITEM_REASONS = ("options_collapsed", "options_beyond_max_len")


@dataclass(frozen=True, slots=True)
class Item:
    """One decision as the model sees it: its sequences, options in order across them, and its training
    target."""

    parts: tuple[Part, ...]  # one; several when the options do not fit one sequence
    qtype: int
    target: tuple[float, ...]
    label: int
    record: int  # index of the record in the list given to `build_items`
    question_id: str
    soft: bool = False  # the target is a soft gold distribution, not one-hot

    def __len__(self) -> int:
        """Tokens the decision costs (every sequence's): what training sorts by and usage counts."""
        return sum(len(part) for part in self.parts)

    def scored(self) -> ScoredDecision:
        """The decision as metrics and calibration see it."""
        return ScoredDecision(self.qtype, self.label, self.record, self.question_id, self.target, self.soft)


def build_items(records: list[Record], loaded: LoadedModel) -> tuple[list[Item], dict[str, int]]:
    """Items for every usable decision, and counts of the decisions skipped by reason."""
    skipped, items = Counter(), []
    problems: dict = {}  # questions repeat across rows: judge each distinct one once
    for index, record in enumerate(records):
        state_ids = state_token_ids(loaded, record.state)
        for decision in record.decisions:
            if decision.question not in problems:
                problems[decision.question] = option_problem(loaded, decision.question)
            if problems[decision.question]:
                skipped[problems[decision.question]] += 1
                continue
            items.append(_item(decision, question_parts(loaded, decision.question, state_ids), index))
    return items, dict(skipped)


def _item(decision: Decision, parts: tuple[Part, ...], record: int) -> Item:
    n = len(decision.question.options)
    gold = decision.gold
    target = gold.probabilities or tuple(1.0 if i == gold.label else 0.0 for i in range(n))
    qtype = QUESTION_TYPE_IDS[decision.question.type]
    return Item(
        parts=parts,
        qtype=qtype,
        target=tuple(target),
        label=gold.label,
        record=record,
        question_id=decision.question.id,
        soft=gold.probabilities is not None,
    )


def state_cuts(items: list[Item]) -> list[StateCut]:
    """Per row the items read: its state's tokens and the fewest any of its sequences keep (each question's
    head leaves the state its own room)."""
    return cuts_by_row([(item.record, part.state) for item in items for part in item.parts])


def item_parts(items: list[Item]) -> list[Part]:
    """Every sequence of `items`, item by item (the forward passes take sequences)."""
    return [part for item in items for part in item.parts]


def join_logits(items: list[Item], part_logits: list[np.ndarray]) -> list[np.ndarray]:
    """Each item's option logits: its sequences' logits (`part_logits`, in `item_parts` order) joined in
    option order. An item of one sequence gets that sequence's logits as they are."""
    joined, start = [], 0
    for item in items:
        count = len(item.parts)
        own = part_logits[start : start + count]
        joined.append(own[0] if count == 1 else np.concatenate(own))
        start += count
    return joined


def collate_parts(parts: list[Part], pad_id: int, length: int | None = None) -> dict[str, torch.Tensor]:
    """Pad sequences into one batch (to `length` when given, e.g. a compile bucket): ids, attention, markers,
    types."""
    n, width = len(parts), max(max(len(part) for part in parts), length or 0)
    k = max(len(part.markers) for part in parts)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    marker_pos = np.zeros((n, k), dtype=np.int64)
    marker_mask = np.zeros((n, k), dtype=bool)
    for row, part in enumerate(parts):
        ids[row, : len(part)] = part.ids
        attention[row, : len(part)] = 1
        marker_pos[row, : len(part.markers)] = part.markers
        marker_mask[row, : len(part.markers)] = True
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(attention),
        "marker_pos": torch.from_numpy(marker_pos),
        "marker_mask": torch.from_numpy(marker_mask),
        "qtype": torch.tensor([part.qtype for part in parts], dtype=torch.long),
    }


def collate(items: list[Item], pad_id: int, length: int | None = None) -> dict[str, torch.Tensor]:
    """A training batch: every item's sequences (`collate_parts`), and per item its target over all its
    options and `options`, where each option's logit sits in the sequences' flattened [sequences x markers]
    logits."""
    parts = item_parts(items)
    batch = collate_parts(parts, pad_id, length)
    k = batch["marker_pos"].shape[1]
    n, most = len(items), max(len(it.target) for it in items)
    options = np.zeros((n, most), dtype=np.int64)
    option_mask = np.zeros((n, most), dtype=bool)
    target = np.zeros((n, most), dtype=np.float32)
    row = 0
    for index, item in enumerate(items):
        places = [(row + j) * k + m for j, part in enumerate(item.parts) for m in range(len(part.markers))]
        options[index, : len(places)] = places
        option_mask[index, : len(places)] = True
        target[index, : len(item.target)] = item.target
        row += len(item.parts)
    return {
        **batch,
        "options": torch.from_numpy(options),
        "option_mask": torch.from_numpy(option_mask),
        "target": torch.from_numpy(target),
        "label": torch.tensor([it.label for it in items], dtype=torch.long),
    }
