"""Layer execution plans as data: the plan type, what a plan spec means on a backbone of N layers, and every
problem with one, named by its index (`pipeline.families.planned_layers` runs a plan on a backbone).

A plan lists the physical layers to visit, in order: `[0, 1, 1, 2, 3]` visits layer 1 twice with the same
parameters, `[0, 1, 2, 3]` on a six-layer encoder skips the last two. Repeat ranges `(start, end, passes)`
(half open, `passes` counting the first visit) say the same over the native order: `[(2, 4, 2)]` on six layers
is `[0, 1, 2, 3, 2, 3, 4, 5]`.

    plan = resolve_plan([(2, 4, 2)], 6)     # LayerPlan(visits=(0, 1, 2, 3, 2, 3, 4, 5), layers=6)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KEY = "layer_plan"


class LayerPlanError(ValueError):
    """A layer plan that cannot run on this backbone; the message names the bad entry."""


@dataclass(frozen=True)
class LayerPlan:
    """The physical layers to visit, in order, on a backbone of `layers` layers."""

    visits: tuple[int, ...]
    layers: int

    @property
    def is_identity(self) -> bool:
        return self.visits == tuple(range(self.layers))

    @property
    def skipped(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.layers) if i not in self.visits)

    def to_json(self) -> list[int]:
        return list(self.visits)


def plan_spec_problems(spec: Sequence[Any]) -> list[str]:
    """What is wrong with a plan's shape, before any backbone is known (`train.layer_plan` checks this)."""
    if len(spec) == 0:
        return ["train.layer_plan: an empty plan visits no layer (null runs the backbone natively)"]
    ranges = [isinstance(entry, (list, tuple)) for entry in spec]
    if any(ranges) and not all(ranges):
        return ["train.layer_plan: either layer indices or (start, end, passes) ranges, not both"]
    entries = [tuple(entry) for entry in spec] if all(ranges) else [(entry,) for entry in spec]
    wrong = [
        f"train.layer_plan[{i}]: expected whole numbers, got {list(e) if all(ranges) else e[0]!r}"
        for i, e in enumerate(entries)
        if not all(_is_int(v) for v in e)
    ]
    if wrong or all(ranges):
        return wrong or _range_problems(entries)
    return [f"train.layer_plan[{i}]: layer index must be >= 0, got {v}" for i, v in enumerate(spec) if v < 0]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _range_problems(ranges: list[tuple[int, ...]]) -> list[str]:
    problems, last_end = [], 0
    for i, entry in enumerate(ranges):
        where = f"train.layer_plan[{i}]"
        if len(entry) != 3:
            problems.append(f"{where}: a repeat range is (start, end, passes), got {list(entry)}")
        elif not 0 <= entry[0] < entry[1]:
            problems.append(f"{where}: a range needs 0 <= start < end, got {list(entry)}")
        elif entry[2] < 1:
            problems.append(f"{where}: passes counts the first visit and must be >= 1, got {entry[2]}")
        elif entry[0] < last_end:
            problems.append(f"{where}: ranges must be in order and must not overlap, got {list(entry)}")
        else:
            last_end = entry[1]
    return problems


def resolve_plan(spec: Sequence[Any] | None, layers: int) -> LayerPlan | None:
    """The plan `spec` means on a backbone of `layers` layers; LayerPlanError naming every bad entry."""
    if spec is None:
        return None
    problems = plan_spec_problems(spec)
    if problems:
        raise LayerPlanError("; ".join(problems))
    if isinstance(spec[0], (list, tuple)):
        problems = [
            f"train.layer_plan[{i}]: range end {entry[1]} is past the last layer of a backbone of "
            f"{layers} layers"
            for i, entry in enumerate(spec)
            if entry[1] > layers
        ]
    else:
        problems = [
            f"train.layer_plan[{i}]: layer {v} is out of range for a backbone of {layers} layers "
            f"(0..{layers - 1})"
            for i, v in enumerate(spec)
            if v >= layers
        ]
    if problems:
        raise LayerPlanError("; ".join(problems))
    ranges = isinstance(spec[0], (list, tuple))
    return LayerPlan(_expand_ranges(spec, layers) if ranges else tuple(spec), layers)


def _expand_ranges(ranges: Sequence[Sequence[int]], layers: int) -> tuple[int, ...]:
    """Native order, each range's layers visited `passes` times in a row."""
    visits, at = [], 0
    for start, end, passes in ranges:
        visits += list(range(at, start)) + list(range(start, end)) * passes
        at = end
    return tuple(visits + list(range(at, layers)))
