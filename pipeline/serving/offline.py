"""Offline scoring: rows of a decision file as Decision API requests, answered through the serving function.

A row is read as a request body would carry it (its `state` and `questions`; `gold` is ignored, so unlabelled
rows are what it expects), or, from a plain table, through a mapping (`mapped_rows`: the state column(s) and
the mapping's questions) and goes through the API's own parsing (`answers.parse_request`) and the model's own
`answer`, the function the server's micro-batcher calls: a scored row's answers are the answers the API serves
for the same request. A row the API would refuse is kept with its reason code (validation's code where it has
one, see `docs/serving.md#batch-scoring`) and the message the API would send, never dropped.

    rows = table_rows(table, first_row=0)
    scored = answer_rows(load_decision_model("models/vader-minilm"), rows, batch_size=64)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from pipeline.data.answers import InvalidRequest, ParsedRequest, RequestTooLarge, parse_request
from pipeline.data.contract import Unreadable, is_missing, parse_json_cell, parse_state
from pipeline.data.mapping import Mapping, request_questions, state_cells
from pipeline.data.read import column_values, table_cells
from pipeline.data.shards import LINE_COLUMN
from pipeline.families.base import Answered, DecisionModel
from pipeline.serving.body import decode_noting_repeats

ID_COLUMNS = ("id", "row_id", "decision_id")
"""The columns (or JSONL keys) that name a row, first found wins; without one a row is named by its index."""
NOT_ENCODABLE = "not_encodable"
"""The model cannot encode the request: its options do not fit the model's window, or the tokenizer refuses
its text (the API's 422 from the model)."""


@dataclass(frozen=True)
class RowRequest:
    """One source row: where it is, its id, and its parsed request or why the API would refuse it."""

    row: int
    row_id: str | None
    request: ParsedRequest | None
    error: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class ScoredRow:
    """One output row: the served answers (wire form) and tokens read, or the reason code and message."""

    row: int
    row_id: str | None
    answers: dict[str, dict[str, Any]] | None
    input_tokens: int | None
    error: str | None
    message: str | None


def table_rows(table: pa.Table, first_row: int) -> list[RowRequest]:
    """The rows of an Arrow table (a JSONL file's raw lines, or Parquet/CSV columns) as requests; `first_row`
    is the index of the table's first row in the source."""
    if table.column_names == [LINE_COLUMN]:
        return [
            _line_request(first_row + i, line) for i, line in enumerate(table.column(LINE_COLUMN).to_pylist())
        ]
    n = table.num_rows
    states = column_values(table, "state") if "state" in table.column_names else [None] * n
    questions = column_values(table, "questions") if "questions" in table.column_names else [None] * n
    id_column = next((name for name in ID_COLUMNS if name in table.column_names), None)
    ids = table.column(id_column).to_pylist() if id_column else [None] * n
    return [
        row_request(
            first_row + i, _id_text(first_row + i, ids[i], id_column is not None), states[i], questions[i]
        )
        for i in range(n)
    ]


def mapped_rows(table: pa.Table, first_row: int, mapping: Mapping) -> list[RowRequest]:
    """The rows of a plain table read through a mapping (its options fixed: `mapping.unlabelled_mapping`) as
    requests: the state from the mapping's state column(s), the mapping's questions on every row, named by the
    mapping's id column or else by index. Label columns are not read."""
    found, _ = table_cells(table, mapping.unlabelled_columns)
    cells = {name: found.get(name, [None] * table.num_rows) for name in mapping.unlabelled_columns}
    states, questions = state_cells(cells, mapping.state), request_questions(mapping)
    ids = cells[mapping.id] if mapping.id else [None] * table.num_rows
    return [
        row_request(row, _id_text(row, row_id, mapping.id is not None), state, questions)
        for row, row_id, state in zip(range(first_row, first_row + table.num_rows), ids, states)
    ]


BODY_PREFIX = re.compile(r"(^|; )body\.")


def row_request(row: int, row_id: str | None, state_cell: Any, questions_cell: Any) -> RowRequest:
    """A row's cells (native values or JSON text) as the request the API would parse, or its reason code: the
    row-level codes of validation first, in its order (the questions cell, then the state), then the API's."""
    try:
        questions = parse_json_cell(questions_cell)
    except Unreadable as error:
        return RowRequest(row, row_id, None, "invalid_json", f"questions: not valid JSON: {error}")
    if not isinstance(questions, dict) or not questions:
        return RowRequest(row, row_id, None, "missing_questions", "questions must be a non-empty object")
    try:
        state = parse_state(state_cell)
    except Unreadable as error:
        return RowRequest(row, row_id, None, "invalid_json", f"state: not valid JSON: {error}")
    if is_missing(state):
        return RowRequest(row, row_id, None, "missing_state", "state is required (text or any JSON value)")
    try:
        return RowRequest(row, row_id, parse_request(state, questions))
    except (InvalidRequest, RequestTooLarge) as refused:
        # Named as the row's fields (`state`, `questions.q.criteria`): a row has no HTTP body.
        return RowRequest(row, row_id, None, refused.reason, BODY_PREFIX.sub(r"\1", str(refused)))


def answer_rows(model: DecisionModel, rows: list[RowRequest], batch_size: int) -> list[ScoredRow]:
    """Every row's answers, the parsed requests answered `batch_size` at a time by the model's `answer`
    (shared forward passes, as the server's batches); a request the model cannot encode keeps its message."""
    scored: list[ScoredRow | None] = [None] * len(rows)
    valid = [i for i, r in enumerate(rows) if r.request is not None]
    for start in range(0, len(valid), batch_size):
        chosen = valid[start : start + batch_size]
        for i, result in zip(chosen, model.answer([rows[i].request for i in chosen])):
            row = rows[i]
            if isinstance(result, Answered):
                scored[i] = ScoredRow(row.row, row.row_id, result.answers, result.input_tokens, None, None)
            else:
                scored[i] = ScoredRow(row.row, row.row_id, None, None, NOT_ENCODABLE, str(result))
    for i, row in enumerate(rows):
        if row.request is None:
            scored[i] = ScoredRow(row.row, row.row_id, None, None, row.error, row.message)
    return scored


def question_ids(rows: list[RowRequest]) -> list[str]:
    """The question ids of the first row with a readable request (what the flattened columns are named by)."""
    return next((list(r.request.questions) for r in rows if r.request is not None), [])


def answers_json(answers: dict[str, dict[str, Any]] | None) -> str | None:
    """The answers as JSON text, exactly the `answers` object of the API's response."""
    return None if answers is None else orjson.dumps(answers).decode()


def _line_request(row: int, line: str) -> RowRequest:
    """A JSONL line as the API reads a body: a key given twice in one object is refused, not its last value
    scored, and an escaped unpaired surrogate reaches the request's own check (orjson refuses the whole
    line)."""
    try:
        decoded, repeated = decode_noting_repeats(line)
    except (ValueError, RecursionError) as error:
        return RowRequest(row, str(row), None, "invalid_json", f"the line is not valid JSON: {error}")
    if not isinstance(decoded, dict):  # as validation reads it: a line with no questions
        return RowRequest(row, str(row), None, "missing_questions", "the line is not a JSON object")
    id_key = next((key for key in ID_COLUMNS if key in decoded), None)
    row_id = _id_text(row, decoded[id_key] if id_key else None, id_key is not None)
    if repeated:
        return RowRequest(row, row_id, None, "invalid_json", repeated)
    return row_request(row, row_id, decoded.get("state"), decoded.get("questions"))


def _id_text(row: int, value: Any, has_id: bool) -> str | None:
    """A row's id as text: its id cell (None when that cell is empty), else its index in the source."""
    if not has_id:
        return str(row)
    return None if is_missing(value) else str(value)
