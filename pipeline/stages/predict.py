"""The predict stage: score the rows of a decision file, or of a plain table read through a mapping, with a
served model into one Parquet file, keyed by row id.

Rows are read, answered and written a chunk at a time (never the whole file in memory), through the Decision
API's own parsing and answer function (`pipeline.serving.offline`), so each answer is what the API serves for
the same request, calibrated. Every source row gets one output row, in source order: its answers, or the
reason code the API or validation gives for refusing it. The file is written as `OUT.partial` and renamed to
OUT when complete; a failure or Ctrl-C removes it, so OUT is either whole or untouched.

    result = predict_stage("models/vader-minilm", "data/new.jsonl", "scores.parquet")
    result = predict_stage("models:/decision-model@champion", "data/new.parquet", "scores.parquet", batch_size=64)
    result = predict_stage("models/tickets", "new.csv", "scores.parquet", mapping=load_mapping("tickets.yaml"))
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.data import read
from pipeline.data.answers import chosen_option
from pipeline.data.mapping import Mapping, require_columns, unlabelled_mapping
from pipeline.data.read import BadSource, UnreadableInput
from pipeline.data.sources import Source
from pipeline.device import pick_device, serving_dtype
from pipeline.families import load_decision_model
from pipeline.families.base import DecisionModel, NoSuchModel
from pipeline.families.exporting import read_manifest
from pipeline.families.runtimes.precision import served_precision
from pipeline.lineage import MAPPING_OPTIONS
from pipeline.mlops.registry import download_version, registered_version
from pipeline.serving.catalog import export_name
from pipeline.serving.offline import (
    ID_COLUMNS,
    RowRequest,
    ScoredRow,
    answer_rows,
    answers_json,
    mapped_rows,
    question_ids,
    table_rows,
)

ROWS_PER_CHUNK = 1024
"""Rows read, answered and written at a time: memory stays flat whatever the size of the file."""
SCORED_COLUMNS = ("state", "questions", *ID_COLUMNS)  # what a Parquet source is read for; gold is not
LINE_EVERY_S = 30.0  # without a bar (stderr not a terminal), a progress line this often
PARTIAL_SUFFIX = ".partial"
RowReader = Callable[[pa.Table, int], list[RowRequest]]
"""A chunk (and the index of its first row in the source) as requests: `table_rows`, or `mapped_rows`."""


@dataclass(frozen=True)
class PredictResult:
    """What a scoring run wrote: where, with which model, how many rows were scored and why the others
    failed."""

    out: str
    model: str
    family: str
    rows: int
    scored: int
    failed: dict[str, int]
    seconds: float
    load_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The `--json` summary, with the scoring rate (rows per second, model loading excluded)."""
        rate = round(self.rows / self.seconds, 2) if self.seconds > 0 else None
        return asdict(self) | {"rows_per_second": rate}


def predict_stage(
    model: str,
    data: str | Path,
    out: str | Path,
    batch_size: int = 64,
    device: str = "cpu",
    precision: str = "fp32",
    progress: bool = False,
    report: Callable[[str], None] | None = None,
    rows_per_chunk: int = ROWS_PER_CHUNK,
    mapping: Mapping | None = None,
) -> PredictResult:
    """Score every row of `data` with `model` (an export folder or `models:/NAME@ALIAS`) into the Parquet file
    `out`; `batch_size` requests share the serving function's forward passes. `mapping` reads a plain table's
    state (and id) columns as decision rows asking the mapping's questions; options it takes from the labels
    come from the model's manifest (`mapping_options`). UnreadableInput for a source that is no decision file,
    MappingError for a column the table lacks or options nothing gives, ModelLayoutError or RegistryError for
    a model that cannot be loaded: each before any row is scored."""
    out, device = Path(out), pick_device(device)
    dtype = serving_dtype(precision, device)
    mapping = keyed_by_index_without_id(mapping, data, report)
    chunks = mapped_tables(data, rows_per_chunk, mapping)
    first = next(chunks)  # the source is read and checked before the model loads
    started = time.perf_counter()
    with model_folder(model) as (name, folder):
        rows_of, questions = _row_reader(folder, name, mapping)
        served, chosen = served_precision(load_decision_model(folder).to(device, dtype), precision, folder)
        loaded = time.perf_counter()
        _say(
            report,
            f"scoring {data} with {name} ({served.family.name} family) in batches of {batch_size} at "
            f"{chosen.name} ({chosen.reason})",
        )
        bar = tqdm(total=count_rows(data), unit="row", desc="predict", disable=not progress, file=sys.stderr)
        with bar:
            scorer = Scorer(served, rows_of, questions, batch_size)
            failed, rows = _write_scores(scorer, _chained(first, chunks), out, name, bar, report)
    seconds = time.perf_counter() - loaded
    scored = rows - sum(failed.values())
    return PredictResult(
        out=str(out),
        model=name,
        family=served.family.name,
        rows=rows,
        scored=scored,
        failed=dict(sorted(failed.items())),
        seconds=round(seconds, 3),
        load_seconds=round(loaded - started, 3),
    )


