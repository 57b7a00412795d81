"""Validate decision rows: parse facts per decision, judge them with a pandera schema, count skips by reason.

Parsing (`pipeline.contract`) turns each row into flat per-decision facts; the pandera schema below holds the
rules, one named check per reason code, evaluated column-wise over all decisions at once. A decision that fails
several checks is counted under the first reason in `contract.REASONS`. Nothing raises on a bad row.

    decision validate data/processed/vader.jsonl --slice 0:1000
"""

from __future__ import annotations

import gc
import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson
import pandas as pd
import pandera.pandas as pa

from pipeline import contract
from pipeline.contract import Gold, Question, QuestionSpec
from pipeline.read import RawColumns, RowSlice, columns_from_rows, read_columns

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
        _rule("unknown_question_type", lambda f: ~readable(f) | ~f["question_ok"]
              | f["question_type"].isin(contract.QUESTION_TYPES)),
        _rule("bad_criteria", lambda f: ~f["question_type"].isin(contract.QUESTION_TYPES) | f["criteria_ok"]),
        _rule("too_many_options", lambda f: ~f["criteria_ok"] | f["n_options"].le(_option_limit(f))
              | f["question_type"].eq("noul")),
        _rule("repeated_options", lambda f: f["n_options"].eq(f["n_distinct"])),
        _rule("too_long", lambda f: f["question_chars"].le(contract.MAX_QUESTION_CHARS)
              & f["state_chars"].le(contract.MAX_STATE_CHARS)),
        _rule("no_gold_for_question", lambda f: ~f["criteria_ok"] | f["has_gold"]),
        _rule("gold_label_not_an_option", lambda f: ~f["has_gold"] | f["label_ok"]),
        _rule("gold_probabilities_invalid", lambda f: ~f["has_gold"] | f["probabilities_ok"]),
    ]  # fmt: skip
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


class Decision(NamedTuple):
    """One usable decision: a question of a row with its gold answer."""

    row: int
    question: Question
    gold: Gold


