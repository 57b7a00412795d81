"""Validate decision rows: parse facts per decision, judge them with a pandera schema, count skips by reason.

Parsing (`pipeline.data.facts`) turns each row into flat per-decision facts; the pandera schema below holds
the rules, one named check per reason code, evaluated column-wise over all decisions at once. A decision that
fails several checks is counted under the first reason in `contract.REASONS`. Nothing raises on a bad row.

    decision validate data/processed/vader.jsonl --slice 0:1000
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa

from pipeline.data import contract
from pipeline.data.contract import Decision, Record
from pipeline.data.facts import Facts, announced, collect_facts, gc_paused
from pipeline.data.mapping import Mapping, option_counts, read_mapped
from pipeline.data.read import RawColumns, RowSlice, columns_from_rows, read_columns

_EXAMPLE_CHARS = 200


def _rule(reason: str, passes) -> pa.Check:
    return pa.Check(passes, name=reason, error=reason)


def _option_limit(frame: pd.DataFrame) -> pd.Series:
    is_score, is_choice = frame["question_type"].eq("score"), frame["question_type"].eq("choice")
    limit = np.where(is_score, contract.MAX_SCORE_LEVELS, np.where(is_choice, contract.MAX_CHOICE_OPTIONS, 0))
    return pd.Series(limit, index=frame.index)


def build_schema() -> pa.DataFrameSchema:
    """The decision-level schema: column types, then one check per reason code (named by the code)."""
    readable = lambda frame: frame["row_error"].isna()  # noqa: E731 - question rules judge readable rows only
    row_rules = [_rule(code, lambda f, code=code: f["row_error"].ne(code)) for code in contract.ROW_REASONS]
    question_rules = [
        _rule("bad_question", lambda f: ~readable(f) | f["question_ok"]),
        _rule(
            "unknown_question_type",
            lambda f: ~readable(f) | ~f["question_ok"] | f["question_type"].isin(contract.QUESTION_TYPES),
        ),
        _rule("bad_criteria", lambda f: ~f["question_type"].isin(contract.QUESTION_TYPES) | f["criteria_ok"]),
        _rule(
            "too_many_options",
            lambda f: ~f["criteria_ok"] | f["n_options"].le(_option_limit(f)) | f["question_type"].eq("noul"),
        ),
        _rule("repeated_options", lambda f: f["n_options"].eq(f["n_distinct"])),
        _rule(
            "too_long",
            lambda f: (
                f["question_chars"].le(contract.MAX_QUESTION_CHARS)
                & f["state_chars"].le(contract.MAX_STATE_CHARS)
            ),
        ),
        _rule("no_gold_for_question", lambda f: ~f["criteria_ok"] | f["has_gold"]),
        _rule("gold_label_not_an_option", lambda f: ~f["has_gold"] | f["label_ok"]),
        _rule("gold_probabilities_invalid", lambda f: ~f["has_gold"] | f["probabilities_ok"]),
    ]
    return pa.DataFrameSchema(
        {
            "row": pa.Column(int, pa.Check.ge(0)),
            "row_error": pa.Column("category", nullable=True),
            "question_type": pa.Column("category", nullable=True),
            **{name: pa.Column(bool) for name in ("question_ok", "criteria_ok", "has_gold")},
            **{name: pa.Column(bool) for name in ("label_ok", "probabilities_ok")},
            **{name: pa.Column(int, pa.Check.ge(0)) for name in ("n_options", "n_distinct")},
            **{name: pa.Column(int, pa.Check.ge(0)) for name in ("question_chars", "state_chars")},
        },
        checks=row_rules + question_rules,
        strict=True,
        coerce=False,
    )


def group_sizes(facts: Facts) -> contract.GroupSizes | None:
    """How the readable rows fall into groups; None when none has a `group`."""
    if not facts.groups:
        return None
    sizes = Counter(facts.groups.values())
    return contract.GroupSizes(len(sizes), sum(sizes.values()), max(sizes.values()))


def state_sizes(facts: Facts) -> contract.StateSizes:
    """The sizes of the readable rows' states."""
    chars = [n for n, error in zip(facts.row_state_chars, facts.row_error) if not error]
    over = sum(n > contract.LONG_STATE_CHARS for n in chars)
    return contract.StateSizes(len(chars), max(chars, default=0), over)


