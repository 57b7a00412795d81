"""The micro-batcher: a batch that raises is run again one job at a time, so only the job that raises
fails."""

import asyncio
import threading

import pytest

from pipeline.serving.batching import MicroBatcher, QueueFull


def test_a_job_that_breaks_its_batch_fails_alone_and_its_batch_mates_are_answered():
    calls = []

    def run_batch(key, payloads):
        calls.append(list(payloads))
        if "poison" in payloads:
            raise TypeError("the tokenizer refused it")
        return [p.upper() for p in payloads]

    async def scenario():
        batcher = MicroBatcher(run_batch, max_items=8, max_wait_s=0.05)
        batcher.start()
        try:
            return await asyncio.gather(
                *(batcher.submit("model", p, 1) for p in ["a", "poison", "b"]), return_exceptions=True
            )
        finally:
            await batcher.stop()

    a, poison, b = asyncio.run(scenario())
    assert (a, b) == ("A", "B") and isinstance(poison, TypeError)
    assert calls[0] == ["a", "poison", "b"] and ["a"] in calls and ["b"] in calls  # batched, then apart


@pytest.mark.parametrize("n", [1, 5])
def test_a_batch_that_succeeds_runs_once(n):
    calls = []

    def run_batch(key, payloads):
        calls.append(len(payloads))
        return payloads

    async def scenario():
        batcher = MicroBatcher(run_batch, max_items=8, max_wait_s=0.05)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit("model", i, 1) for i in range(n)))
        finally:
            await batcher.stop()

    assert asyncio.run(scenario()) == list(range(n)) and calls == [n]


def _held_batcher(max_items: int, max_queue: int = 256):
    """A batcher whose first batch waits for `release`, so that what is submitted meanwhile queues up;
    `batches` records the payloads of every batch run."""
    release, batches = threading.Event(), []

    def run_batch(key, payloads):
        batches.append(list(payloads))
        release.wait(5)
        return payloads

    return (
        MicroBatcher(run_batch, max_items=max_items, max_wait_s=0.001, max_queue=max_queue),
        release,
        batches,
    )


def test_callers_are_taken_in_turn_so_one_callers_backlog_delays_another_by_one_batch():
    async def scenario():
        batcher, release, batches = _held_batcher(max_items=2)
        batcher.start()
        try:
            first = asyncio.ensure_future(batcher.submit("model", "a0", 1, caller="a"))
            while not batches:  # the first batch is running (and held)
                await asyncio.sleep(0.001)
            backlog = [
                asyncio.ensure_future(batcher.submit("model", f"a{i}", 1, caller="a")) for i in range(1, 6)
            ]
            late = asyncio.ensure_future(batcher.submit("model", "b1", 1, caller="b"))
            await asyncio.sleep(0.01)
            release.set()
            await asyncio.gather(first, *backlog, late)
            return batches
        finally:
            await batcher.stop()

    batches = asyncio.run(scenario())
    assert batches == [
        ["a0"],
        ["a1", "b1"],
        ["a2", "a3"],
        ["a4", "a5"],
    ]  # first come first served: b1 ran last


def test_a_full_queue_refuses_the_caller_with_the_most_waiting_not_a_newcomer():
    async def scenario():
        batcher, release, batches = _held_batcher(max_items=1, max_queue=4)
        batcher.start()
        try:
            held = asyncio.ensure_future(batcher.submit("model", "a0", 1, caller="a"))
            while not batches:
                await asyncio.sleep(0.001)
            flood = [
                asyncio.ensure_future(batcher.submit("model", f"a{i}", 1, caller="a")) for i in range(1, 6)
            ]
            await asyncio.sleep(0.01)  # a5 found the queue full with a's own: refused
            newcomers = [
                asyncio.ensure_future(batcher.submit("model", f"b{i}", 1, caller="b")) for i in range(1, 4)
            ]
            await asyncio.sleep(0.01)  # b1 and b2 took the places of a4 and a3; b3 found b as heavy as a
            release.set()
            return await asyncio.gather(held, *flood, *newcomers, return_exceptions=True)
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    refused = [i for i, result in enumerate(results) if isinstance(result, QueueFull)]
    answered = [result for result in results if not isinstance(result, QueueFull)]
    assert refused == [3, 4, 5, 8]  # a3, a4 (shed for b1, b2), a5 (full), b3 (full)
    assert answered == ["a0", "a1", "a2", "b1", "b2"]