@dataclass(frozen=True)
class Record:
    """A row with at least one usable decision; `row` is its index in the file (not in the slice)."""

    row: int
    state: Any
    decisions: tuple[Decision, ...]
    gold: dict[str, Any]
    questions_json: bytes  # the row's questions as canonical JSON

    def content_hash(self) -> str:
        """blake2b of the row's canonical JSON: the same content gives the same hash in any file form."""
        canonical = orjson.dumps(
            {"state": self.state, "questions": orjson.Fragment(self.questions_json), "gold": self.gold},
            option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
        )
        return hashlib.blake2b(canonical, digest_size=16).hexdigest()


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

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (the `--json` output and `validation.json`)."""
        return {
            "source": self.source, "slice": self.slice, "file_rows": self.file_rows, "rows": self.rows,
            "decisions": self.decisions, "kept": self.kept, "skipped_total": self.decisions - self.kept,
            "skipped": dict(self.skipped), "examples": dict(self.examples),
        }  # fmt: skip


@dataclass
class ValidatedData:
    """What training and evaluation consume: usable records and the report that accounts for the rest."""

    records: list[Record]
    report: ValidationReport


@dataclass
class _Facts:
    """Per-decision facts in columns; question-level facts are indices into a table of distinct specs."""

    specs: list[QuestionSpec | None] = field(default_factory=lambda: [None])  # 0: no question (row error)
    row: list[int] = field(default_factory=list)
    spec: list[int] = field(default_factory=list)
    row_error: list[int] = field(default_factory=list)  # 0, or 1 + index in ROW_REASONS
    state_chars: list[int] = field(default_factory=list)
    has_gold: list[bool] = field(default_factory=list)
    label_ok: list[bool] = field(default_factory=list)
    probabilities_ok: list[bool] = field(default_factory=list)
    gold: list[Gold | None] = field(default_factory=list)
    states: dict[int, Any] = field(default_factory=dict)  # parsed state, gold and questions of readable rows
    golds: dict[int, Any] = field(default_factory=dict)
    questions: dict[int, bytes] = field(default_factory=dict)

    def add_row_error(self, row: int, code: str, n_decisions: int) -> None:
        code_id = 1 + contract.ROW_REASONS.index(code)
        for _ in range(n_decisions):
            self._add(row, 0, code_id, 0, False, False, False, None)

    def _add(self, row, spec, error, chars, has_gold, label_ok, probabilities_ok, gold) -> None:
        self.row.append(row)
        self.spec.append(spec)
        self.row_error.append(error)
        self.state_chars.append(chars)
        self.has_gold.append(has_gold)
        self.label_ok.append(label_ok)
        self.probabilities_ok.append(probabilities_ok)
        self.gold.append(gold)


def validate_columns(columns: RawColumns, first_row: int = 0) -> ValidatedData:
    """Validate raw cells (native values or JSON text); never raises on a bad row."""
    started = time.perf_counter()
    with _gc_paused():
        facts = collect_facts(columns, first_row)
        parsed = time.perf_counter()
        reasons = judge(facts)
        judged = time.perf_counter()
        report = _report(columns, facts, reasons, first_row)
        records = _records(facts, reasons)
    report.seconds = {
        "parse": parsed - started,
        "schema": judged - parsed,
        "collect": time.perf_counter() - judged,
    }
    return ValidatedData(records, report)


def validate_rows(rows: list[dict[str, Any]], first_row: int = 0) -> ValidatedData:
    """Validate row dicts (`{state, questions, gold}`); never raises on a bad row."""
    return validate_columns(columns_from_rows(rows), first_row)


def validate_file(path: str | Path, row_slice: RowSlice = RowSlice()) -> ValidatedData:
    """Read the slice of a decision file (Arrow first, Python objects for the slice only) and validate it."""
    started = time.perf_counter()
    with _gc_paused():
        columns, total = read_columns(path, row_slice)
    read_seconds = time.perf_counter() - started
    data = validate_columns(columns, first_row=row_slice.start)
    data.report.source, data.report.slice, data.report.file_rows = str(path), str(row_slice), total
    data.report.seconds["read"] = read_seconds
    return data


@contextmanager
def _gc_paused():
    # Parsing allocates millions of small containers and none of them form cycles; the cyclic collector
    # would otherwise rescan the growing heap again and again (measured: 3-4x slower on 1M decisions).
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def collect_facts(columns: RawColumns, first_row: int = 0) -> _Facts:
    """Parse every row into per-decision facts; each distinct `questions` cell is parsed once."""
    facts = _Facts()
    cache: dict[Any, tuple[contract.ParsedQuestions, int]] = {}
    for offset, (state_cell, questions_cell, gold_cell) in enumerate(
        zip(columns.state, columns.questions, columns.gold)
    ):
        parsed, base = _cached_questions(questions_cell, cache, facts.specs)
        row = first_row + offset
        if parsed.error in ("invalid_json", "missing_questions"):
            facts.add_row_error(row, parsed.error, 1)
            continue
        error, state, gold = _state_and_gold(state_cell, gold_cell, parsed.error)
        if error:
            facts.add_row_error(row, error, len(parsed.specs))
            continue
        facts.states[row], facts.golds[row], facts.questions[row] = state, gold, parsed.canonical
        _add_decisions(facts, row, parsed.specs, base, state, gold)
    return facts


def _cached_questions(cell, cache, specs) -> tuple[contract.ParsedQuestions, int]:
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


def _state_and_gold(state_cell: Any, gold_cell: Any, questions_error: str | None):
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


def _add_decisions(facts: _Facts, row: int, specs, base: int, state: Any, gold: dict) -> None:
    state_chars = len(state) if isinstance(state, str) else len(contract.state_text(state))
    judge_gold, n = contract.judge_gold, len(specs)
    verdicts = [
        None if entry is None or entry == "" or entry == {} else judge_gold(spec, entry)
        for spec, entry in ((s, gold.get(s.id) if s.criteria_ok else None) for s in specs)
    ]
    verdicts_or_none = [(False, False, None) if v is None else v for v in verdicts]
    facts.row.extend([row] * n)
    facts.spec.extend(range(base, base + n))
    facts.row_error.extend([0] * n)
    facts.state_chars.extend([state_chars] * n)
    facts.has_gold.extend([v is not None for v in verdicts])
    facts.label_ok.extend([v[0] for v in verdicts_or_none])
    facts.probabilities_ok.extend([v[1] for v in verdicts_or_none])
    facts.gold.extend([v[2] for v in verdicts_or_none])


def facts_frame(facts: _Facts) -> pd.DataFrame:
    """The facts as the DataFrame the schema validates: question-level columns gathered from the spec table."""
    spec_ids = np.asarray(facts.spec, dtype=np.int64)
    specs = facts.specs

    def gather(values: list, dtype) -> np.ndarray:
        return np.asarray(values, dtype=dtype)[spec_ids]

    types = [s.type if s else None for s in specs]
    return pd.DataFrame({
        "row": np.asarray(facts.row, dtype=np.int64),
        "row_error": pd.Categorical.from_codes(np.asarray(facts.row_error) - 1, categories=contract.ROW_REASONS),
        "question_ok": gather([bool(s and s.question_ok) for s in specs], bool),
        "question_type": pd.Categorical(gather(types, object)),
        "criteria_ok": gather([bool(s and s.criteria_ok) for s in specs], bool),
        "n_options": gather([s.n_options if s else 0 for s in specs], np.int64),
        "n_distinct": gather([s.n_distinct if s else 0 for s in specs], np.int64),
        "question_chars": gather([s.chars if s else 0 for s in specs], np.int64),
        "state_chars": np.asarray(facts.state_chars, dtype=np.int64),
        "has_gold": np.asarray(facts.has_gold, dtype=bool),
        "label_ok": np.asarray(facts.label_ok, dtype=bool),
        "probabilities_ok": np.asarray(facts.probabilities_ok, dtype=bool),
    })  # fmt: skip


def judge(facts: _Facts) -> np.ndarray:
    """Per decision, the index in `contract.REASONS` it is skipped for, or -1 when kept (decided by pandera)."""
    if not facts.row:
        return np.zeros(0, dtype=np.int64)
    frame = facts_frame(facts)
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


def _report(columns: RawColumns, facts: _Facts, reasons: np.ndarray, first_row: int) -> ValidationReport:
    skipped, examples = {}, {}
    codes, first_index, counts = np.unique(reasons, return_index=True, return_counts=True)
    for code, index, count in zip(codes.tolist(), first_index.tolist(), counts.tolist()):
        if code < 0:
            continue
        reason, row = contract.REASONS[code], facts.row[index]
        spec = facts.specs[facts.spec[index]]
        question_id = spec.id if spec else None
        value = _offending_value(reason, columns.row(row - first_row), question_id)
        skipped[reason] = count
        examples[reason] = {"row": row, "question_id": question_id, "value": value}
    kept = int((reasons < 0).sum())
    return ValidationReport(len(columns), len(reasons), kept, skipped, examples)


def _offending_value(reason: str, raw: dict[str, Any], question_id: str | None) -> str:
    """A short text showing what was wrong, re-read from the raw row (only for the first example)."""
    if reason in ("missing_state", "too_long") and question_id is None:
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
    if reason == "too_long":
        return f"{len(str(spec))} question characters / {len(str(raw.get('state')))} state characters"
    return _truncate(spec)


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


def _records(facts: _Facts, reasons: np.ndarray) -> list[Record]:
    by_row: dict[int, list[Decision]] = {}
    for index in np.flatnonzero(reasons < 0).tolist():
        row = facts.row[index]
        by_row.setdefault(row, []).append(
            Decision(row, facts.specs[facts.spec[index]].question, facts.gold[index])
        )
    return [
        Record(row, facts.states[row], tuple(decisions), facts.golds[row], facts.questions[row])
        for row, decisions in by_row.items()
    ]
