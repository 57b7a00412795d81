"""Micro-batching for the Decision API: concurrent requests share one forward pass.

Requests wait in a bounded queue. One worker takes the first waiting request, gathers more for at most
`max_wait_s` (or until `max_items` questions), and runs them together in a single inference thread, so
torch keeps every core for one batch instead of splitting them between requests. While a batch runs, new
arrivals queue up and form the next batch, so under load batches grow without any added wait. A full queue
is refused at once (the server answers 503 with Retry-After), and a failing request fails alone: a batch that
raises is run again one job at a time, so only the job that raises gets the exception.

    batcher = MicroBatcher(run_batch, max_items=64, max_wait_s=0.002, max_queue=256)
    result = await batcher.submit(key, payload, n_items)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class QueueFull(RuntimeError):
    """The request queue is at its bound; the caller should retry later."""


@dataclass
class Job:
    """One request waiting for its share of a batch; `key` groups jobs that may share a forward pass."""

    key: Hashable
    payload: Any
    n_items: int
    future: asyncio.Future = field(repr=False)


# run_batch gets jobs with the same key and returns one result or exception per job, in order.
RunBatch = Callable[[Hashable, list[Any]], list[Any]]


class MicroBatcher:
    """Bounded queue plus one worker that batches jobs with the same key."""

    def __init__(self, run_batch: RunBatch, max_items: int = 64, max_wait_s: float = 0.002,
                 max_queue: int = 256, on_batch: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
        self._run_batch = run_batch
        self._on_batch = on_batch  # (requests, questions) of every batch run, for the server's metrics
        self.max_items, self.max_wait_s, self.max_queue = max_items, max_wait_s, max_queue
        self._queue: asyncio.Queue[Job] | None = None
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self.batches = 0  # counters for /healthz and the tests
        self.jobs = 0
        self.running = 0  # batches in the inference thread now

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=True)

    @property
    def queued(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    @property
    def busy(self) -> bool:
        """A batch is running or a request is waiting (what background work yields to)."""
        return self.running > 0 or self.queued > 0

    async def submit(self, key: Hashable, payload: Any, n_items: int) -> Any:
        """Queue one job and wait for its result; QueueFull at once when the queue is at its bound."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        if self._queue.qsize() >= self.max_queue:
            raise QueueFull(f"{self._queue.qsize()} requests waiting")
        job = Job(key, payload, n_items, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        return await job.future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._gather()
            for key, group in _by_key(jobs).items():
                results = await self._run_apart_on_failure(loop, key, group)
                if self._on_batch is not None:
                    self._on_batch(len(group), sum(j.n_items for j in group))
                self.batches += 1
                self.jobs += len(group)
                for job, result in zip(group, results):
                    _settle(job.future, result)

    async def _run_apart_on_failure(self, loop, key: Hashable, group: list[Job]) -> list[Any]:
        """The group's results; when the batch raises, each job alone, so the failure stays with its own job."""
        self.running += 1
        try:
            return await loop.run_in_executor(
                self._executor, self._run_batch, key, [j.payload for j in group]
            )
        except Exception as error:
            if len(group) == 1:
                return [error]
        finally:
            self.running -= 1
        results = []
        for job in group:
            results.extend(await self._run_apart_on_failure(loop, key, [job]))
        return results

    async def _gather(self) -> list[Job]:
        assert self._queue is not None
        jobs = [await self._queue.get()]
        items = jobs[0].n_items
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while items < self.max_items:
            if self._queue.empty():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                job = self._queue.get_nowait()
            jobs.append(job)
            items += job.n_items
        return jobs


def _by_key(jobs: list[Job]) -> dict[Hashable, list[Job]]:
    groups: dict[Hashable, list[Job]] = {}
    for job in jobs:
        groups.setdefault(job.key, []).append(job)
    return groups


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():  # the caller went away (client disconnect cancels the handler)
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
