"""The inference table (every logged decision) and the feedback table (the outcomes sent back for them).

By default both are Parquet files partitioned by day under one folder, readable by pandas, pyarrow or DuckDB:

    inference/decisions/day=2026-12-03/part-20261203T101500-4242-1a2b3c4d.parquet
    inference/feedback/day=2026-12-03/part-....parquet

Each flush is one new file, written under a dot-name and renamed, so a reader (or a kill) never sees half a
file. With a `postgresql://` URL both are tables in that database instead (`decision_log`,
`decision_feedback`).

Feedback is idempotent per (decision_id, question_id): PostgreSQL upserts; the Parquet table appends and every
read keeps the latest entry of each pair, so a re-send replaces the label and never adds a second one.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pipeline.masking import error_reason

DECISIONS = pa.schema(
    [
        ("decision_id", pa.string()),
        ("time", pa.timestamp("us", tz="UTC")),
        ("model", pa.string()),  # the name the model answered under, e.g. decision-model/3
        ("model_version", pa.string()),  # the registry version, null for an export folder
        ("owner", pa.string()),  # the key's owner, null for a keyless caller or an open server
        ("state", pa.string()),  # JSON text, after redaction
        ("questions", pa.string()),  # JSON text, as sent
        ("answers", pa.string()),  # JSON text, as answered (calibrated)
        ("latency_ms", pa.float64()),
    ]
)
FEEDBACK = pa.schema(
    [
        ("decision_id", pa.string()),
        ("question_id", pa.string()),
        ("gold", pa.string()),  # JSON text: a label, or {label, probabilities}
        ("labelled_by", pa.string()),  # the key's owner (null on an open server), or `import` for a file
        ("time", pa.timestamp("us", tz="UTC")),
    ]
)
TABLES = {"decisions": DECISIONS, "feedback": FEEDBACK}
FEEDBACK_KEY = ("decision_id", "question_id")
POSTGRES_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")


def new_decision_id() -> str:
    return uuid.uuid4().hex


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Store(Protocol):
    """Where decisions and feedback are kept: `ParquetStore` or `PostgresStore`, chosen by `open_store`."""

    where: str

    def append(self, table: str, rows: list[dict[str, Any]]) -> None: ...

    def decisions(
        self,
        ids: Iterable[str] | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> pa.Table: ...

    def feedback(self) -> pa.Table: ...


class StoreUnavailable(OSError):
    """The inference log's database cannot be reached (down, a wrong host or database, refused
    credentials)."""


def is_model(logged: str, wanted: str) -> bool:
    """Whether a logged decision's model (NAME/VERSION as served from the registry, or an export's name) is
    `wanted`: a name (every version) or NAME/VERSION."""
    return logged == wanted or logged.startswith(wanted + "/")


def missing_log(where: str | Path) -> str | None:
    """Why `where` holds no inference log to read, or None: a folder that does not exist (a typo, read as a
    log with nothing in it, would look like a quiet window forever)."""
    text = str(where)
    if "://" in text or Path(text).is_dir():
        return None
    return (
        f"{text}: no inference log there (`decision serve --inference-log {text}` writes one; --inference "
        "names another)"
    )


def open_store(where: str | Path) -> Store:
    """A `postgresql://` URL is a database; anything else is the folder of the Parquet tables.
    StoreUnavailable for a database that cannot be reached."""
    text = str(where)
    if text.startswith(POSTGRES_SCHEMES):
        return PostgresStore(text)
    return ParquetStore(Path(text))


class ParquetStore:
    """Both tables as day-partitioned Parquet under `root` (a new file per append, renamed into place)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.where = str(self.root)

    def append(self, table: str, rows: list[dict[str, Any]]) -> None:
        """One file per day the rows fall on; OSError (a full or read-only disk) reaches the caller."""
        schema = TABLES[table]
        by_day: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(row["time"].strftime("%Y-%m-%d"), []).append(row)
        for day, day_rows in by_day.items():
            folder = self.root / table / f"day={day}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{utc_now():%Y%m%dT%H%M%S%f}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
            staged = folder / f".{name}.tmp"  # pyarrow's readers skip dot-files: never read half-written
            try:
                pq.write_table(pa.Table.from_pylist(day_rows, schema=schema), staged)
                os.replace(staged, folder / name)
            finally:
                staged.unlink(missing_ok=True)

    def _read(self, table: str, where: ds.Expression | None = None) -> pa.Table:
        folder = self.root / table
        if not folder.is_dir():
            return TABLES[table].empty_table()
        data = ds.dataset(folder, format="parquet", partitioning="hive", schema=TABLES[table])
        return data.to_table(filter=where, columns=TABLES[table].names)

    def decisions(
        self,
        ids: Iterable[str] | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> pa.Table:
        """Logged decisions, optionally only these ids or those in [since, until)."""
        where = _decision_filter(ids, since, until)
        return self._read("decisions", where).sort_by("time")

    def feedback(self) -> pa.Table:
        """The latest gold of each (decision_id, question_id)."""
        return latest_feedback(self._read("feedback"))


def _decision_filter(
    ids: Iterable[str] | None, since: dt.datetime | None, until: dt.datetime | None
) -> ds.Expression | None:
    terms = []
    if ids is not None:
        terms.append(ds.field("decision_id").isin(pa.array(list(ids), pa.string())))
    if since is not None:
        terms.append(ds.field("time") >= pa.scalar(since, pa.timestamp("us", tz="UTC")))
    if until is not None:
        terms.append(ds.field("time") < pa.scalar(until, pa.timestamp("us", tz="UTC")))
    where = None
    for term in terms:
        where = term if where is None else where & term
    return where


def latest_feedback(table: pa.Table) -> pa.Table:
    """Keep the latest row per (decision_id, question_id): a re-sent label replaces the earlier one."""
    if table.num_rows == 0:
        return table
    ordered = table.sort_by([("time", "descending")])
    seen: set[tuple[str, str]] = set()
    keep = []
    for key in zip(ordered["decision_id"].to_pylist(), ordered["question_id"].to_pylist()):
        keep.append(key not in seen)
        seen.add(key)
    return ordered.filter(pa.array(keep, pa.bool_())).sort_by("time")


class PostgresStore:
    """Both tables in a PostgreSQL database (created on first use); feedback upserts on its key."""

    def __init__(self, url: str) -> None:
        self.where = url.split("@")[-1]  # host/database only: never log a password
        driver_url = "postgresql+psycopg://" + url.split("://", 1)[1]
        self.engine = sa.create_engine(driver_url, pool_pre_ping=True)
        metadata = sa.MetaData()
        self.tables = {
            "decisions": _sql_table("decision_log", DECISIONS, metadata, ("decision_id",)),
            "feedback": _sql_table("decision_feedback", FEEDBACK, metadata, FEEDBACK_KEY),
        }
        try:
            metadata.create_all(self.engine)
        except sa.exc.SQLAlchemyError as error:  # one line, naming host and database only (never a password)
            reason = error_reason(getattr(error, "orig", None) or error, url)
            raise StoreUnavailable(
                f"{self.where}: the inference database cannot be used ({reason})"
            ) from None

    def append(self, table: str, rows: list[dict[str, Any]]) -> None:
        sql_table = self.tables[table]
        statement = pg_insert(sql_table).values(rows)
        if table == "feedback":
            changed = {c: statement.excluded[c] for c in ("gold", "labelled_by", "time")}
            statement = statement.on_conflict_do_update(index_elements=list(FEEDBACK_KEY), set_=changed)
        else:
            statement = statement.on_conflict_do_nothing(index_elements=["decision_id"])
        with self.engine.begin() as connection:
            connection.execute(statement)

    def decisions(
        self,
        ids: Iterable[str] | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> pa.Table:
        sql_table = self.tables["decisions"]
        query = sa.select(sql_table).order_by(sql_table.c.time)
        if ids is not None:
            query = query.where(sql_table.c.decision_id.in_(list(ids)))
        if since is not None:
            query = query.where(sql_table.c.time >= since)
        if until is not None:
            query = query.where(sql_table.c.time < until)
        return self._select(query, DECISIONS)

    def feedback(self) -> pa.Table:
        sql_table = self.tables["feedback"]
        return self._select(sa.select(sql_table).order_by(sql_table.c.time), FEEDBACK)

    def _select(self, query, schema: pa.Schema) -> pa.Table:
        with self.engine.connect() as connection:
            rows = [dict(row._mapping) for row in connection.execute(query)]
        return pa.Table.from_pylist(rows, schema=schema)


SQL_TYPES = {
    pa.string(): sa.Text,
    pa.float64(): sa.Float,
    pa.timestamp("us", tz="UTC"): sa.DateTime(timezone=True),
}


def _sql_table(name: str, schema: pa.Schema, metadata: sa.MetaData, key: tuple[str, ...]) -> sa.Table:
    columns = [sa.Column(f.name, SQL_TYPES[f.type], primary_key=f.name in key) for f in schema]
    return sa.Table(name, metadata, *columns, sa.Index(f"{name}_time", "time"))
