"""One rank of a data-parallel train stage, as torchrun starts it when `train.nproc` > 1 (not run by hand).

Rank 0 runs the stage itself (`train_stage` or `train_on_data`: scoring, checkpoints, the saved fine-tune,
the summary) and sends its progress lines and events to the launching process (`training.launch`); the other
ranks prepare the same examples and train on their share of every window (`fit.follow_fit`). The spec file
holds the stage's arguments and configs, written by `stages.train`.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m pipeline.stages.train_ranks SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from pipeline.config import TrainConfig, ValidateConfig
from pipeline.data.read import RowSlice
from pipeline.device import pick_device
from pipeline.rundir import RunFolder
from pipeline.stages.train import train_on_data, train_stage
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.fit import follow_fit
from pipeline.training.launch import emit_event
from pipeline.training.ranks import Ranks, join_ranks, leave_ranks, rank_device


def _report(line: str) -> None:
    print(line, flush=True)


def _lead_train_stage(spec: dict[str, Any], config: TrainConfig, split: ValidateConfig, device: str,
                      ranks: Ranks) -> dict[str, Any]:  # fmt: skip
    arguments = spec["arguments"]
    return train_stage(arguments["data"], arguments["base"], arguments["run_dir"], config, split, device,
                       progress=False, report=_report, on_log=lambda entry: emit_event("log", entry=entry),
                       on_eval=lambda step, metrics: emit_event("eval", step=step, metrics=metrics),
                       inputs=arguments["inputs"], ranks=ranks)  # fmt: skip


def _lead_train_on_data(spec: dict[str, Any], config: TrainConfig, split: ValidateConfig, device: str,
                        ranks: Ranks) -> dict[str, Any]:  # fmt: skip
    arguments = spec["arguments"]
    run = train_on_data(arguments["data"], arguments["base"], arguments["out"], config, split,
                        RowSlice(**arguments["row_slice"]), device, progress=arguments["progress"],
                        report=_report if arguments.get("report") else None, eval_data=arguments["eval_data"],
                        ranks=ranks)  # fmt: skip
    return run.to_dict()


LEADS = {"train_stage": _lead_train_stage, "train_on_data": _lead_train_on_data}
"""What rank 0 runs, by the spec's `job`."""


def _follow(
    spec: dict[str, Any], config: TrainConfig, split: ValidateConfig, device: str, ranks: Ranks
) -> None:
    arguments = spec["arguments"]
    row_slice = RowSlice(**arguments.get("row_slice", {}))
    run_dir = arguments.get("run_dir")  # the stage's run folder: resume from rank 0's checkpoint, as it does
    checkpoints = Checkpointer(RunFolder(run_dir).checkpoint, config) if run_dir else None
    follow_fit(arguments["data"], arguments["base"], config, split, row_slice, device,
               arguments.get("eval_data"), ranks, checkpoints)  # fmt: skip


@record  # torchrun then reports this rank's traceback as the root cause of a failure
def main(argv: list[str] | None = None) -> int:
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    config, split = TrainConfig(**spec["config"]), ValidateConfig(**spec["split_config"])
    device = rank_device(pick_device(spec["device"]))
    ranks = join_ranks(device, config.dist_timeout_minutes)
    try:
        if ranks.is_main:
            result = LEADS[spec["job"]](spec, config, split, str(device), ranks)
            Path(spec["result"]).write_text(json.dumps(result, default=str))
        else:
            _follow(spec, config, split, str(device), ranks)
    finally:
        leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
