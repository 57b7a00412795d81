"""A scored decision: what every metric, calibration and plot needs of one held-out decision, whatever the family.

Families turn their own examples (a Laya sequence per question, a joint record per row) into these plus one
row of raw option logits each, so everything under `pipeline.scoring` is family-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScoredDecision:
    """One decision's type, gold and place: `record` groups a row's decisions (record accuracy, cross-fitting)."""

    qtype: int  # pipeline.data.contract.QUESTION_TYPE_IDS
    label: int
    record: int
    question_id: str
    target: tuple[float, ...]  # the gold distribution over the question's options (one-hot for a hard label)
    soft: bool = False  # the target is a soft gold distribution

    @property
    def n_options(self) -> int:
        return len(self.target)