def mapped_tables(
    source: str | Path, rows_per_batch: int, mapping: Mapping | None = None
) -> Iterator[pa.Table]:
    """The source's rows (any source `read` reads) as Arrow tables of at most `rows_per_batch` rows, in order,
    one at a time, of the columns scoring reads (a decision file's state, questions and id; a mapped table's
    state and id columns; a JSONL source's raw lines). Its first table is checked (UnreadableInput: no such
    source, no rows, not a decision table; MappingError: a column the mapping names is not there)."""
    opened = read.open_readable(source)
    wanted = SCORED_COLUMNS if mapping is None else mapping.unlabelled_columns
    first = True
    for table in read.iter_tables(opened, rows_per_batch, columns=None if opened.fmt == "jsonl" else wanted):
        if first:
            _check_columns(opened, table, mapping)
        first = False
        yield table
    if first:
        raise UnreadableInput(f"{source}: no rows to score")


def keyed_by_index_without_id(
    mapping: Mapping | None, source: str | Path, report: Callable[[str], None] | None = None
) -> Mapping | None:
    """The mapping as scoring `source` reads it: without its id column where the source has none (new rows to
    score often come without the training table's ids), the rows then keyed by their index, and `report`
    told."""
    if mapping is None or mapping.id is None or mapping.id in _columns(read.open_readable(source)):
        return mapping
    _say(report, f"note: {source} has no id column {mapping.id!r}: each row is keyed by its index (row_id)")
    return replace(mapping, id=None)


def _columns(source: Source) -> tuple[str, ...]:
    """A source's column names (a JSONL source: the keys its first rows use; none where it has no row, which
    `mapped_tables` then refuses)."""
    if source.fmt != "jsonl":
        return tuple(source.schema().names)
    first = next(read.iter_tables(source, 1024), None)
    return () if first is None else read.table_cells(first, ())[1]


def _check_columns(source: Source, table: pa.Table, mapping: Mapping | None) -> None:
    """A decision table has questions; a plain table has the state and id columns its mapping names (a JSONL
    source: keys its first rows use)."""
    found = read.table_cells(table, ())[1] if source.fmt == "jsonl" else _columns(source)
    if mapping is not None:
        require_columns(mapping.unlabelled_columns, found, source.text)
    elif source.fmt != "jsonl" and "questions" not in found:
        raise BadSource(
            f"{source.text}: not a decision table: no column named questions (found "
            f"{', '.join(found[:8]) or 'none'}); for a plain table give --mapping FILE or "
            "--state-column and --label-column"
        )


def count_rows(source: str | Path) -> int | None:
    """The number of rows where the source's metadata says it without a read (Parquet, Arrow), else None."""
    shards = read.open_readable(source).shards
    if not all(shard.counted_by_metadata for shard in shards):
        return None
    return sum(shard.known_rows() for shard in shards)


DEFAULT_MODEL = "models:/decision-model@champion"
DEFAULT_OUT = "predictions/{date}.parquet"
"""Where the batch-predict flow writes unless told: a file per day."""


def dated(out: str, today: dt.date | None = None) -> str:
    """`out` with `{date}` replaced by the date (today, UTC): each scheduled run writes its own file."""
    return out.replace("{date}", (today or dt.datetime.now(dt.UTC).date()).isoformat())


