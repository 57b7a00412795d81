"""The training budget a user can reason about: epochs, raised for a small set to `min_steps`, capped by
`max_steps`, said in words; windows bucketed by length without losing or repeating an item within an epoch."""

from collections import Counter

from pipeline.config import TrainConfig
from pipeline.training.loop import eval_steps, plan_budget, plan_windows

CONFIG = TrainConfig(micro_batch=8, grad_accum=8, epochs=4, min_steps=0)


def test_epochs_decide_a_large_set():
    budget = plan_budget(22_554, CONFIG)
    assert (budget.windows_per_epoch, budget.epochs, budget.steps) == (353, 4, 1412)
    assert "4 epochs (train.epochs)" in budget.reason and budget.reason.endswith("1,412 steps")


def test_a_small_set_trains_more_epochs_until_min_steps_and_says_why():
    budget = plan_budget(1_000, TrainConfig(micro_batch=8, grad_accum=8, epochs=4, min_steps=300))
    assert budget.windows_per_epoch == 16 and budget.epochs == 19 and budget.steps == 304
    assert "fewer than train.min_steps 300, so 19 epochs" in budget.reason


def test_max_steps_caps_whatever_the_epochs_say():
    budget = plan_budget(22_554, TrainConfig(micro_batch=8, grad_accum=8, epochs=4, max_steps=150))
    assert budget.steps == 150 and "capped at train.max_steps 150" in budget.reason
    assert len(plan_windows(22_554, TrainConfig(micro_batch=8, grad_accum=8, max_steps=150))) == 150


def test_bucketed_windows_hold_every_item_once_per_epoch_and_pad_less():
    lengths = [(i * 7919) % 200 + 1 for i in range(3_000)]
    config = TrainConfig(micro_batch=16, grad_accum=2, epochs=2)
    bucketed, plain = plan_windows(3_000, config, lengths), plan_windows(3_000, config)
    assert len(bucketed) == len(plain) == 2 * 94
    first_epoch = Counter(i for window in bucketed[:94] for i in window)
    assert sorted(first_epoch) == list(range(3_000)) and set(first_epoch.values()) == {1}

    def padded(windows):
        return sum(len(w) * max(lengths[i] for i in w) for w in windows)

    assert padded(bucketed) < 0.7 * padded(plain)
    assert plan_windows(3_000, config, lengths) == bucketed  # seeded


def test_held_out_checkpoints_fall_inside_the_run():
    assert eval_steps(300) == {100, 200}
    assert eval_steps(2) == {1}
    assert eval_steps(1) == set()


def test_training_flushes_subnormal_floats_only_while_it_runs():
    import torch

    from pipeline.training.loop import flushed_denormals

    subnormal = torch.tensor([1e-40], dtype=torch.float32)
    with flushed_denormals():
        assert (subnormal * 1.0).item() == 0.0
    assert (subnormal * 1.0).item() > 0.0  # the process's float handling is as it was
