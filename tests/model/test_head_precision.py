"""A head on a frozen backbone trains in fp32 whatever `train.precision` asks: its features are computed once
outside autocast and the head turns autocast off inside. The run records and says fp32, not the precision
asked for, and asking for bf16 changes none of its answers."""

from dataclasses import replace

import pytest
import torch

from pipeline.config import ValidateConfig
from pipeline.data.split import TrainSource
from pipeline.families import pick_family, resolve_training
from pipeline.training.controls import RunHooks
from pipeline.training.fit import fit
from pipeline.training.loop import train
from tests.tiny import JOINT_HEAD, write_learnable_rows

CONFIG = replace(JOINT_HEAD, epochs=2, threads=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rows = write_learnable_rows(tmp_path_factory.mktemp("rows") / "tone.jsonl", 64, seed=5)
    return TrainSource(
        rows, split_config=ValidateConfig(holdout_fraction=0.25, validation_fraction=0)
    ).validated()


@pytest.mark.parametrize("asked", ["bf16", "auto"])
def test_a_head_run_asked_for_another_precision_records_and_says_fp32(tiny_base, data, asked):
    lines: list[str] = []
    trained = fit(data, tiny_base, replace(CONFIG, precision=asked), "cpu", RunHooks(report=lines.append))
    assert trained.config.precision == "fp32" and trained.run.precision == "fp32"
    said = next(line for line in lines if "method head" in line)
    assert "precision fp32 (the head computes in fp32" in said


def _losses(base, data, precision: str) -> list[float]:
    """The training loop's losses for a head on cached features under `precision` (as the fit chain prepares
    it, without `resolve_training`, which would make it fp32)."""
    config = replace(CONFIG, precision=precision)
    family = pick_family(base, "joint")
    loaded = family.load(base, config, torch.device("cpu"))
    examples, _skipped = family.build_examples(loaded, data.split.train)
    torch.manual_seed(config.seed)
    family.prepare(loaded, config)
    family.learn_from_rows(loaded, examples)
    ready = family.training_examples(loaded, examples, config, torch.device("cpu"))
    result = train(loaded.model, ready, config, torch.device("cpu"), family.batch_task(loaded, config))
    assert result.precision == (
        "bfloat16" if precision == "bf16" else "fp32"
    )  # the loop did autocast to bf16
    return [loss for _step, loss in result.losses]


def test_bf16_autocast_changes_nothing_a_head_on_cached_features_computes(tiny_base, data):
    # Why the run may say fp32: under bf16 autocast the same head on the same features takes the same steps.
    assert _losses(tiny_base, data, "bf16") == _losses(tiny_base, data, "fp32")


def test_lora_keeps_the_precision_asked_for(tiny_base):
    _family, config = resolve_training(tiny_base, replace(CONFIG, method="lora", precision="bf16"))
    assert config.precision == "bf16"