def check_inputs(model: str, data: str | Path, mapping: Mapping | None = None) -> None:
    """What `predict_stage` checks before a model loads, alone and cheaply (a flow's caller checks them before
    a flow run starts): the source's first row and columns, and that `model` is a folder or a registered
    version. UnreadableInput, MappingError, ModelLayoutError or RegistryError, as `predict_stage` raises
    them."""
    next(mapped_tables(data, 1, keyed_by_index_without_id(mapping, data)))
    if registered_version(model) is None and not Path(model).is_dir():
        raise _no_such_model(model)
    # Options nothing gives, refused now (a registered model's manifest is read once it is fetched).
    if mapping is not None and Path(model).is_dir():
        unlabelled_mapping(mapping, read_manifest(Path(model)).get(MAPPING_OPTIONS), f"the model {model}")


def _no_such_model(source: str) -> NoSuchModel:
    if source.startswith("models:/"):
        return NoSuchModel(
            f"{source}: not a registry URI: give models:/NAME@ALIAS or models:/NAME/VERSION (a number)"
        )
    if Path(source).is_file():
        return NoSuchModel(f"{source}: a file; give the model's export folder (or models:/NAME@ALIAS)")
    return NoSuchModel(f"{source}: no such folder (or use models:/NAME@ALIAS)")


@contextmanager
def model_folder(source: str) -> Iterator[tuple[str, Path]]:
    """(the name the API serves it under, its folder) for an export folder, a registry alias or a registered
    version (`models:/NAME/VERSION`; the version fetched into a temporary folder, removed after)."""
    registered = registered_version(source)
    if registered is None:
        folder = Path(source)
        if not folder.is_dir():
            raise _no_such_model(source)
        yield export_name(folder), folder
        return
    name, version = registered
    with tempfile.TemporaryDirectory(prefix="decision-predict-") as cache:
        yield f"{name}/{version}", download_version(name, version, Path(cache) / f"{name}-{version}")


def _row_reader(
    folder: Path, name: str, mapping: Mapping | None
) -> tuple[RowReader, dict[str, tuple] | None]:
    """How a table becomes requests, and the questions every row asks where a mapping says them, each with the
    table's labels of its levels for a score (else empty): with a mapping, its options fixed from the mapping
    or the model's manifest (MappingError when neither gives them)."""
    if mapping is None:
        return table_rows, None
    trained = read_manifest(folder).get(MAPPING_OPTIONS)
    fixed = unlabelled_mapping(mapping, trained, f"the model {name}")
    labels = {qid: q.options if q.type == "score" else () for qid, q in fixed.questions.items()}
    return partial(mapped_rows, mapping=fixed), labels


@dataclass(frozen=True)
class Scorer:
    """How a chunk is scored: its rows read as requests by `rows_of` (table, index of its first row), answered
    by `served` `batch_size` at a time."""

    served: DecisionModel
    rows_of: RowReader
    questions: dict[str, tuple] | None
    """The flattened questions where a mapping says them, with a score's labels by level (a score mapped from
    ratings 1..5 answers level 0..4; its `.label` column says 1..5, as the table does); None: those of the
    first readable row, labelled as answered."""
    batch_size: int


def _write_scores(
    scorer: Scorer,
    chunks: Iterator[pa.Table],
    out: Path,
    name: str,
    bar: tqdm,
    report: Callable[[str], None] | None,
) -> tuple[Counter, int]:
    """Answer and write chunk by chunk into a staging file of this run's own (two runs writing one OUT never
    share it), renamed to OUT once complete; (failures by reason, rows)."""
    staged = staged_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    output = _Output(staged, name, scorer.questions)
    failed, rows, last_line = Counter(), 0, time.monotonic()
    try:
        for table in chunks:
            requests = scorer.rows_of(table, rows)
            scored = answer_rows(scorer.served, requests, scorer.batch_size)
            output.write(scored, question_ids(requests))
            failed.update(row.error for row in scored if row.error is not None)
            rows += len(scored)
            bar.update(len(scored))
            if bar.disable and time.monotonic() - last_line > LINE_EVERY_S:
                _say(report, f"{rows} rows scored, {sum(failed.values())} refused")
                last_line = time.monotonic()
        output.finish()
        os.replace(staged, out)
    except BaseException:  # Ctrl-C too: no half-written file is left behind, under either name
        output.abort()
        staged.unlink(missing_ok=True)
        raise
    return failed, rows


