"""The held-out split: whole rows, chosen by a stable hash of each row's content.

A row's place in the hash order depends on its content only, so reordering the file never moves it, and a row
held out stays held out when rows are added (while the size caps allow). Rows are candidates when their hash
falls below `holdout_fraction`; candidates are taken in hash order up to `holdout_max_decisions` decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ValidateConfig
from pipeline.data.validate import Record


@dataclass(frozen=True)
class Split:
    """Training and held-out records, each in file order."""

    train: list[Record]
    heldout: list[Record]

    def summary(self) -> dict[str, int]:
        """Row and decision counts on each side."""
        return {
            "train_rows": len(self.train),
            "train_decisions": sum(len(r.decisions) for r in self.train),
            "heldout_rows": len(self.heldout),
            "heldout_decisions": sum(len(r.decisions) for r in self.heldout),
        }


def hash_position(record: Record) -> float:
    """The row's content hash as a number in [0, 1)."""
    return int(record.content_hash()[:16], 16) / 2**64


def split_holdout(records: list[Record], config: ValidateConfig) -> Split:
    """Split records into train and held-out sets (see the module docstring for the rule)."""
    positions = {id(r): hash_position(r) for r in records}
    ranked = sorted(records, key=lambda r: positions[id(r)])
    budget = min(
        config.holdout_max_decisions, config.holdout_fraction * sum(len(r.decisions) for r in records)
    )
    chosen, used = set(), 0
    for record in ranked:
        if positions[id(record)] >= config.holdout_fraction or used + len(record.decisions) > budget:
            break
        chosen.add(id(record))
        used += len(record.decisions)
    if not chosen and len(records) >= 2:
        chosen.add(id(ranked[0]))  # a tiny set still gets one row to evaluate on
    if len(chosen) == len(records) and records:
        chosen.discard(id(ranked[-1]))  # never hold out the last training row
    return Split(
        [r for r in records if id(r) not in chosen],
        [r for r in records if id(r) in chosen],
    )
