"""A scored decision: what every metric, calibration and plot needs of one held-out decision, whatever the
family.

Families turn their own examples (a Laya sequence per question, a joint record per row) into these plus one
row of raw option logits each, so everything under `pipeline.scoring` is family-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeline.data.contract import QUESTION_TYPE_IDS, Record


@dataclass(frozen=True, slots=True)
class ScoredDecision:
    """One decision's type, gold and place: `record` groups a row's decisions (record accuracy,
    cross-fitting), and `group` a group's rows (cross-fitting)."""

    qtype: int  # pipeline.data.contract.QUESTION_TYPE_IDS
    label: int
    record: int
    question_id: str
    target: tuple[float, ...]  # the gold distribution over the question's options (one-hot for a hard label)
    soft: bool = False  # the target is a soft gold distribution
    group: int = -1  # its row's group (`Record.group`), numbered within the split; -1: the row has none

    @property
    def half(self) -> int:
        """The half of a cross-fit that holds it: its group's, else its row's, so no row's decisions (and no
        group's rows) are scored by a calibrator fitted on part of them."""
        return (self.group if self.group >= 0 else self.record) % 2

    @property
    def cluster(self) -> int:
        """What a bootstrap resamples it with: its group (numbered below 0, apart from row indices), else its
        row, so an interval counts a group's rows, which share a speaker or a source, as one draw."""
        return -1 - self.group if self.group >= 0 else self.record

    @property
    def n_options(self) -> int:
        return len(self.target)


def cross_fit_halves(decisions: list[ScoredDecision]) -> list[list[int]]:
    """The indices of the decisions in each half of a cross-fit (`ScoredDecision.half`)."""
    return [[i for i, d in enumerate(decisions) if d.half == side] for side in (0, 1)]


def with_groups(decisions: list[ScoredDecision], groups: Sequence[str | None]) -> list[ScoredDecision]:
    """`decisions` with their rows' groups (`groups[record]`: the group key of each row of the split they were
    scored on), numbered in order of first appearance; unchanged where no row has a group."""
    numbers: dict[str, int] = {}
    for group in groups:
        if group is not None:
            numbers.setdefault(group, len(numbers))
    if not numbers:
        return decisions
    return [replace(d, group=numbers.get(groups[d.record], -1)) for d in decisions]  # type: ignore[arg-type]


def gold_decisions(records: Sequence[Record]) -> list[ScoredDecision]:
    """Every decision of `records` with its gold as the target (a soft gold's distribution, else one-hot) and
    `record` its row's index in `records`: what answers given on those rows by something other than a family's
    model (a bag of words, a benchmark's contender) are scored against."""
    decisions = []
    for index, record in enumerate(records):
        for d in record.decisions:
            options = len(d.question.options)
            target = d.gold.probabilities or tuple(float(k == d.gold.label) for k in range(options))
            decisions.append(
                ScoredDecision(
                    QUESTION_TYPE_IDS[d.question.type],
                    d.gold.label,
                    index,
                    d.question.id,
                    tuple(target),
                    d.gold.probabilities is not None,
                )
            )
    return decisions
