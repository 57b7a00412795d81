"""One file of a data source (a shard) read as Arrow record batches: Parquet, JSONL, CSV or an Arrow stream.

A shard knows its row count without reading rows where the format stores it (a Parquet footer, the record
batch lengths of a memory-mapped Arrow stream), and reads a local row range `[lo, hi)`: Parquet reads only the
row groups that overlap it; Arrow streams are memory-mapped, so batches outside the range cost nothing; JSONL
and CSV are streamed in 4 MiB blocks. JSONL lines are read by Arrow as one raw text column (`line`), so a line
is decoded only when a caller asks for it.

    shard = Shard(Path("part-0001.parquet"), "parquet")
    for batch in shard.batches(1000, 2000): ...
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from pipeline.data.contract import MAX_STATE_CHARS

# `group` (optional): rows with the same value go to one side of the held-out and validation splits together.
DECISION_COLUMNS = ("state", "questions", "gold", "answers", "group")
LINE_COLUMN = "line"
JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}
PARQUET_SUFFIXES = {".parquet", ".pq"}
_BLOCK_SIZE = 1 << 22  # 4 MiB of text per streamed batch keeps memory flat on huge files
_PARQUET_BATCH = 8192


class UnreadableInput(ValueError):
    """The input is not a decision table we can read (a corrupt file, an I/O error)."""


class BadSource(UnreadableInput):
    """The source is the user's mistake (no such path, an unknown format, an empty folder, shards that
    disagree, a plain table with no mapping, a Hub id while offline): the CLI says so in one line and exits 2,
    before anything trains."""


def detect_format(path: Path) -> str:
    """'jsonl', 'parquet' or 'csv', from the suffix or, failing that, the first bytes."""
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix == ".csv":
        return "csv"
    with path.open("rb") as handle:
        head = handle.read(4)
    if head == b"PAR1":
        return "parquet"
    if head.lstrip()[:1] == b"{":
        return "jsonl"
    raise BadSource(f"{path}: unknown table format (use .jsonl, .parquet or .csv)")


@dataclass(frozen=True)
class Shard:
    """One file of a source. `fmt` is parquet, jsonl, csv or arrow (an Arrow IPC stream, as `datasets`
    writes); `partition` holds the hive partition values (`lang=en/`) that become columns of every row."""

    path: Path
    fmt: str
    partition: tuple[tuple[str, Any, pa.DataType], ...] = ()

    @property
    def counted_by_metadata(self) -> bool:
        """True when `known_rows` costs no row reading (a footer or batch lengths)."""
        return self.fmt in ("parquet", "arrow")

    def known_rows(self) -> int:
        """The row count from metadata (Parquet footer, Arrow batch lengths); streamed formats stream."""
        if self.fmt == "parquet":
            return pq.ParquetFile(self.path, memory_map=True).metadata.num_rows
        return sum(batch.num_rows for batch in self._whole())

    def schema(self) -> pa.Schema:
        """The shard's columns, partition columns last; read from metadata or the first block."""
        if self.fmt == "parquet":
            base = pq.read_schema(self.path, memory_map=True)
        elif self.fmt == "arrow":
            base = _with_label_names(_open_arrow(self.path).schema)
        elif self.fmt == "jsonl":
            base = pa.schema([(LINE_COLUMN, pa.large_string())])
        else:
            base = _open_text(self.path, self.fmt).schema
        for name, _, kind in self.partition:
            base = base.append(pa.field(name, kind))
        return base.remove_metadata()

    def batches(
        self, lo: int = 0, hi: int | None = None, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The shard's rows `[lo, hi)` (local row numbers) as record batches, projected on `columns` where
        present (all columns when None)."""
        source = self._parquet_from(lo, hi, columns) if self.fmt == "parquet" else (0, self._whole(columns))
        first, stream = source
        for batch in _trim(stream, lo - first, None if hi is None else hi - first):
            yield self._with_partition(batch, columns)

    def _whole(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        if self.fmt != "arrow" and self.path.stat().st_size == 0:
            return  # an empty shard has no rows (Arrow's CSV reader would call it an error)
        reader = _open_arrow(self.path) if self.fmt == "arrow" else _open_text(self.path, self.fmt)
        names = class_label_names(reader.schema) if self.fmt == "arrow" else {}
        for batch in reader:
            yield _project(_named_labels(batch, names) if names else batch, columns)

    def _parquet_from(
        self, lo: int, hi: int | None, columns: Sequence[str] | None
    ) -> tuple[int, Iterator[pa.RecordBatch]]:
        """(the first row of the first overlapping row group, batches of the overlapping groups only)."""
        parquet = pq.ParquetFile(self.path, memory_map=True)
        meta, groups, first, offset = parquet.metadata, [], None, 0
        end = meta.num_rows if hi is None else min(hi, meta.num_rows)
        for index in range(meta.num_row_groups):
            size = meta.row_group(index).num_rows
            if offset < end and offset + size > lo:
                groups.append(index)
                first = offset if first is None else first
            offset += size
        if not groups:
            return 0, iter(())
        wanted = _present(parquet.schema_arrow.names, columns)
        return first, parquet.iter_batches(_PARQUET_BATCH, row_groups=groups, columns=wanted)

    def _with_partition(self, batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
        extra = [(n, v, t) for n, v, t in self.partition if columns is None or n in columns]
        if not extra:
            return batch
        arrays = [*batch.columns, *(pa.array([v] * batch.num_rows, t) for _, v, t in extra)]
        return pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *(n for n, _, _ in extra)])


def _present(names: list[str], columns: Sequence[str] | None) -> list[str] | None:
    return None if columns is None else [name for name in names if name in columns]


def _project(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    wanted = _present(batch.schema.names, columns)
    return batch if wanted is None or wanted == batch.schema.names else batch.select(wanted)


def _trim(batches: Iterator[pa.RecordBatch], lo: int, hi: int | None) -> Iterator[pa.RecordBatch]:
    """The rows `[lo, hi)` of a batch stream; stops reading once past `hi`."""
    offset = 0
    for batch in batches:
        size = batch.num_rows
        start, stop = max(lo - offset, 0), size if hi is None else min(hi - offset, size)
        if stop > start:
            yield batch.slice(start, stop - start)
        offset += size
        if hi is not None and offset >= hi:
            return


def class_label_names(schema: pa.Schema) -> dict[str, list[str]]:
    """The columns `datasets` stores as `ClassLabel` (integers 0..K-1, -1 for none) and their names, from the
    features it writes into an Arrow file's schema metadata; {} for any other file."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return {
        name: [str(label) for label in feature["names"]]
        for name, feature in features.items()
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and name in schema.names
    }


