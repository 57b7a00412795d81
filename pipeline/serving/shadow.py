"""Shadow scoring: a challenger answers a sampled share of the champion's requests, off the hot path.

The champion answers first and its answer goes out; only then is the request offered to the shadow, which
takes it with probability `share` into a bounded queue (full: the request is dropped and counted, never
waited for). One background thread asks the challenger (its own catalog, so `models:/NAME@challenger` is
followed like the serving alias) and compares: agreement on the chosen option and the mean |delta p| over each
question's options, and the challenger's latency. The summary is on `/v1/shadow`, in the log every
`report_every_s`, and (through `on_report`) in MLflow as metrics of the challenger version's run.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.data.answers import ParsedRequest, answer_probabilities

log = logging.getLogger("decision.serve")


@dataclass
class ShadowStats:
    """Running comparison of the challenger with the champion."""

    offered: int = 0
    scored: int = 0
    dropped: int = 0
    failed: int = 0
    decisions: int = 0
    agreements: int = 0
    abs_diff_sum: float = 0.0
    latency_s: deque = field(default_factory=lambda: deque(maxlen=2000))

    def add(
        self, champion: dict[str, dict[str, Any]], challenger: dict[str, dict[str, Any]], seconds: float
    ) -> None:
        self.scored += 1
        self.latency_s.append(seconds)
        for qid, ours in champion.items():
            theirs = challenger.get(qid)
            if theirs is None:
                continue
            p, q = np.asarray(answer_probabilities(ours)), np.asarray(answer_probabilities(theirs))
            if p.shape != q.shape:
                continue
            self.decisions += 1
            self.agreements += int(p.argmax() == q.argmax())
            self.abs_diff_sum += float(np.abs(p - q).mean())

    def summary(self) -> dict[str, Any]:
        ms = np.asarray(self.latency_s) * 1000
        return {
            "offered": self.offered,
            "scored": self.scored,
            "dropped": self.dropped,
            "failed": self.failed,
            "decisions": self.decisions,
            "agreement": self.agreements / self.decisions if self.decisions else None,
            "mean_abs_diff": self.abs_diff_sum / self.decisions if self.decisions else None,
            "challenger_latency_ms": {
                "p50": float(np.percentile(ms, 50)),
                "p95": float(np.percentile(ms, 95)),
            }
            if len(ms)
            else None,
        }


class ShadowScorer:
    """Scores a sampled share of answered requests with the challenger in a background thread."""

    def __init__(
        self,
        source,
        share: float = 0.1,
        max_queue: int = 64,
        report_every_s: float = 60.0,
        on_report: Callable[[str, dict[str, Any]], None] | None = None,
        seed: int | None = None,
    ) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"--shadow-share must be in (0, 1], got {share}")
        self.source, self.share = source, share
        self.report_every_s, self.on_report = report_every_s, on_report
        self.busy: Callable[[], bool] = lambda: False  # set by start(): the shadow waits while this is true
        self.stats = ShadowStats()
        self._queue: queue.Queue[tuple[ParsedRequest, dict[str, Any]]] = queue.Queue(maxsize=max_queue)
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, busy: Callable[[], bool] = lambda: False) -> None:
        """Load the challenger and start scoring; `busy` (the serving batcher's) says when to hold back."""
        self.busy = busy
        self.source.start()
        self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._report()
        self.source.stop()

    def offer(self, request: ParsedRequest, champion_answers: dict[str, Any]) -> None:
        """Take the answered request with probability `share`; never blocks (a full queue drops it)."""
        with self._lock:
            self.stats.offered += 1
            if self._random.random() >= self.share:
                return
            try:
                self._queue.put_nowait((request, champion_answers))
            except queue.Full:
                self.stats.dropped += 1

    def summary(self) -> dict[str, Any]:
        serving = self.source.serving
        with self._lock:
            return {
                "challenger": serving.name if serving else None,
                "share": self.share,
                "load_error": self.source.load_error,
                **self.stats.summary(),
            }

    def _run(self) -> None:
        reported = time.monotonic()
        while not self._stop.is_set():
            try:
                request, champion = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            # The cores belong to the champion's requests: score only while its batcher is idle. Under load
            # the queue fills and new requests are dropped (counted), so the shadow samples less, never slows
            # answers.
            while self.busy() and not self._stop.wait(0.002):
                pass
            self._score(request, champion)
            if time.monotonic() - reported >= self.report_every_s:
                self._report()
                reported = time.monotonic()

    def _score(self, request: ParsedRequest, champion: dict[str, Any]) -> None:
        challenger = self.source.serving
        if challenger is None:
            with self._lock:
                self.stats.dropped += 1
            return
        started = time.perf_counter()
        try:
            [result] = challenger.model.answer([request])
        except Exception as error:  # the shadow must never take the server down
            log.warning("shadow %s failed on a request: %s", challenger.name, error)
            result = error
        with self._lock:
            if isinstance(result, Exception):
                self.stats.failed += 1
            else:
                self.stats.add(champion, result.answers, time.perf_counter() - started)

    def _report(self) -> None:
        summary = self.summary()
        if not summary["scored"]:
            return
        log.info(
            "shadow %s: %d scored, agreement %.4f, mean |dp| %.4f, p50 %.1f ms",
            summary["challenger"],
            summary["scored"],
            summary["agreement"] or 0.0,
            summary["mean_abs_diff"] or 0.0,
            (summary["challenger_latency_ms"] or {}).get("p50", 0.0),
        )
        if self.on_report is not None and summary["challenger"]:
            try:
                self.on_report(summary["challenger"], summary)
            except Exception as error:  # a tracking store that is down must not stop the shadow
                log.warning("shadow: could not record the summary: %s", error)
