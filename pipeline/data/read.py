"""Read a data source (a file, a folder or glob of shards, a saved or Hub data set: `sources.py`) as Arrow,
and take a row slice before any row becomes Python.

Rows are numbered across the source's shards in order. Shards whose row count is in their metadata (Parquet
footers, Arrow batch lengths) are skipped unread when they lie outside the slice, and inside a Parquet shard
only the row groups that overlap it are read. JSONL and CSV are streamed in record batches; batches before the
slice are dropped as soon as they are counted. JSONL lines are read by Arrow as one raw text column, so a line
is decoded only when it falls inside the slice.

    columns, total_rows = read_columns("data.parquet", RowSlice(1000, 2000))
    for table in iter_tables("data/shards", rows_per_batch=4096): ...   # bounded memory, any source
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pyarrow as pa

from pipeline.data.shards import (
    DECISION_COLUMNS,
    LINE_COLUMN,
    BadSource,
    UnreadableInput,
    detect_format,
    not_utf8,
    oversized_row,
)
from pipeline.data.sources import Source, column_types, open_source

COLUMNS = DECISION_COLUMNS
__all__ = [
    "BadSlice",
    "BadSource",
    "RowSlice",
    "UnreadableInput",
    "detect_format",
    "read_columns",
    "read_slice",
]


class BadSlice(ValueError):
    """The requested slice is empty or lies outside the table: the user's input, exit 2 like `BadSource`."""


@dataclass(frozen=True)
class RowSlice:
    """A half-open row range [start, end); `end=None` means to the last row."""

    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        if self.start < 0 or (self.end is not None and self.end <= self.start):
            raise BadSlice(f"--slice {self}: needs 0 <= START < END")

    @classmethod
    def parse(cls, text: str | None) -> RowSlice:
        """Parse `START:END` (either side may be empty)."""
        if not text:
            return cls()
        start, sep, end = text.partition(":")
        try:
            if not sep:
                raise ValueError
            bounds = int(start) if start.strip() else 0, int(end) if end.strip() else None
        except ValueError:
            raise BadSlice(f"--slice {text!r}: expected START:END with whole numbers, e.g. 0:1000") from None
        return cls(*bounds)  # BadSlice for an empty or reversed range, saying so

    def __str__(self) -> str:
        return f"{self.start}:{'' if self.end is None else self.end}"


def read_slice(
    source: str | Path | Source, row_slice: RowSlice = RowSlice(), columns: Sequence[str] | None = None
) -> tuple[pa.Table, int]:
    """The Arrow table of the rows in `row_slice` (all columns, or those of `columns` the source has), and the
    source's total row count (Parquet and Arrow shards past the slice are counted from metadata, unread)."""
    opened = open_readable(source)
    walk = _Walk(opened, row_slice, columns, count_all=True)
    batches = list(walk)
    schema = batches[0].schema if batches else _projected(opened.schema(), columns)
    table = pa.Table.from_batches(batches, schema)
    if walk.total == 0:  # the user's mistake whatever the slice: exit 2, saying what is wrong
        raise BadSource(
            f"{opened.text}: no rows (an empty file, or a header alone); give a file of decision rows"
        )
    if table.num_rows == 0:
        raise BadSlice(f"{opened.text}: slice {row_slice} selects no rows (the data has {walk.total} rows)")
    return table, walk.total


def iter_tables(
    source: str | Path | Source,
    rows_per_batch: int = 4096,
    row_slice: RowSlice = RowSlice(),
    columns: Sequence[str] | None = None,
) -> Iterator[pa.Table]:
    """The slice's rows in source order as tables of `rows_per_batch` rows (the last may be shorter).

    Memory stays bounded by one table and one shard batch whatever the source's size; reading stops at the
    slice's end, so later shards are never opened. A JSONL source gives one raw `line` column (`raw_columns`
    decodes it); row `i` of the k-th table is row `row_slice.start + k * rows_per_batch + i` of the source.
    """
    if rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be at least 1, not {rows_per_batch}")
    pending, size = [], 0
    for batch in _Walk(open_readable(source), row_slice, columns, count_all=False):
        while batch.num_rows:
            take = min(rows_per_batch - size, batch.num_rows)
            pending.append(batch.slice(0, take))
            size, batch = size + take, batch.slice(take)
            if size == rows_per_batch:
                yield pa.Table.from_batches(pending)
                pending, size = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def open_readable(source: str | Path | Source) -> Source:
    """`sources.open_source`, with an unreadable shard (a corrupt footer, say) refused as
    `UnreadableInput`."""
    if isinstance(source, Source):
        return source
    with _readable(str(source), "data"):
        return open_source(source)


