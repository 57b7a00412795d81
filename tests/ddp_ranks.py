"""One rank of the data-parallel equality check in `tests/model/test_ddp.py`, as torchrun starts it; the test
also calls `train_tiny` and `first_window_gradients` in its own process as the one-process reference.

The families' heads carry dropout (Laya's head 0.1, the joint lexical bag 0.3), whose masks each rank draws
from its own generator: a data-parallel run is then the same in distribution, not in value, so the check turns
every dropout off and compares values.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/ddp_ranks.py SPEC OUT
"""

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from pipeline.config import TrainConfig
from pipeline.data.split import TrainSource
from pipeline.families import resolve_training
from pipeline.training.candidates import prepare_fit
from pipeline.training.controls import RunControls
from pipeline.training.loop import TrainResult, accumulate_gradients, plan_windows, train
from pipeline.training.ranks import Ranks, join_ranks, leave_ranks
from tests.tiny import without_dropout


def _ready(data: str, base: str, config: TrainConfig):
    """The stage's preparation on the CPU (seeded, as `fit` seeds it), dropout off: model, examples, task."""
    _, config = resolve_training(base, config)
    prepared = prepare_fit(TrainSource(data).validated(), base, config, "cpu")
    family, loaded = prepared.family, prepared.loaded
    torch.manual_seed(config.seed)
    family.prepare(loaded, config)
    family.learn_from_rows(loaded, prepared.train_examples)
    without_dropout(loaded.model)
    ready = family.training_examples(
        loaded, prepared.train_examples, config, prepared.device, lambda line: None
    )
    return loaded.model, ready, family.batch_task(loaded, config)


def _trainable(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def train_tiny(data: str, base: str, config: TrainConfig, ranks: Ranks | None = None):
    """The training loop after the stage's preparation: the trained parameters and the loop's result."""
    model, ready, task = _ready(data, base, config)
    result = train(model, ready, config, torch.device("cpu"), task, controls=RunControls(ranks=ranks))
    return {name: p.detach().clone() for name, p in _trainable(model).items()}, result


def first_window_gradients(
    data: str, base: str, config: TrainConfig, ranks: Ranks | None = None
) -> dict[str, torch.Tensor]:
    """The gradient of the first window's mean loss at the start, by parameter; with `ranks`, this rank's
    share of the window all-reduced as the loop does it."""
    ranks = ranks or Ranks()
    model, ready, task = _ready(data, base, config)
    window = plan_windows(len(ready), config, [len(e) for e in ready])[0]
    model.train()
    loss = accumulate_gradients(
        ranks.shard(window),
        ready,
        config.micro_batch,
        lambda indices: task.summed_loss(model, task.collate([ready[i] for i in indices]), None),
        len(window),
    )
    trainable = _trainable(model)
    ranks.reduce(list(trainable.values()), loss)
    return {name: torch.zeros_like(p) if p.grad is None else p.grad.clone() for name, p in trainable.items()}


def saved_result(out: str) -> tuple[dict[str, torch.Tensor], TrainResult, dict[str, torch.Tensor]]:
    """Rank 0's trained parameters, loop result and first-window gradients."""
    saved = torch.load(out, weights_only=False)
    return saved["parameters"], TrainResult(**saved["result"]), saved["gradients"]


def main(spec_file: str, out: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    config = TrainConfig(**spec["config"])
    ranks = join_ranks(torch.device("cpu"), config.dist_timeout_minutes)
    try:
        gradients = first_window_gradients(spec["data"], spec["base"], config, ranks)
        trained, result = train_tiny(spec["data"], spec["base"], config, ranks)
        if ranks.is_main:
            torch.save({"parameters": trained, "result": asdict(result), "gradients": gradients}, out)
    finally:
        leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