def staged_path(out: Path) -> Path:
    """Where a run writes OUT before the rename: beside it, named for this process."""
    return out.with_name(f".{out.name}.{os.getpid()}{PARTIAL_SUFFIX}")


HELD_ROWS = 100_000
"""Refused rows held back while no readable row has named the flattened columns yet; past this, the file is
written without them."""


class _Output:
    """The Parquet writer of the scores, opened once the flattened columns are known: the mapping's questions,
    or the first readable row's (rows refused before it are held back, up to `HELD_ROWS`, so a source whose
    first chunk holds no readable row still gets its `<qid>.label` columns)."""

    def __init__(self, path: Path, model: str, questions: dict[str, tuple] | None) -> None:
        self.path, self.model, self.flattened = path, model, questions
        self.writer: pq.ParquetWriter | None = None
        self.held: list[list[ScoredRow]] = []

    def write(self, scored: list[ScoredRow], asked: list[str]) -> None:
        if self.flattened is None and asked:
            self.flattened = dict.fromkeys(asked, ())
        self.held.append(scored)
        if self.flattened is not None or sum(map(len, self.held)) > HELD_ROWS:
            self._flush()

    def finish(self) -> None:
        """Everything held written (without question columns where no row named them), and the file closed."""
        self._flush()
        self.writer.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def _flush(self) -> None:
        if self.writer is None:
            self.flattened = self.flattened or {}
            self.schema = output_schema(self.flattened).with_metadata({"decision.model": self.model})
            self.writer = pq.ParquetWriter(self.path, self.schema)
        for part in self.held:
            self.writer.write_table(output_table(part, self.flattened, self.schema))
        self.held = []


def output_schema(flattened: dict[str, tuple]) -> pa.Schema:
    """The output columns: `row` (index in the source), `row_id`, `answers` (the API's JSON), `input_tokens`,
    `error` (reason code) and `error_message`; then `<qid>.label` and `<qid>.confidence` per flattened
    question."""
    fields = [
        ("row", pa.int64()),
        ("row_id", pa.string()),
        ("answers", pa.string()),
        ("input_tokens", pa.int64()),
        ("error", pa.string()),
        ("error_message", pa.string()),
    ]
    for qid in flattened:
        fields += [(f"{qid}.label", pa.string()), (f"{qid}.confidence", pa.float64())]
    return pa.schema(fields)


def output_table(scored: list[ScoredRow], flattened: dict[str, tuple], schema: pa.Schema) -> pa.Table:
    """Scored rows as a table of `output_schema`; a flattened question a row did not ask is null there, and a
    score with the table's labels of its levels is labelled by them."""
    columns: dict[str, list[Any]] = {
        "row": [r.row for r in scored],
        "row_id": [r.row_id for r in scored],
        "answers": [answers_json(r.answers) for r in scored],
        "input_tokens": [r.input_tokens for r in scored],
        "error": [r.error for r in scored],
        "error_message": [r.message for r in scored],
    }
    for qid, levels in flattened.items():
        answers = [(r.answers or {}).get(qid) for r in scored]
        chosen = [chosen_option(a) if a else None for a in answers]
        columns[f"{qid}.label"] = [levels[int(c)] if c is not None and levels else c for c in chosen]
        columns[f"{qid}.confidence"] = [_confidence(a) if a else None for a in answers]
    return pa.table(columns, schema=schema)


def _confidence(answer: dict[str, Any]) -> float:
    """The Jev confidence of a choice or score answer; a noul answer's `x_confidence` (max(P(true),
    P(false)))."""
    return answer["confidence"] if "confidence" in answer else answer["x_confidence"]


def _chained(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    yield first
    yield from rest


def _say(report: Callable[[str], None] | None, line: str) -> None:
    if report is not None:
        report(line)
