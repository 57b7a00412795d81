"""One rank of the GPU check's data-parallel row, as `pipeline.training.launch.launch_ranks` starts it under
torchrun (not run by hand): the row's LoRA run on this rank's share of every window, after one all-reduce of
ones through the process group's backend (NCCL on CUDA, gloo on the CPU). Rank 0 writes what it saw as JSON.

    python -m torch.distributed.run --standalone --nproc-per-node 1 -m scripts.gpu_check_ranks SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scripts.gpu_check_absent import hide_absent


def main(argv: list[str] | None = None) -> int:
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    hide_absent()  # what the launching process hid (GPU_CHECK_HIDDEN); the project is imported only after this
    import torch
    import torch.distributed as dist

    from pipeline.config import TrainConfig
    from pipeline.families import pick_family
    from pipeline.training.controls import RunControls
    from pipeline.training.loop import train
    from pipeline.training.ranks import join_ranks, leave_ranks, rank_device
    from tests.tiny import synthetic_records, without_dropout

    config = TrainConfig(**spec["config"])
    device = rank_device(torch.device(spec["device"]))
    ranks = join_ranks(device, config.dist_timeout_minutes)
    try:
        ones = torch.ones(1, device=device)
        dist.all_reduce(ones)
        family = pick_family(spec["base"], config.family)
        loaded = family.load(spec["base"], config, device)
        examples, _ = family.build_examples(loaded, synthetic_records(spec["rows"], 0, spec["state_chars"]))
        torch.manual_seed(config.seed)
        family.prepare(loaded, config)
        family.learn_from_rows(loaded, examples)
        without_dropout(loaded.model)  # as the run in the launching process
        ready = family.training_examples(loaded, examples, config, device)
        result = train(
            loaded.model,
            ready,
            config,
            device,
            family.batch_task(loaded, config),
            controls=RunControls(ranks=ranks),
        )
        if ranks.is_main:
            Path(spec["out"]).write_text(
                json.dumps(
                    {
                        "backend": dist.get_backend(),
                        "world_size": ranks.world,
                        "all_reduce": ones.item() / ranks.world,
                        "steps": result.steps,
                        "s_per_step": result.s_per_step,
                        "losses": [loss for _, loss in result.losses],
                        "allreduce_seconds": result.allreduce_seconds,
                        "compile": result.compile,
                    }
                )
            )
    finally:
        leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
