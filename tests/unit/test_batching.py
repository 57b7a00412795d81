"""The micro-batcher: a batch that raises is run again one job at a time, so only the job that raises fails."""

import asyncio

import pytest

from pipeline.serving.batching import MicroBatcher


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
            return await asyncio.gather(*(batcher.submit("model", p, 1) for p in ["a", "poison", "b"]),
                                        return_exceptions=True)  # fmt: skip
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
