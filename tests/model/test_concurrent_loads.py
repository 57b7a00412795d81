"""Models loaded in several threads at once (a server's catalog and its shadow's) leave torch's initialisers as
they were: transformers swaps them for no-ops while it builds a model, process-wide."""

import math
import threading

import torch

from pipeline.families import load_decision_model


def test_concurrent_loads_leave_torch_init_working(tiny_base):
    before = {name: getattr(torch.nn.init, name) for name in ("normal_", "uniform_", "kaiming_uniform_")}
    errors = []

    def load_a_few():
        try:
            for _ in range(3):
                load_decision_model(tiny_base)
        except Exception as error:  # reported below; a thread's exception would otherwise vanish
            errors.append(error)

    threads = [threading.Thread(target=load_a_few) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert {name: getattr(torch.nn.init, name) for name in before} == before
    assert torch.isfinite(torch.nn.Linear(64, 64).weight).all()


def test_trainings_in_threads_leave_torch_init_working_and_learn_finite_weights(
    tiny_base, synthetic_train_file
):
    """A sweep's parallel trials: each loads the base and adds its adapters while the others do the same."""
    from pipeline.config import TrainConfig
    from pipeline.data.split import TrainSource
    from pipeline.training.fit import fit

    data = TrainSource(synthetic_train_file).validated()
    config = TrainConfig(method="lora", lora_r=4, lora_alpha=4, max_steps=2, micro_batch=8, threads=1)
    before = {name: getattr(torch.nn.init, name) for name in ("normal_", "uniform_", "kaiming_uniform_")}
    trained, errors = [], []

    def train_once():
        try:
            trained.append(fit(data, tiny_base, config, "cpu"))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=train_once) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(trained) == 3
    assert {name: getattr(torch.nn.init, name) for name in before} == before
    for run in trained:
        weights = [p for p in run.loaded.model.parameters() if p.requires_grad]
        assert weights and all(torch.isfinite(p).all() for p in weights)
        assert all(math.isfinite(loss) for _, loss in run.run.losses)