def _with_label_names(schema: pa.Schema) -> pa.Schema:
    for name in class_label_names(schema):
        schema = schema.set(schema.get_field_index(name), pa.field(name, pa.string()))
    return schema


def _named_labels(batch: pa.RecordBatch, names: dict[str, list[str]]) -> pa.RecordBatch:
    """The batch with each ClassLabel column as its label names (what a table's label column holds; the
    integers alone would become options "0", "1" a model reads nothing from), -1 as null."""
    for name, labels in names.items():
        index = batch.schema.get_field_index(name)
        codes = batch.column(index)
        valid = pc.and_(pc.greater_equal(codes, 0), pc.less(codes, len(labels)))
        indices = pc.if_else(valid, codes, pa.scalar(None, codes.type)).cast(pa.int32())
        named = pa.DictionaryArray.from_arrays(indices, pa.array(labels, pa.string())).cast(pa.string())
        batch = batch.set_column(index, pa.field(name, pa.string()), named)
    return batch


def _open_arrow(path: Path) -> pa.ipc.RecordBatchStreamReader:
    # `datasets` writes Arrow IPC streams; memory-mapped, a batch is a view on the page cache, never a copy.
    return pa.ipc.open_stream(pa.memory_map(str(path)))


def _open_text(path: Path, fmt: str) -> pa_csv.CSVStreamingReader:
    _refuse_binary(path, fmt)
    if fmt == "jsonl":
        _refuse_json_array(path)
        # One text column per line: JSON never holds a raw \x1f, and quoting is off, so lines stay intact.
        read = pa_csv.ReadOptions(block_size=_BLOCK_SIZE, column_names=[LINE_COLUMN])
        parse = pa_csv.ParseOptions(delimiter="\x1f", quote_char=False, escape_char=False)
        convert = pa_csv.ConvertOptions(column_types={LINE_COLUMN: pa.large_string()})
    else:
        header = csv_header(path)
        read = pa_csv.ReadOptions(block_size=_BLOCK_SIZE)
        # In a one-column table an empty cell is written as an empty line: it is a row (its cell null), never
        # skipped, or every later row would shift up and the row count shrink silently.
        parse = pa_csv.ParseOptions(newlines_in_values=True, ignore_empty_lines=len(header) > 1)
        # Every cell as text: types inferred from the first block could clash with a later block's, and a
        # mapping reads a plain table's columns (a label of "1" in one block and "n/a" in the next).
        text = {name: pa.large_string() for name in (*header, *DECISION_COLUMNS)}
        # Only an empty cell is null: "NA", "null" or "n/a" is text (a country code, a free-text answer), as
        # in the same rows written as JSONL.
        convert = pa_csv.ConvertOptions(column_types=text, strings_can_be_null=True, null_values=[""])
    try:
        return pa_csv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid as error:  # "Empty CSV file": nothing to read is the user's mistake, named
        raise BadSource(
            oversized_row(path, error)
            or not_utf8(path, error)
            or f"{path}: cannot be read as {fmt.upper()} ({error}); give a file of decision rows"
        ) from None


