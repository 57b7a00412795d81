"""Micro-batching for the Decision API: concurrent requests share one forward pass.

Requests wait in a bounded queue, one line per caller. One worker takes waiting requests from the callers in
turn (one from each, round-robin), gathers for at most `max_wait_s` (or until `max_items` questions), and runs
them together in a single inference thread, so torch keeps every core for one batch instead of splitting them
between requests. While a batch runs, new arrivals queue up and form the next batch, so under load batches
grow without any added wait. Taking callers in turn means that a caller with many requests waiting delays
another caller's request by about one batch, not by everything it queued first. A full queue is refused at
once (the server answers 503 with Retry-After), to the caller with the most requests waiting: a newcomer with
fewer takes the place of that caller's latest one, which gets the refusal. A failing request fails alone: a
batch that raises is run again one job at a time, so only the job that raises gets the exception.

    batcher = MicroBatcher(run_batch, max_items=64, max_wait_s=0.002, max_queue=256)
    result = await batcher.submit(key, payload, n_items, caller="alice")
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
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


class CallerQueues:
    """Waiting jobs, one line per caller, taken from the callers in turn; `len` counts every waiting job."""

    def __init__(self) -> None:
        self._lines: dict[Hashable, deque[Job]] = {}  # in turn order: the next caller to serve first
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def waiting(self, caller: Hashable) -> int:
        return len(self._lines.get(caller, ()))

    def put(self, caller: Hashable, job: Job) -> None:
        self._lines.setdefault(caller, deque()).append(job)
        self._count += 1

    def take(self) -> Job:
        """The first job of the caller whose turn it is; that caller's turn passes to the back."""
        caller, line = next(iter(self._lines.items()))
        job = line.popleft()
        del self._lines[caller]
        if line:
            self._lines[caller] = line
        self._count -= 1
        return job

    def shed_for(self, caller: Hashable) -> Job | None:
        """Room for one job of `caller` in a full queue: the latest job of the caller with the most waiting,
        taken out, where that is more than `caller` has; None (the newcomer is refused) otherwise."""
        if not self._lines:  # a queue bound of 0: nothing to shed
            return None
        heaviest = max(self._lines, key=lambda other: len(self._lines[other]))
        if len(self._lines[heaviest]) <= self.waiting(caller) + 1:
            return None
        self._count -= 1
        return self._lines[heaviest].pop()


# run_batch gets jobs with the same key and returns one result or exception per job, in order.
RunBatch = Callable[[Hashable, list[Any]], list[Any]]


class MicroBatcher:
    """Bounded queue plus one worker that batches jobs with the same key."""

    def __init__(
        self,
        run_batch: RunBatch,
        max_items: int = 64,
        max_wait_s: float = 0.002,
        max_queue: int = 256,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> None:
        self._run_batch = run_batch
        self._on_batch = on_batch  # (requests, questions) of every batch run, for the server's metrics
        self.max_items, self.max_wait_s, self.max_queue = max_items, max_wait_s, max_queue
        self._queue = CallerQueues()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self.batches = 0  # counters for /healthz and the tests
        self.jobs = 0
        self.running = 0  # batches in the inference thread now

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._arrived = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=True)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """A batch is running or a request is waiting (what background work yields to)."""
        return self.running > 0 or self.queued > 0

    async def submit(self, key: Hashable, payload: Any, n_items: int, caller: Hashable = None) -> Any:
        """Queue one job of `caller` and wait for its result. QueueFull at once when the queue is at its bound
        and `caller` has as many waiting as any other caller (else that caller's latest job gets it
        instead)."""
        if self._arrived is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        if len(self._queue) >= self.max_queue:
            shed = self._queue.shed_for(caller)
            if shed is None:
                raise QueueFull(f"{len(self._queue)} requests waiting")
            _settle(shed.future, QueueFull(f"{len(self._queue)} requests waiting; another caller's turn"))
        job = Job(key, payload, n_items, asyncio.get_running_loop().create_future())
        self._queue.put(caller, job)
        self._arrived.set()
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
        """The group's results; when the batch raises, each job alone, so the failure stays with its own
        job."""
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
        await self._next_arrival(None)
        jobs = [self._queue.take()]
        items = jobs[0].n_items
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while items < self.max_items:
            if not self._queue and not await self._next_arrival(deadline):
                break
            job = self._queue.take()
            jobs.append(job)
            items += job.n_items
        return jobs

    async def _next_arrival(self, deadline: float | None) -> bool:
        """Wait until a job is waiting (or `deadline`, on the loop's clock, passes); whether one is."""
        assert self._arrived is not None
        while not self._queue:
            self._arrived.clear()
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return bool(self._queue)
        return True


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