@dataclass
class ValidationReport:
    """Totals, skip counts by reason, and the first example of each reason."""

    rows: int
    decisions: int
    kept: int
    skipped: dict[str, int]
    examples: dict[str, dict[str, Any]]
    source: str = ""
    slice: str = ""
    file_rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    labels: dict[str, dict[str, int]] = field(default_factory=dict)
    """A mapped table's label counts per question (`pipeline.data.mapping`); empty for decision files."""
    states: contract.StateSizes | None = None
    groups: contract.GroupSizes | None = None
    """None where no readable row has a `group`."""

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (the `--json` output and `validation.json`)."""
        return (
            {
                "source": self.source,
                "slice": self.slice,
                "file_rows": self.file_rows,
                "rows": self.rows,
                "decisions": self.decisions,
                "kept": self.kept,
                "skipped_total": self.decisions - self.kept,
                "skipped": dict(self.skipped),
                "examples": dict(self.examples),
            }
            | ({"labels": self.labels} if self.labels else {})
            | ({"states": asdict(self.states)} if self.states else {})
            | ({"groups": asdict(self.groups)} if self.groups else {})
        )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ValidationReport:
        """The report as `to_dict` wrote it (its derived `skipped_total` dropped)."""
        states, groups = values.get("states"), values.get("groups")
        return cls(
            rows=values["rows"],
            decisions=values["decisions"],
            kept=values["kept"],
            skipped=values["skipped"],
            examples=values["examples"],
            source=values.get("source", ""),
            slice=values.get("slice", ""),
            file_rows=values.get("file_rows", 0),
            labels=values.get("labels", {}),
            states=contract.StateSizes(**states) if states else None,
            groups=contract.GroupSizes(**groups) if groups else None,
        )


@dataclass
class ValidatedData:
    """What training and evaluation consume: usable records and the report that accounts for the rest."""

    records: list[Record]
    report: ValidationReport
    mapping: Mapping | None = None
    """The mapping the rows were read with, its options fixed (another file read with it gets the same
    ones)."""


def validate_columns(columns: RawColumns, first_row: int = 0, with_records: bool = True) -> ValidatedData:
    """Validate raw cells (native values or JSON text); never raises on a bad row.

    `with_records=False` gives the report alone (what `decision validate` prints), skipping the records that
    training needs.
    """
    started = time.perf_counter()
    with gc_paused():
        facts = collect_facts(columns, first_row)
        parsed = time.perf_counter()
        reasons = judge(facts)
        judged = time.perf_counter()
        report = _report(columns, facts, reasons, first_row)
        records = _records(facts, reasons) if with_records else []
    seconds = {"parse": parsed - started, "schema": judged - parsed, "collect": time.perf_counter() - judged}
    report.seconds = seconds
    return ValidatedData(records, report)


def validate_rows(rows: list[dict[str, Any]], first_row: int = 0) -> ValidatedData:
    """Validate row dicts (`{state, questions, gold}`); never raises on a bad row."""
    return validate_columns(columns_from_rows(rows), first_row)


def validate_file(
    path: str | Path,
    row_slice: RowSlice = RowSlice(),
    with_records: bool = True,
    mapping: Mapping | None = None,
    report: Callable[[str], None] | None = None,
) -> ValidatedData:
    """Read the slice of a decision file (Arrow first, Python objects for the slice only) and validate it.

    With `mapping`, the file is a plain table and the slice's mapped rows are validated
    (`pipeline.data.mapping`; raises MappingError for a column the table lacks or a label outside given
    options). `report` hears of a phase (reading, checking) that runs past 2 s: about 17 and 23 s per million
    rows on a 2-core machine.
    """
    started = time.perf_counter()
    with (
        gc_paused(),
        announced(report, f"reading {path}" + ("" if row_slice == RowSlice() else f", rows {row_slice}")),
    ):
        if mapping is None:
            columns, total = read_columns(path, row_slice)
        else:
            mapped, total = read_mapped(path, mapping, row_slice)
            columns, mapping = mapped.columns, mapped.mapping
    read_seconds = time.perf_counter() - started
    with announced(report, f"checking {len(columns):,} rows of {path}"):
        data = validate_columns(columns, row_slice.start, with_records)
    data.report.source, data.report.slice, data.report.file_rows = str(path), str(row_slice), total
    data.mapping = mapping
    data.report.labels = option_counts(mapped) if mapping is not None else {}
    data.report.seconds["read"] = read_seconds
    return data


def judge(facts: Facts) -> np.ndarray:
    """Per decision, the index in `contract.REASONS` it is skipped for, or -1 when kept (decided by
    pandera)."""
    if not facts.verdicts:
        return np.zeros(0, dtype=np.int64)
    frame = facts.frame()
    try:
        build_schema().validate(frame, lazy=True)
        return np.full(len(frame), -1, dtype=np.int64)
    except pa.errors.SchemaErrors as errors:
        return _first_reasons(errors.failure_cases, len(frame))


def _first_reasons(failure_cases: pd.DataFrame, n: int) -> np.ndarray:
    rank = {reason: i for i, reason in enumerate(contract.REASONS)}
    unexpected = failure_cases[~failure_cases["check"].isin(rank)]
    if len(unexpected):
        # A column-type failure means parsing produced facts of the wrong shape: a bug, never bad data.
        raise RuntimeError(f"validation facts violate the schema: {unexpected.head().to_dict('records')}")
    failed = failure_cases.dropna(subset=["index"])
    best = np.full(n, len(rank), dtype=np.int64)
    np.minimum.at(best, failed["index"].astype(np.int64).to_numpy(), failed["check"].map(rank).to_numpy())
    best[best == len(rank)] = -1
    return best


def _report(columns: RawColumns, facts: Facts, reasons: np.ndarray, first_row: int) -> ValidationReport:
    skipped, examples = {}, {}
    codes, first_index, counts = np.unique(reasons, return_index=True, return_counts=True)
    rows, spec_ids = facts.decision_rows(), facts.decision_specs()
    for code, index, count in zip(codes.tolist(), first_index.tolist(), counts.tolist()):
        if code < 0:
            continue
        reason, row, spec = contract.REASONS[code], int(rows[index]), facts.specs[spec_ids[index]]
        question_id = spec.id if spec else None
        if reason == "too_long":  # counted as the limits count them, not re-read from the raw cells
            value = _too_long(spec.chars, facts.row_state_chars[row - first_row])
        else:
            value = _offending_value(reason, columns.row(row - first_row), question_id)
        skipped[reason] = count
        examples[reason] = {"row": row, "question_id": question_id, "value": value}
    kept = int((reasons < 0).sum())
    return ValidationReport(
        len(columns),
        len(reasons),
        kept,
        skipped,
        examples,
        states=state_sizes(facts),
        groups=group_sizes(facts),
    )


def _offending_value(reason: str, raw: dict[str, Any], question_id: str | None) -> str:
    """A short text showing what was wrong, re-read from the raw row (only for the first example)."""
    if reason == "missing_state" and question_id is None:
        return _truncate(raw.get("state"))
    cell = {"missing_state": "state", "missing_gold": "gold", "too_many_questions": "questions"}.get(reason)
    if reason == "invalid_json":
        return _truncate(_first_unparsable(raw))
    if cell:
        return _truncate(raw.get(cell) if cell != "gold" else raw.get("gold", raw.get("answers")))
    questions = _safe_parse(raw.get("questions"))
    gold = _safe_parse(raw.get("gold", raw.get("answers")))
    if reason in ("gold_label_not_an_option", "gold_probabilities_invalid"):
        return _truncate(gold.get(question_id) if isinstance(gold, dict) else gold)
    if reason == "no_gold_for_question":
        return _truncate(sorted(gold) if isinstance(gold, dict) else gold)
    spec = questions.get(question_id) if isinstance(questions, dict) else questions
    if reason == "unknown_question_type" and isinstance(spec, dict):
        return _truncate(spec.get("type"))
    if reason in ("bad_criteria", "too_many_options", "repeated_options") and isinstance(spec, dict):
        return _truncate(spec.get("criteria"))
    return _truncate(spec)


def _too_long(question_chars: int, state_chars: int) -> str:
    return (
        f"{question_chars:,} question characters (at most {contract.MAX_QUESTION_CHARS:,}) / {state_chars:,} "
        f"state characters (at most {contract.MAX_STATE_CHARS:,})"
    )


def _first_unparsable(raw: dict[str, Any]) -> Any:
    for name in ("questions", "gold", "answers", "state"):
        try:
            contract.parse_state(raw.get(name)) if name == "state" else contract.parse_json_cell(
                raw.get(name)
            )
        except contract.Unreadable:
            return raw.get(name)
    return raw


def _safe_parse(value: Any) -> Any:
    try:
        return contract.parse_json_cell(value)
    except contract.Unreadable:
        return None


def _truncate(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _EXAMPLE_CHARS else text[: _EXAMPLE_CHARS - 1] + "…"


def _records(facts: Facts, reasons: np.ndarray) -> list[Record]:
    """Records of the rows with at least one kept decision, each with its kept decisions in question order."""
    kept, specs, verdicts, records, start = (reasons < 0).tolist(), facts.specs, facts.verdicts, [], 0
    for row, base, count, error in zip(facts.row_index, facts.row_base, facts.row_count, facts.row_error):
        end, first = start + count, start
        start = end
        if error or not any(kept[first:end]):
            continue
        decisions = tuple(
            Decision(row, specs[base + i].question, verdicts[first + i][2])
            for i in range(count)
            if kept[first + i]
        )
        records.append(
            Record(
                row,
                facts.states[row],
                decisions,
                facts.golds[row],
                facts.questions[row],
                facts.groups.get(row),
            )
        )
    return records
