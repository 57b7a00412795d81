"""Turn raw decision rows into per-decision facts, the input of the validation schema.

Each distinct `questions` cell is parsed once (datasets repeat the same questions on every row), so the work
per decision is the gold check alone. Facts are kept per row (index, spec offset, decision count, row error)
and per decision (the gold verdict); `Facts.frame()` expands them into the flat columns the pandera schema
judges.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd

from pipeline.data import contract
from pipeline.data.contract import QuestionSpec
from pipeline.data.read import RawColumns

NO_GOLD = (False, False, None)  # the verdict of a decision whose gold entry is absent


@dataclass
class Facts:
    """Facts of every decision of a slice, kept per row and expanded to columns on demand."""

    specs: list[QuestionSpec | None] = field(default_factory=lambda: [None])  # spec 0: no question
    row_index: list[int] = field(default_factory=list)
    row_base: list[int] = field(default_factory=list)  # offset of the row's first question in `specs`
    row_count: list[int] = field(default_factory=list)  # decisions the row accounts for
    row_error: list[int] = field(default_factory=list)  # 0, or 1 + index in contract.ROW_REASONS
    row_state_chars: list[int] = field(default_factory=list)
    verdicts: list[tuple] = field(default_factory=list)  # per decision: (label_ok, probabilities_ok, Gold)
    states: dict[int, Any] = field(default_factory=dict)  # parsed cells of readable rows, for the records
    golds: dict[int, Any] = field(default_factory=dict)
    questions: dict[int, bytes] = field(default_factory=dict)
    # Rows with a `group` cell: its key (`contract.group_key`).
    groups: dict[int, str] = field(default_factory=dict)

    def add_row(self, row: int, base: int, count: int, error: int = 0, state_chars: int = 0) -> None:
        self.row_index.append(row)
        self.row_base.append(base)
        self.row_count.append(count)
        self.row_error.append(error)
        self.row_state_chars.append(state_chars)

    def add_row_error(self, row: int, code: str, count: int) -> None:
        self.add_row(row, 0, count, 1 + contract.ROW_REASONS.index(code))
        self.verdicts.extend([NO_GOLD] * count)

    def decision_rows(self) -> np.ndarray:
        """The row index of every decision."""
        return np.repeat(np.asarray(self.row_index, dtype=np.int64), self.row_count)

    def decision_specs(self) -> np.ndarray:
        """The index in `specs` of every decision's question (0 for decisions of unreadable rows)."""
        counts = np.asarray(self.row_count, dtype=np.int64)
        starts = np.cumsum(counts) - counts
        position = np.arange(counts.sum()) - np.repeat(starts, counts)
        spec = np.repeat(np.asarray(self.row_base, dtype=np.int64), counts) + position
        return np.where(np.repeat(np.asarray(self.row_error) > 0, counts), 0, spec)

    def frame(self) -> pd.DataFrame:
        """One row per decision, one column per fact: what the validation schema judges."""
        counts = np.asarray(self.row_count, dtype=np.int64)
        spec_ids, specs, verdicts = self.decision_specs(), self.specs, self.verdicts

        def per_spec(values: list, dtype) -> np.ndarray:
            return np.asarray(values, dtype=dtype)[spec_ids]

        def per_decision(position: int) -> np.ndarray:
            return np.fromiter((v[position] for v in verdicts), dtype=bool, count=len(verdicts))

        return pd.DataFrame(
            {
                "row": self.decision_rows(),
                "row_error": pd.Categorical.from_codes(
                    np.repeat(np.asarray(self.row_error, dtype=np.int64), counts) - 1,
                    categories=contract.ROW_REASONS,
                ),
                "question_ok": per_spec([bool(s and s.question_ok) for s in specs], bool),
                "question_type": pd.Categorical(per_spec([s.type if s else None for s in specs], object)),
                "criteria_ok": per_spec([bool(s and s.criteria_ok) for s in specs], bool),
                "n_options": per_spec([s.n_options if s else 0 for s in specs], np.int64),
                "n_distinct": per_spec([s.n_distinct if s else 0 for s in specs], np.int64),
                "question_chars": per_spec([s.chars if s else 0 for s in specs], np.int64),
                "state_chars": np.repeat(np.asarray(self.row_state_chars, dtype=np.int64), counts),
                "has_gold": np.fromiter(
                    (v is not NO_GOLD for v in verdicts), dtype=bool, count=len(verdicts)
                ),
                "label_ok": per_decision(0),
                "probabilities_ok": per_decision(1),
            }
        )


