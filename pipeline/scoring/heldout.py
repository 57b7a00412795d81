"""Held-out (or validation) decisions with their raw logits, saved between stages (train writes, calibrate and
gates read), and the calibrated probabilities the trained model gave them (calibrate writes, the smoke test
compares serving with).

One `.npz`: per decision its type, gold label, record, row group, question id, target distribution and the
logits of the base and the fine-tune (padded to the widest question), plus the option names of every question
id (JSON) so plots can label their axes. Logits, not probabilities: calibration needs them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.scoring.decisions import ScoredDecision


@dataclass(frozen=True)
class HeldOut:
    items: list[ScoredDecision]
    base_logits: list[np.ndarray] | None
    """None where the base was not scored (the validation split)."""
    tuned_logits: list[np.ndarray]
    options: dict[str, tuple[str, ...]]


def save_heldout(path: str | Path, heldout: HeldOut) -> Path:
    """Write the held-out set to `path` (.npz)."""
    path = Path(path)
    widths = [len(z) for z in heldout.tuned_logits]
    k = max(widths, default=1)

    def padded(rows) -> np.ndarray:
        out = np.full((len(rows), k), np.nan)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return out

    items = heldout.items
    np.savez_compressed(
        path,
        widths=np.asarray(widths, dtype=np.int64),
        qtype=np.asarray([it.qtype for it in items], dtype=np.int64),
        label=np.asarray([it.label for it in items], dtype=np.int64),
        record=np.asarray([it.record for it in items], dtype=np.int64),
        group=np.asarray([it.group for it in items], dtype=np.int64),
        soft=np.asarray([it.soft for it in items], dtype=bool),
        target=padded([it.target for it in items]),
        **({} if heldout.base_logits is None else {"base": padded(heldout.base_logits)}),
        tuned=padded(heldout.tuned_logits),
        question_id=np.asarray(json.dumps([it.question_id for it in items])),
        options=np.asarray(json.dumps({q: list(o) for q, o in heldout.options.items()})),
    )
    return path


def load_heldout(path: str | Path) -> HeldOut:
    """Read a held-out set written by `save_heldout` (items carry no token ids)."""
    data = np.load(Path(path))
    widths, question_ids = data["widths"], json.loads(str(data["question_id"]))
    # A file written before groups were saved has none: every row its own (-1).
    groups = data["group"] if "group" in data else np.full(len(widths), -1)
    saved = (widths, data["qtype"], data["target"], data["label"], data["record"], question_ids, data["soft"])
    items = [
        ScoredDecision(
            qtype=int(q),
            label=int(label),
            record=int(record),
            question_id=qid,
            target=tuple(float(x) for x in t[:w]),
            soft=bool(soft),
            group=int(group),
        )
        for w, q, t, label, record, qid, soft, group in zip(*saved, groups)
    ]
    options = {q: tuple(o) for q, o in json.loads(str(data["options"])).items()}
    base = [r[:w] for r, w in zip(data["base"], widths)] if "base" in data else None
    return HeldOut(items, base, [r[:w] for r, w in zip(data["tuned"], widths)], options)


def pooled(sets: list[HeldOut]) -> HeldOut:
    """Several sets of decisions as one (no base logits): each set's rows and groups numbered after the
    previous set's, so no two rows (or groups) of different sets share a number."""
    items: list[ScoredDecision] = []
    logits: list[np.ndarray] = []
    options: dict[str, tuple[str, ...]] = {}
    rows = groups = 0
    for part in sets:
        items += [
            replace(d, record=d.record + rows, group=d.group + groups if d.group >= 0 else -1)
            for d in part.items
        ]
        logits += part.tuned_logits
        options |= part.options
        rows += 1 + max((d.record for d in part.items), default=-1)
        groups += 1 + max((d.group for d in part.items), default=-1)
    return HeldOut(items, None, logits, options)


def save_expected(path: str | Path, decisions: list[ScoredDecision], probabilities: list[np.ndarray]) -> Path:
    """Each decision's (record, question id) and the probabilities the trained model gave it (.npz)."""
    path = Path(path)
    k = max((len(p) for p in probabilities), default=1)
    padded = np.full((len(probabilities), k), np.nan)
    for i, p in enumerate(probabilities):
        padded[i, : len(p)] = p
    np.savez_compressed(
        path,
        record=np.asarray([d.record for d in decisions], dtype=np.int64),
        question_id=np.asarray(json.dumps([d.question_id for d in decisions])),
        widths=np.asarray([len(p) for p in probabilities], dtype=np.int64),
        probabilities=padded,
    )
    return path


def load_expected(path: str | Path) -> dict[tuple[int, str], np.ndarray]:
    """{(record index in the held-out split, question id): probabilities} as `save_expected` wrote them."""
    data = np.load(Path(path))
    ids = json.loads(str(data["question_id"]))
    return {
        (int(r), q): row[:w]
        for r, q, w, row in zip(data["record"], ids, data["widths"], data["probabilities"])
    }