def _refuse_binary(path: Path, fmt: str) -> None:
    """BadSource for a binary file named as text (a Parquet file renamed .jsonl, an archive): its bytes would
    otherwise be parsed as lines, and the error would quote them."""
    with path.open("rb") as handle:
        head = handle.read(4096)
    if head.startswith(b"PAR1"):
        raise BadSource(f"{path}: a Parquet file named .{fmt}; rename it .parquet")
    if b"\x00" in head:
        raise BadSource(
            f"{path}: binary, not {fmt.upper()} text (a NUL byte within its first 4 KiB); give a file "
            "of decision rows"
        )


def _refuse_json_array(path: Path) -> None:
    """BadSource for a file holding one JSON array (`to_json(orient="records")`): its lines are no rows."""
    with path.open("rb") as handle:
        head = handle.read(1024).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        raise BadSource(
            f"{path}: one JSON array, not JSON lines; write one JSON object per line (pandas: "
            "to_json(path, orient='records', lines=True))"
        )


def not_utf8(where: str | Path, error: Exception) -> str | None:
    """The message for a text shard with bytes that are not UTF-8 (Arrow's CSV reader, which reads JSONL lines
    too, says "invalid UTF8"), or None for another error."""
    if "invalid UTF8" not in str(error) and not isinstance(error, UnicodeDecodeError):
        return None
    return (
        f"{where}: not UTF-8 text (a file saved as Latin-1 or Windows-1252?); save it as UTF-8 and read it "
        "again"
    )


def oversized_row(where: str | Path, error: Exception) -> str | None:
    """The message for a text shard with a row too long to stream in blocks (Arrow says it "straddles" them),
    or None for another error: no usable row is that long (a state holds at most MAX_STATE_CHARS
    characters)."""
    if "straddl" not in str(error):
        return None
    return (
        f"{where}: a row (line) too long to read in blocks of {_BLOCK_SIZE >> 20} MiB, and no usable row is "
        f"(a state holds at most {MAX_STATE_CHARS:,} characters); shorten or drop it"
    )


def csv_header(path: Path) -> list[str]:
    """The column names of a CSV file (its first record), without the byte-order mark a spreadsheet may write
    before it (Arrow drops it too: with it the first column would not be read as text)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return next(csv.reader(handle), [])
    except UnicodeDecodeError as error:
        raise BadSource(not_utf8(path, error)) from None