@contextmanager
def announced(
    report: Callable[[str], None] | None, what: str, after_s: float = 2.0, every_s: float = 10.0
) -> Iterator[None]:
    """Run the block; while it runs past `after_s`, say `what` to `report` with the seconds so far, and again
    every `every_s`. A long read or check is seen to be alive; a short one says nothing, so an error in it
    stays the one line the user reads."""
    if report is None:
        yield
        return
    done, started = threading.Event(), time.monotonic()

    def watch() -> None:
        wait = after_s
        while not done.wait(wait):
            report(f"{what} ({time.monotonic() - started:.0f} s so far)")
            wait = every_s

    watcher = threading.Thread(target=watch, name="announced", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector around bulk parsing.

    Parsing allocates millions of small containers and none of them form cycles; the collector would otherwise
    rescan the growing heap again and again (measured here: 3-4x slower on 1M decisions).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def collect_facts(columns: RawColumns, first_row: int = 0) -> Facts:
    """Parse every row into facts; each distinct `questions` cell and hard label is judged once."""
    facts = Facts()
    questions_cache: dict[Any, tuple[contract.ParsedQuestions, int]] = {}
    label_cache: dict[tuple, tuple] = {}
    for offset, (state_cell, questions_cell, gold_cell) in enumerate(
        zip(columns.state, columns.questions, columns.gold)
    ):
        parsed, base = _cached_questions(questions_cell, questions_cache, facts.specs)
        row = first_row + offset
        if parsed.error in ("invalid_json", "missing_questions"):
            facts.add_row_error(row, parsed.error, 1)
            continue
        error, state, gold = _state_and_gold(state_cell, gold_cell, parsed.error)
        if error:
            facts.add_row_error(row, error, len(parsed.specs))
            continue
        facts.states[row], facts.golds[row], facts.questions[row] = state, gold, parsed.canonical
        group = contract.group_key(columns.group[offset]) if columns.group is not None else None
        if group is not None:
            facts.groups[row] = group
        state_chars = len(state) if isinstance(state, str) else len(contract.state_text(state))
        facts.add_row(row, base, len(parsed.specs), 0, state_chars)
        facts.verdicts.extend(
            [_verdict(spec, base + i, gold, label_cache) for i, spec in enumerate(parsed.specs)]
        )
    return facts


def _verdict(spec: QuestionSpec, spec_index: int, gold: dict, label_cache: dict) -> tuple:
    entry = gold.get(spec.id) if spec.criteria_ok else None
    if entry is None or entry == "" or entry == {}:
        return NO_GOLD
    if isinstance(entry, dict | list | float):
        return contract.judge_gold(spec, entry)
    key = (spec_index, type(entry), entry)  # hard labels repeat: judge each (question, label) once
    verdict = label_cache.get(key)
    if verdict is None:
        verdict = label_cache[key] = contract.judge_gold(spec, entry)
    return verdict


def _cached_questions(cell: Any, cache: dict, specs: list) -> tuple[contract.ParsedQuestions, int]:
    key = cell if isinstance(cell, str | bytes) or cell is None else _native_key(cell)
    hit = cache.get(key)
    if hit is None:
        parsed = contract.parse_questions(cell)
        hit = cache[key] = (parsed, len(specs))
        specs.extend(parsed.specs)
    return hit


def _native_key(cell: Any) -> Any:
    try:
        return ("native", contract.canonical_json(cell))
    except (TypeError, orjson.JSONEncodeError):
        return ("unhashable", id(cell))


def _state_and_gold(
    state_cell: Any, gold_cell: Any, questions_error: str | None
) -> tuple[str | None, Any, Any]:
    try:
        state = contract.parse_state(state_cell)
        gold = contract.parse_json_cell(gold_cell)
    except contract.Unreadable:
        return "invalid_json", None, None
    if contract.is_missing(state):
        return "missing_state", None, None
    if contract.is_missing(gold) or not isinstance(gold, dict):
        return "missing_gold", None, None
    return questions_error, state, gold
