"""The train stage: fit a fine-tune of a base on decision rows and save it (any family).

decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora --max-steps 40
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.config import TrainConfig, ValidateConfig
from pipeline.data.read import RowSlice
from pipeline.device import peak_memory_mb
from pipeline.lineage import source_digest
from pipeline.rundir import RunFolder
from pipeline.scoring.heldout import HeldOut, save_heldout
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.fit import Trained, TrainRun, fit_on_data, training_description
from pipeline.training.loop import CancelToken


def save_trained(trained: Trained, out: Path, data, base, config: TrainConfig) -> Path:
    """The fine-tune as its family keeps it, with what it was trained on and how."""
    run = trained.run
    digest = source_digest(data, base, config, run.pins, run.steps, run.losses)
    return trained.family.save_finetune(trained.loaded, out, training_description(config, base, run, digest))


def train_on_data(data: str | Path, base: str | Path, out: str | Path | None, config: TrainConfig,
                  split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                  device: str = "auto", cancel: CancelToken | None = None, save_on_cancel: bool = False,
                  progress: bool = True, eval_data: str | Path | None = None) -> TrainRun:  # fmt: skip
    """Train a fine-tune of `base` on `data` and save it to `out` (nothing when cancelled, unless asked)."""
    trained = fit_on_data(data, base, config, split_config, row_slice, device, cancel, progress, eval_data)
    run = trained.run
    if out is not None and (not run.cancelled or save_on_cancel):
        run.saved_to = str(save_trained(trained, Path(out), data, base, config))
    return run


def describe_finetune(folder: str | Path) -> dict[str, Any]:
    """What a saved fine-tune folder records of its training."""
    folder = Path(folder)
    for name, key in (("decision_adapter.json", None), ("rl_agent_config.json", "training"),
                      ("decision_config.json", "training")):  # fmt: skip
        if (folder / name).is_file():
            described = json.loads((folder / name).read_text())
            return described[key] if key else described
    raise FileNotFoundError(f"{folder}: no fine-tune description")


def train_stage(data: str | Path, base: str | Path, run_dir: str | Path, config: TrainConfig,
                split_config: ValidateConfig = ValidateConfig(), device: str = "auto",
                progress: bool = True, report: Callable[[str], None] | None = None, on_log=None,
                on_eval=None, inputs: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """The flow's train stage: the fine-tune, the held-out logits and a summary, into the run folder.

    `finetune/` holds the fine-tune, `heldout.npz` the held-out decisions with base and tuned logits (what
    calibration needs), `train.json` the run with its logged steps (loss, lr, s/step) and held-out checkpoints.
    `checkpoint.pt` holds the training state (every `train.checkpoint_every_steps` steps or
    `train.checkpoint_every_minutes` minutes): a run killed mid-training resumes from it, and `train.json`
    says from which step (`resumed_from_step`). `report` gets progress lines; `on_log` each logging step and
    `on_eval(step, metrics)` each held-out checkpoint, as they happen (the flow sends them to the live MLflow
    run). A resumed run's held-out checkpoints are those scored after the resume (the earlier ones were sent
    to `on_eval` before the kill). `inputs` replaces the run's own
    pin record: the flow trains on a slice of its data, and what it pinned is the data and base it checked.
    """
    run_folder = RunFolder(run_dir)
    run_folder.root.mkdir(parents=True, exist_ok=True)
    checkpoints: list[dict[str, float]] = []

    def evaluated(step: int, metrics: dict[str, float]) -> None:
        checkpoints.append({"step": step, **metrics})
        if on_eval:
            on_eval(step, metrics)

    trained = fit_on_data(data, base, config, split_config, device=device, progress=progress, on_log=on_log,
                          report=report, on_eval=evaluated,
                          checkpoints=Checkpointer(run_folder.checkpoint, config))  # fmt: skip
    run = trained.run
    run.saved_to = str(save_trained(trained, run_folder.finetune, data, base, config))
    if inputs is not None:
        run.inputs = inputs
    save_heldout(
        run_folder.heldout,
        HeldOut(trained.heldout, trained.base_logits, trained.tuned_logits, trained.options),
    )
    summary = run.to_dict() | {"heldout_checkpoints": checkpoints,
                               "peak_memory_mb": peak_memory_mb()}  # fmt: skip
    run_folder.train_summary.write_text(json.dumps(summary, indent=2, default=str))
    return summary
