"""Read decision files (JSONL, Parquet, CSV) as Arrow, and take a row slice before any row becomes Python.

Parquet is memory-mapped and only the row groups that overlap the slice are read. JSONL and CSV are streamed
in record batches; batches before the slice are dropped as soon as they are counted. JSONL lines are read by
Arrow as one raw text column, so a line is decoded only when it falls inside the slice.

    columns, total_rows = read_columns("data.parquet", RowSlice(1000, 2000))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

COLUMNS = ("state", "questions", "gold", "answers")
_JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}
_PARQUET_SUFFIXES = {".parquet", ".pq"}
_LINE_COLUMN = "line"
_BLOCK_SIZE = 1 << 22  # 4 MiB of text per streamed batch keeps memory flat on huge files


class UnreadableInput(ValueError):
    """The input is not a decision table we can read (missing file, unknown format, corrupt file)."""


class BadSlice(ValueError):
    """The requested slice is empty or lies outside the table."""


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
            return cls(int(start) if start.strip() else 0, int(end) if end.strip() else None)
        except ValueError:
            raise BadSlice(f"--slice {text!r}: expected START:END with whole numbers, e.g. 0:1000") from None

    def __str__(self) -> str:
        return f"{self.start}:{'' if self.end is None else self.end}"


def detect_format(path: Path) -> str:
    """'jsonl', 'parquet' or 'csv', from the suffix or, failing that, the first bytes."""
    suffix = path.suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return "jsonl"
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    if suffix == ".csv":
        return "csv"
    with path.open("rb") as handle:
        head = handle.read(4)
    if head == b"PAR1":
        return "parquet"
    if head.lstrip()[:1] == b"{":
        return "jsonl"
    raise UnreadableInput(f"{path}: unknown table format (use .jsonl, .parquet or .csv)")


def read_slice(path: str | Path, row_slice: RowSlice = RowSlice()) -> tuple[pa.Table, int]:
    """The Arrow table of the rows in `row_slice`, and the total number of rows in the file."""
    path = Path(path)
    if not path.is_file():
        raise UnreadableInput(f"{path}: no such file")
    fmt = detect_format(path)
    try:
        if fmt == "parquet":
            table, total = _parquet_slice(path, row_slice)
        else:
            table, total = _streamed_slice(stream_batches(path, fmt), row_slice)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as error:
        raise UnreadableInput(f"{path}: not a readable {fmt} table ({error})") from None
    _check_columns(path, table, fmt)
    if table.num_rows == 0:
        raise BadSlice(f"{path}: slice {row_slice} selects no rows (the file has {total} rows)")
    return table, total


@dataclass(frozen=True)
class RawColumns:
    """The cells of a slice as Python values (native or JSON text), one list per contract column."""

    state: list[Any]
    questions: list[Any]
    gold: list[Any]

    def __len__(self) -> int:
        return len(self.questions)

    def row(self, index: int) -> dict[str, Any]:
        """One raw row as a dict (for reports and hashing)."""
        return {"state": self.state[index], "questions": self.questions[index], "gold": self.gold[index]}


def read_columns(path: str | Path, row_slice: RowSlice = RowSlice()) -> tuple[RawColumns, int]:
    """Python cells for the slice only, and the file's row count; `answers` stands in for a missing `gold`."""
    table, total = read_slice(path, row_slice)
    if _LINE_COLUMN in table.column_names:
        return columns_from_rows(
            [_decode_line(line) for line in table.column(_LINE_COLUMN).to_pylist()]
        ), total
    n = table.num_rows
    cells = {
        name: column_values(table, name) if name in table.column_names else [None] * n for name in COLUMNS
    }
    gold = [g if g is not None else a for g, a in zip(cells["gold"], cells["answers"])]
    return RawColumns(cells["state"], cells["questions"], gold), total


def columns_from_rows(rows: list[dict[str, Any]]) -> RawColumns:
    """RawColumns from row dicts (as a JSONL line or an API caller gives them)."""
    gold = [row.get("gold") if row.get("gold") is not None else row.get("answers") for row in rows]
    return RawColumns([row.get("state") for row in rows], [row.get("questions") for row in rows], gold)


def _decode_line(line: str) -> dict[str, Any]:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {"questions": line}  # kept raw so validation counts the row as invalid_json, not dropped
    return row if isinstance(row, dict) else {}


