"""Models loaded in several threads at once (a server's catalog and its shadow's) leave torch's initialisers as
they were: transformers swaps them for no-ops while it builds a model, process-wide."""

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
