"""The inference log: every answered decision written to the inference table, off the request's hot path.

The server hands `InferenceLog.record` the request and its answers; `record` only puts them on a bounded queue
(never blocks; a full queue drops the entry and counts it). A background thread serialises and writes what
has queued at least every `flush_s` seconds, and once more when the server stops (SIGTERM included), so a
SIGKILL loses at most the last interval. A write that fails (a full or read-only disk, a database down) drops
that batch, says so in the log once per kind of failure and counts it; serving goes on answering.

Redaction applies before anything is written: a JSON-object state's fields named by dotted path are dropped or
replaced by a keyed hash (HMAC-SHA256 with `DECISION_LOG_SALT` as key where set), so the same value still
joins with itself and nobody reads it back.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from pipeline.flywheel.table import Store, open_store, utc_now

log = logging.getLogger("decision.serve")
SALT_ENV = "DECISION_LOG_SALT"


@dataclass(frozen=True)
class LogConfig:
    """Where and what the server logs (`decision serve --inference-log ...`)."""

    where: str | None = "inference"
    """A folder (Parquet by day) or a postgresql:// URL; None turns the log off (`--no-inference-log`)."""
    sample: float = 1.0
    """The share of answered decisions written (`--log-sample`); the others still get a decision id."""
    drop_fields: tuple[str, ...] = ()
    """Dotted paths into JSON-object states, removed before writing (`--redact-drop`)."""
    hash_fields: tuple[str, ...] = ()
    """Dotted paths whose values are written as a keyed hash (`--redact-hash`)."""
    flush_s: float = 2.0
    """The longest an answered decision waits in memory (`--log-flush-seconds`)."""
    max_queue: int = 20_000
    """Entries waiting to be written before new ones are dropped and counted."""


@dataclass(frozen=True)
class Served:
    """One answered decision as the server saw it."""

    decision_id: str
    model: str
    model_version: str | None
    owner: str | None
    state: Any
    questions: dict[str, Any]
    answers: dict[str, Any]
    latency_ms: float
    time: Any = None  # set by `record`


class InferenceLog:
    """The bounded queue and the writer thread; `on_drop(reason, n)` counts what was not written."""

    def __init__(
        self,
        config: LogConfig,
        on_drop: Callable[[str, int], None] = lambda reason, n: None,
        on_write: Callable[[int], None] = lambda n: None,
        store: Store | None = None,
    ) -> None:
        if config.where is None:
            raise ValueError("the inference log is off (where=None): nothing to open")
        self.config = config
        self.store = store or open_store(config.where)
        self._queue: queue.Queue[Served] = queue.Queue(maxsize=config.max_queue)
        self._on_drop, self._on_write = on_drop, on_write
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # the thread's flush and `flush()` never write the same entries
        self._failures_logged: set[str] = set()
        self._thread: threading.Thread | None = None
        self._random = random.Random()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inference-log", daemon=True)
        self._thread.start()
        log.info(
            "inference log: %s (sample %.2f, flush every %.1f s)",
            self.store.where,
            self.config.sample,
            self.config.flush_s,
        )

    def stop(self) -> None:
        """Write everything queued, then end the thread (the server's shutdown, SIGTERM included)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()

    def record(self, served: Served) -> bool:
        """Queue one decision (sampled); False where it is not logged. Never blocks, never raises."""
        if self.config.sample < 1.0 and self._random.random() >= self.config.sample:
            return False
        try:
            self._queue.put_nowait(served if served.time else _stamped(served))
        except queue.Full:
            self._on_drop("queue_full", 1)
            return False
        return True

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def flush(self) -> int:
        """Write what is queued now; how many rows were written (0 where the write failed)."""
        with self._write_lock:
            entries = []
            while True:
                try:
                    entries.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not entries:
                return 0
            return self._write(entries)

    def _run(self) -> None:
        while not self._stop.wait(self.config.flush_s):
            self.flush()

    def _write(self, entries: list[Served]) -> int:
        try:
            rows = [self._row(entry) for entry in entries]
            self.store.append("decisions", rows)
        except Exception as error:  # a full disk, a read-only folder, a database down: serving goes on
            reason = "write_error"
            if type(error).__name__ not in self._failures_logged:
                self._failures_logged.add(type(error).__name__)
                log.error(
                    "inference log: could not write %d decisions to %s (%s: %s); dropping them and "
                    "counting drops on /metrics",
                    len(entries),
                    self.store.where,
                    type(error).__name__,
                    error,
                )
            self._on_drop(reason, len(entries))
            return 0
        self._on_write(len(rows))
        return len(rows)

    def _row(self, entry: Served) -> dict[str, Any]:
        state = redact(entry.state, self.config.drop_fields, self.config.hash_fields)
        return {
            "decision_id": entry.decision_id,
            "time": entry.time,
            "model": entry.model,
            "model_version": entry.model_version,
            "owner": entry.owner,
            "state": _json(state),
            "questions": _json(entry.questions),
            "answers": _json(entry.answers),
            "latency_ms": float(entry.latency_ms),
        }


def _stamped(served: Served) -> Served:
    return replace(served, time=utc_now())


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def redact(state: Any, drop: tuple[str, ...], hashed: tuple[str, ...]) -> Any:
    """A copy of a JSON-object state with the dotted paths in `drop` removed and those in `hashed` replaced
    by `sha256:<hex>` (keyed by DECISION_LOG_SALT where set); any other state is returned as it is."""
    if not isinstance(state, dict) or not (drop or hashed):
        return state
    copy = orjson.loads(orjson.dumps(state, option=orjson.OPT_NON_STR_KEYS))
    for path in drop:
        _apply(copy, path.split("."), None)
    for path in hashed:
        _apply(copy, path.split("."), hash_value)
    return copy


def _apply(node: Any, path: list[str], change: Callable[[Any], Any] | None) -> None:
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            return
        node = node[part]
    if isinstance(node, dict) and path[-1] in node:
        if change is None:
            del node[path[-1]]
        else:
            node[path[-1]] = change(node[path[-1]])


def hash_value(value: Any) -> str:
    data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    salt = os.environ.get(SALT_ENV)
    digest = hmac.new(salt.encode(), data, "sha256").hexdigest() if salt else hashlib.sha256(data).hexdigest()
    return f"sha256:{digest}"