def column_values(table: pa.Table, name: str) -> list[Any]:
    """A Parquet or CSV column's cells as Python values: a struct field that is null is absent (not for the state),
    a map is a dict."""
    column = table.column(name)
    values = column.to_pylist()
    if pa.types.is_struct(column.type) and name != "state":
        # Parquet structs give every row the union of all keys; a null field there means "absent".
        return [_drop_nulls(v) for v in values]
    if pa.types.is_map(column.type):
        return [dict(v) if v is not None else None for v in values]
    return values


def _drop_nulls(value: Any) -> Any:
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def _check_columns(path: Path, table: pa.Table, fmt: str) -> None:
    if fmt != "jsonl" and not set(COLUMNS) & set(table.column_names):
        raise UnreadableInput(
            f"{path}: not a decision table: no column named state, questions or gold "
            f"(found {', '.join(table.column_names[:8]) or 'none'})"
        )


def _parquet_slice(path: Path, row_slice: RowSlice) -> tuple[pa.Table, int]:
    parquet = pq.ParquetFile(path, memory_map=True)
    total = parquet.metadata.num_rows
    end = total if row_slice.end is None else min(row_slice.end, total)
    groups, first_row, offset = [], None, 0
    for index in range(parquet.num_row_groups):
        size = parquet.metadata.row_group(index).num_rows
        if offset < end and offset + size > row_slice.start:
            groups.append(index)
            first_row = offset if first_row is None else first_row
        offset += size
    if not groups:
        return parquet.schema_arrow.empty_table(), total
    table = parquet.read_row_groups(groups, columns=_present(parquet.schema_arrow.names))
    return table.slice(row_slice.start - first_row, end - row_slice.start), total


def _present(names: list[str]) -> list[str] | None:
    wanted = [n for n in names if n in COLUMNS]
    return wanted or None


def stream_batches(path: Path, fmt: str) -> Iterator[pa.RecordBatch]:
    """A JSONL or CSV file (`fmt` as `detect_format` says) as Arrow record batches of about 4 MiB of text each:
    JSONL as one text column of raw lines (the only column), CSV with the contract columns as text."""
    read_options = pa_csv.ReadOptions(block_size=_BLOCK_SIZE)
    if fmt == "jsonl":
        # One text column per line: JSON never holds a raw \x1f, and quoting is off, so lines stay intact.
        read_options = pa_csv.ReadOptions(block_size=_BLOCK_SIZE, column_names=[_LINE_COLUMN])
        parse = pa_csv.ParseOptions(delimiter="\x1f", quote_char=False, escape_char=False)
        convert = pa_csv.ConvertOptions(column_types={_LINE_COLUMN: pa.large_string()})
    else:
        parse = pa_csv.ParseOptions(newlines_in_values=True)
        convert = pa_csv.ConvertOptions(
            column_types={name: pa.large_string() for name in COLUMNS}, strings_can_be_null=True
        )
    yield from pa_csv.open_csv(path, read_options=read_options, parse_options=parse, convert_options=convert)


def _streamed_slice(batches: Iterator[pa.RecordBatch], row_slice: RowSlice) -> tuple[pa.Table, int]:
    kept, offset, schema = [], 0, None
    for batch in batches:
        schema = batch.schema
        size = batch.num_rows
        end = offset + size if row_slice.end is None else min(row_slice.end, offset + size)
        if end > offset and offset + size > row_slice.start:
            lo = max(row_slice.start - offset, 0)
            kept.append(batch.slice(lo, end - offset - lo))
        offset += size  # later batches are still counted so the error for an out-of-range slice is exact
    if schema is None:
        return pa.table({_LINE_COLUMN: pa.array([], pa.large_string())}), 0
    return pa.Table.from_batches(kept, schema=schema), offset


def write_slice(path: str | Path, row_slice: RowSlice, out_dir: str | Path) -> Path:
    """The rows of `row_slice` as a file of their own (the same format family), taken on the Arrow table.

    No slice means the file itself. JSONL lines are copied as they are; Parquet and CSV become Parquet. The
    flow's later stages read the slice file, so only its rows are ever read again.
    """
    path = Path(path)
    if row_slice == RowSlice():
        return path
    table, _ = read_slice(path, row_slice)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if _LINE_COLUMN in table.column_names:
        out = out_dir / f"slice-{row_slice.start}-{row_slice.end}.jsonl"
        with out.open("w", encoding="utf-8") as handle:
            for line in table.column(_LINE_COLUMN).to_pylist():  # only the slice's lines become Python
                handle.write(line + "\n")
        return out
    import pyarrow.parquet as pq

    out = out_dir / f"slice-{row_slice.start}-{row_slice.end}.parquet"
    pq.write_table(table, out)
    return out
