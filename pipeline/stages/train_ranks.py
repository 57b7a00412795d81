"""One rank of a data-parallel train stage, as torchrun starts it when `train.nproc` > 1 (not run by hand).

Rank 0 runs the stage itself (`train_stage` or `fit_and_save`: scoring, checkpoints, the saved fine-tune, the
summary) and sends its progress lines and events to the launching process (`training.launch`); the other ranks
prepare the same examples and train on their share of every window (`fit.follow_fit`). The spec file holds the
stage's arguments, configs and the split every rank reads (validated once, by the launcher's caller), written
by `stages.train`.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m pipeline.stages.train_ranks SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from pipeline.config import TrainConfig
from pipeline.data.pins import CheckedInputs
from pipeline.data.split import SplitData
from pipeline.device import pick_device
from pipeline.rundir import RunFolder
from pipeline.stages.train import fit_and_save, train_stage
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.fit import follow_fit
from pipeline.training.launch import emit_event
from pipeline.training.ranks import Ranks, join_ranks, leave_ranks, rank_device

RANK_HOOKS = RunHooks(
    report=lambda line: print(line, flush=True),
    on_log=lambda entry: emit_event("log", entry=entry),
    on_eval=lambda step, metrics: emit_event("eval", step=step, metrics=metrics),
)
"""Rank 0's lines and events, printed for the launcher to relay (`training.launch`)."""


def _lead_train_stage(spec: dict[str, Any], config: TrainConfig, device: str, ranks: Ranks) -> dict[str, Any]:
    arguments = spec["arguments"]
    run = train_stage(
        arguments["run_dir"],
        arguments["base"],
        config,
        device,
        RANK_HOOKS,
        RunControls(ranks=ranks),
        CheckedInputs(**arguments["checked"]),
    )
    return run.to_dict()


def _lead_fit_and_save(
    spec: dict[str, Any], config: TrainConfig, device: str, ranks: Ranks
) -> dict[str, Any]:
    arguments = spec["arguments"]
    hooks = RANK_HOOKS if arguments["report"] else RunHooks()
    run = fit_and_save(
        SplitData.load(spec["split"]),
        arguments["base"],
        arguments["out"],
        config,
        device,
        hooks,
        RunControls(progress=arguments["progress"], ranks=ranks),
        CheckedInputs(**arguments["checked"]),
    )
    return run.to_dict()


LEADS = {"train_stage": _lead_train_stage, "fit_and_save": _lead_fit_and_save}
"""What rank 0 runs, by the spec's `job`."""


def _follow(spec: dict[str, Any], config: TrainConfig, device: str, ranks: Ranks) -> None:
    run_dir = spec["arguments"].get(
        "run_dir"
    )  # the stage's run folder: resume from rank 0's checkpoint, as it does
    checkpoints = Checkpointer(RunFolder(run_dir).checkpoint, config) if run_dir else None
    follow_fit(
        SplitData.load(spec["split"]),
        spec["arguments"]["base"],
        config,
        device,
        RunControls(checkpoints=checkpoints, ranks=ranks),
    )


@record  # torchrun then reports this rank's traceback as the root cause of a failure
def main(argv: list[str] | None = None) -> int:
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    config = TrainConfig(**spec["config"])
    device = rank_device(pick_device(spec["device"]))
    ranks = join_ranks(device, config.dist_timeout_minutes)
    try:
        if ranks.is_main:
            result = LEADS[spec["job"]](spec, config, str(device), ranks)
            Path(spec["result"]).write_text(json.dumps(result, default=str))
        else:
            _follow(spec, config, str(device), ranks)
    finally:
        leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