class _Walk:
    """The record batches of a row slice across a source's shards, in order. `total` counts the rows passed:
    with `count_all`, every row of the source once the walk is done (the walk goes on past the slice's end,
    counting Parquet and Arrow shards from metadata and streaming JSONL and CSV); without, it stops there."""

    def __init__(self, source: Source, row_slice: RowSlice, columns: Sequence[str] | None, count_all: bool):
        self.source, self.row_slice, self.columns, self.count_all = source, row_slice, columns, count_all
        self.total = 0
        self._schema: pa.Schema | None = None
        self._types = column_types(source)  # where shards encode a column apart (string, large_string, null)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        end = self.row_slice.end
        for shard in self.source.shards:
            if end is not None and self.total >= end and not self.count_all:
                return
            with _readable(str(shard.path), shard.fmt):
                for batch in self._shard(shard):
                    yield self._aligned(batch)

    def _shard(self, shard) -> Iterator[pa.RecordBatch]:
        start, end, offset = self.row_slice.start, self.row_slice.end, self.total
        if shard.counted_by_metadata:
            rows = shard.known_rows()
            self.total += rows
            lo, hi = max(start - offset, 0), rows if end is None else min(end - offset, rows)
            if hi > lo:
                yield from shard.batches(lo, hi, self.columns)
            return
        for batch in shard.batches(columns=self.columns):  # streamed: counted as it is read
            first, self.total = self.total, self.total + batch.num_rows
            lo, hi = (
                max(start - first, 0),
                batch.num_rows if end is None else min(end - first, batch.num_rows),
            )
            if hi > lo:
                yield batch.slice(lo, hi - lo)
            if end is not None and self.total >= end and not self.count_all:
                return

    def _aligned(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch in the first batch's column order and the source's column types (shards may order their
        columns apart, and write the same values as string or large_string, dictionary-encoded or
        all-null)."""
        if self._schema is None:
            self._schema = pa.schema(
                [pa.field(f.name, self._types.get(f.name, f.type)) for f in batch.schema]
            )
        if batch.schema.equals(self._schema):
            return batch
        arrays = [_as_type(batch.column(field.name), field.type) for field in self._schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)


def _as_type(array: pa.Array, kind: pa.DataType) -> pa.Array:
    if array.type == kind:
        return array
    if pa.types.is_dictionary(array.type) and not pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
    return array if array.type == kind else array.cast(kind)


@contextmanager
def _readable(what: str, fmt: str) -> Iterator[None]:
    try:
        yield
    except (pa.ArrowException, OSError, UnicodeDecodeError) as error:
        if (said := oversized_row(what, error) or not_utf8(what, error)) is not None:
            raise BadSource(said) from None
        raise UnreadableInput(f"{what}: not a readable {fmt} table ({error})") from None


def _projected(schema: pa.Schema, columns: Sequence[str] | None) -> pa.Schema:
    return schema if columns is None else pa.schema([f for f in schema if f.name in columns])


@dataclass(frozen=True)
class RawColumns:
    """The cells of a slice as Python values (native or JSON text), one list per contract column."""

    state: list[Any]
    questions: list[Any]
    gold: list[Any]
    group: list[Any] | None = None
    """Each row's `group` cell (None: the slice has no such column)."""

    def __len__(self) -> int:
        return len(self.questions)

    def row(self, index: int) -> dict[str, Any]:
        """One raw row as a dict (for reports and hashing)."""
        return {"state": self.state[index], "questions": self.questions[index], "gold": self.gold[index]}


def read_columns(source: str | Path | Source, row_slice: RowSlice = RowSlice()) -> tuple[RawColumns, int]:
    """Python cells for the slice only, and the source's row count; `answers` stands in for a missing
    `gold`."""
    opened = open_readable(source)
    _check_columns(opened)
    table, total = read_slice(opened, row_slice, None if opened.fmt == "jsonl" else COLUMNS)
    return raw_columns(table), total


def raw_columns(table: pa.Table) -> RawColumns:
    """The contract columns of an Arrow table (as `read_slice` or `iter_tables` give it) as Python cells:
    JSONL lines decoded, `answers` standing in for a missing `gold`, absent columns as None."""
    if LINE_COLUMN in table.column_names:
        return columns_from_rows([_decode_line(line) for line in table.column(LINE_COLUMN).to_pylist()])
    n = table.num_rows
    cells = {
        name: column_values(table, name) if name in table.column_names else [None] * n for name in COLUMNS
    }
    gold = [g if g is not None else a for g, a in zip(cells["gold"], cells["answers"])]
    group = cells["group"] if "group" in table.column_names else None
    return RawColumns(cells["state"], cells["questions"], gold, group)


def columns_from_rows(rows: list[dict[str, Any]]) -> RawColumns:
    """RawColumns from row dicts (as a JSONL line or an API caller gives them)."""
    gold = [row.get("gold") if row.get("gold") is not None else row.get("answers") for row in rows]
    group = [row.get("group") for row in rows] if any("group" in row for row in rows) else None
    return RawColumns([row.get("state") for row in rows], [row.get("questions") for row in rows], gold, group)


def _decode_line(line: str, keep_unreadable: bool = True) -> dict[str, Any]:
    """A JSONL line's object ({} for another JSON value). A line that is not JSON is kept raw under
    `questions`, so validation counts the row as invalid_json rather than dropping it; without
    `keep_unreadable` (a plain table's cells) it has no cells, and its raw text is no column's value."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {"questions": line} if keep_unreadable else {}
    return row if isinstance(row, dict) else {}


def column_values(table: pa.Table, name: str) -> list[Any]:
    column = table.column(name)
    values = column.to_pylist()
    if _holds_non_json(column.type):
        values = [_as_json_value(v) for v in values]
    if pa.types.is_struct(column.type) and name != "state":
        # Parquet structs give every row the union of all keys; a null field there means "absent".
        return [_drop_nulls(v) for v in values]
    if pa.types.is_map(column.type):
        return [dict(v) if v is not None else None for v in values]
    return values


def _holds_non_json(kind: pa.DataType) -> bool:
    """Whether the column's Python values include some JSON has no form for: decimals, durations, bytes."""
    if pa.types.is_decimal(kind) or pa.types.is_duration(kind) or _is_binary(kind):
        return True
    return any(_holds_non_json(kind.field(i).type) for i in range(kind.num_fields))


def _is_binary(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind)


def _as_json_value(value: Any) -> Any:
    """A cell as a state, an id or a label can hold it: a decimal as its number (`1.50` is 1.5), a duration as
    its text (`1 day, 2:00:00`), bytes as UTF-8 text (an undecodable byte as U+FFFD), inside lists and objects
    too."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, timedelta):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        return {key: _as_json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_json_value(item) for item in value]
    if isinstance(value, tuple):  # a map column's (key, value) pairs
        return tuple(_as_json_value(item) for item in value)
    return value


def _drop_nulls(value: Any) -> Any:
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def _check_columns(source: Source) -> None:
    # Checked here, on the schema, not in the shard readers: a plain table (text, label) is read by them too.
    with _readable(source.text, source.fmt):
        names = source.schema().names
    if source.fmt != "jsonl" and not set(COLUMNS) & set(names):
        raise BadSource(
            f"{source.text}: not a decision table: no column named state, questions or gold (found "
            f"{', '.join(names[:8]) or 'none'}); for a plain table give --mapping FILE, or --state-column "
            "and --label-column"
        )


class TableCells(NamedTuple):
    """Named columns of a slice of any table as Python lists, the columns the table has, and its row count."""

    cells: dict[str, list[Any]]
    columns: tuple[str, ...]
    total: int


def read_cells(
    source: str | Path | Source, names: Sequence[str], row_slice: RowSlice = RowSlice()
) -> TableCells:
    """The named columns of any table (not only a decision file) for the slice only; a name the table lacks is
    left out of `cells` (the caller says what to do). CSV cells stay text; JSONL lines are decoded in the
    slice only, and its columns are the keys its rows there use."""
    opened = open_readable(source)
    table, total = read_slice(opened, row_slice, None if opened.fmt == "jsonl" else names)
    cells, found = table_cells(table, names)
    if LINE_COLUMN not in table.column_names:
        with _readable(opened.text, opened.fmt):
            found = tuple(opened.schema().names)
    return TableCells(cells, found, total)


def table_cells(table: pa.Table, names: Sequence[str]) -> tuple[dict[str, list[Any]], tuple[str, ...]]:
    """The named columns of an Arrow table (as `read_slice` or `iter_tables` give it) as Python lists, those
    it has, and the columns it has: a JSONL table's lines decoded, its columns the keys its rows use."""
    if LINE_COLUMN in table.column_names:
        # A line that is no JSON object has no cells: its state is then missing, and counted so.
        rows = [_decode_line(line, keep_unreadable=False) for line in table.column(LINE_COLUMN).to_pylist()]
        found = tuple(dict.fromkeys(key for row in rows for key in row))
        return {n: [row.get(n) for row in rows] for n in names if n in found}, found
    found = tuple(table.column_names)
    return {n: column_values(table, n) for n in names if n in found}, found
