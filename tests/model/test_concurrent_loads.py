"""Models loaded in several threads at once (a server's catalog and its shadow's, a sweep's parallel trials)
leave torch's initialisers as they were: transformers swaps them for no-ops while it builds a model,
process-wide."""

import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from pipeline.config import TrainConfig
from pipeline.data.split import TrainSource
from pipeline.families import load_decision_model
from pipeline.training.fit import fit

INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_")


def in_threads(work: Callable[[], Any], count: int) -> list[Any]:
    """`work` in `count` threads at once; its results, after every thread is done (a thread's exception, which
    would otherwise vanish, is raised here)."""
    results, errors = [], []

    def run() -> None:
        try:
            results.append(work())
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def test_concurrent_loads_leave_torch_init_working(tiny_base):
    before = {name: getattr(torch.nn.init, name) for name in INITIALISERS}
    in_threads(lambda: [load_decision_model(tiny_base) for _ in range(3)], 4)
    assert {name: getattr(torch.nn.init, name) for name in before} == before
    assert torch.isfinite(torch.nn.Linear(64, 64).weight).all()


def test_trainings_in_threads_leave_torch_init_working_and_learn_finite_weights(
    tiny_base, synthetic_train_file
):
    """A sweep's parallel trials: each loads the base and adds its adapters while the others do the same."""
    data = TrainSource(synthetic_train_file).validated()
    config = TrainConfig(method="lora", lora_r=4, lora_alpha=4, max_steps=2, micro_batch=8, threads=1)
    before = {name: getattr(torch.nn.init, name) for name in INITIALISERS}
    trained = in_threads(lambda: fit(data, tiny_base, config, "cpu"), 3)
    assert len(trained) == 3
    assert {name: getattr(torch.nn.init, name) for name in before} == before
    for run in trained:
        weights = [p for p in run.loaded.model.parameters() if p.requires_grad]
        assert weights and all(torch.isfinite(p).all() for p in weights)
        assert all(math.isfinite(loss) for _, loss in run.run.losses)
