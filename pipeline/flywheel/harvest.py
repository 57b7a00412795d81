"""Labelled decisions as decision rows: the join of feedback to the inference log, and the shard they become.

A harvested row is `{state, questions, gold}` with only the questions that have feedback (as they were asked),
plus its provenance (`decision_id`, `decided_at`, `decided_by`: the model name and version that answered),
which training never reads. A decision already in a harvested shard of the data set is not harvested again, so
no row appears twice. The shard is written beside the data set under a dot-name and renamed into it: a harvest
killed mid-write leaves no half shard.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.sources import PROVENANCE_COLUMNS, Source
from pipeline.flywheel.table import Store, is_model, utc_now

SHARD_PREFIX = "harvest-"


class HarvestRefused(ValueError):
    """The data set cannot take harvested rows (not a folder of shards, a mapped table); says what to do."""


@dataclass(frozen=True)
class Labelled:
    """Decision rows built from feedback, and what was left out."""

    rows: list[dict[str, Any]]
    already_harvested: int
    """Decisions with feedback that an earlier harvest wrote."""
    not_logged: int
    """Decisions with feedback but no logged decision (a feedback table shared with another log)."""
    other_models: dict[str, int] = field(default_factory=dict)
    """Labelled decisions another model made, by its name: another run's traffic in a shared log."""
    late_labels: int = 0
    """Labels given after their decision was harvested (new, or changed): not in any row (a decision is
    harvested once, so no row appears twice with two golds)."""


def labelled_rows(store: Store, harvested: dict[str, dict[str, Any]], model: str | None = None) -> Labelled:
    """Every logged decision of `model` (a name, or NAME/VERSION; None: any model) with feedback and not among
    the `harvested` ones (decision id -> the gold its row holds), as a decision row with its provenance."""
    gold: dict[str, dict[str, Any]] = {}
    for row in store.feedback().to_pylist():
        gold.setdefault(row["decision_id"], {})[row["question_id"]] = orjson.loads(row["gold"])
    late = sum(
        harvested[d].get(q) != label for d in set(gold) & set(harvested) for q, label in gold[d].items()
    )
    wanted = set(gold) - set(harvested)
    decisions = store.decisions(ids=wanted).to_pylist() if wanted else []
    other_models: Counter[str] = Counter()
    rows = []
    for decision in decisions:
        if model and not is_model(decision["model"], model):
            other_models[decision["model"].split("/")[0]] += 1
            continue
        questions = orjson.loads(decision["questions"])
        labels = gold[decision["decision_id"]]
        rows.append(
            {
                "state": orjson.loads(decision["state"]),
                "questions": {qid: questions[qid] for qid in labels if qid in questions},
                "gold": labels,
                "decision_id": decision["decision_id"],
                "decided_at": decision["time"].isoformat(),
                "decided_by": decision["model"],
            }
        )
    return Labelled(
        rows, len(set(gold) & set(harvested)), len(wanted) - len(decisions), dict(other_models), late
    )


def harvest_target(source: Source) -> str:
    """The shard format a data set takes harvested rows in (parquet or jsonl); HarvestRefused otherwise."""
    if source.kind != "shards" or source.pin_path is None or not source.pin_path.is_dir():
        raise HarvestRefused(
            f"{source.text}: harvested rows go into a folder of Parquet or JSONL shards, and this data set "
            f"is {'one file' if source.kind == 'file' else source.kind}; move it into a folder (mkdir "
            "data/mine && mv FILE data/mine/), point the run config's retrain.data at the folder, and pin "
            "it (decision init)"
        )
    return source.fmt


def harvested_gold(source: Source) -> dict[str, dict[str, Any]]:
    """The decisions already in the data set's harvested shards: decision id -> the gold its row holds."""
    harvested: dict[str, dict[str, Any]] = {}
    for shard in source.shards:
        if not shard.path.name.startswith(SHARD_PREFIX):
            continue
        if shard.fmt == "parquet":
            table = pq.read_table(shard.path, columns=["decision_id", "gold"]).to_pylist()
        else:
            lines = shard.path.read_text(encoding="utf-8").splitlines()
            table = [orjson.loads(line) for line in lines if line.strip()]
        for row in table:
            gold = row["gold"]
            harvested[row["decision_id"]] = orjson.loads(gold) if isinstance(gold, str) else gold
    return harvested


def write_shard(folder: Path, fmt: str, rows: list[dict[str, Any]], like: pa.Schema | None) -> Path:
    """A new shard of `rows` in `folder` (renamed in whole). Parquet takes the decision columns' types of the
    existing shards (`like`): JSON text where they hold text, so every shard keeps one schema."""
    suffix = "parquet" if fmt == "parquet" else "jsonl"
    name = f"{SHARD_PREFIX}{utc_now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}.{suffix}"
    staged = folder.parent / f".{folder.name}.{name}.tmp"  # beside the folder: DVC never hashes a half shard
    try:
        if fmt == "parquet":
            pq.write_table(_parquet_table(rows, like), staged)
        else:
            staged.write_text(
                "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8"
            )
        os.replace(staged, folder / name)
    finally:
        staged.unlink(missing_ok=True)
    return folder / name


def _parquet_table(rows: list[dict[str, Any]], like: pa.Schema | None) -> pa.Table:
    columns: dict[str, list[Any]] = {}
    for name in ("state", "questions", "gold"):
        text = (
            like is None
            or name not in like.names
            or pa.types.is_string(like.field(name).type)
            or pa.types.is_large_string(like.field(name).type)
        )
        if not text:
            raise HarvestRefused(
                f"the data set's shards hold {name} as {like.field(name).type}; harvested rows "
                "are written as JSON text, so keep decision columns as text (JSON) in Parquet shards"
            )
        columns[name] = [_text(row[name]) for row in rows]
    for name in PROVENANCE_COLUMNS:
        columns[name] = [row[name] for row in rows]
    table = pa.table(columns)
    return table if like is None else table.cast(_matching(table.schema, like))


def _matching(schema: pa.Schema, like: pa.Schema) -> pa.Schema:
    return pa.schema([like.field(f.name) if f.name in like.names else f for f in schema])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@contextmanager
def harvest_lock(folder: Path, wait: bool = True) -> Iterator[None]:
    """One harvest of a data set at a time: the second waits (or, with wait=False, is refused at once)."""
    lock_path = folder.parent / f".{folder.name}.harvest.lock"
    with lock_path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise HarvestRefused(
                f"{folder}: another harvest is writing to it; rerun when it has finished"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
