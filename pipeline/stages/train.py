"""The train stage: fit a fine-tune of a base on decision rows and save it (any family).

decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora --max-steps 40
decision train ... --nproc 2     # data-parallel under torchrun: 2 ranks, each on its share of every window
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, TrainConfig, ValidateConfig
from pipeline.data.read import RowSlice
from pipeline.device import peak_memory_mb
from pipeline.lineage import source_digest
from pipeline.rundir import RunFolder
from pipeline.scoring.heldout import HeldOut, save_heldout
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.fit import Trained, TrainRun, fit_on_data, training_description
from pipeline.training.launch import launch_ranks
from pipeline.training.loop import CancelToken
from pipeline.training.ranks import Ranks

RANKS_MODULE = "pipeline.stages.train_ranks"
"""What torchrun runs on each rank when `train.nproc` > 1 (named, not imported: it imports this module)."""


def save_trained(trained: Trained, out: Path, data, base, config: TrainConfig) -> Path:
    """The fine-tune as its family keeps it, with what it was trained on and how."""
    run = trained.run
    digest = source_digest(data, base, config, run.pins, run.steps, run.losses)
    return trained.family.save_finetune(trained.loaded, out, training_description(config, base, run, digest))


def train_on_data(data: str | Path, base: str | Path, out: str | Path | None, config: TrainConfig,
                  split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                  device: str = "auto", cancel: CancelToken | None = None, save_on_cancel: bool = False,
                  progress: bool = True, report: Callable[[str], None] | None = None,
                  eval_data: str | Path | None = None, ranks: Ranks | None = None) -> TrainRun:  # fmt: skip
    """Train a fine-tune of `base` on `data` and save it to `out` (nothing when cancelled, unless asked).

    `progress` shows tqdm bars; `report` gets a line at each long step (scoring, every 10 training steps or 30 s).
    With `train.nproc` > 1 the ranks train under torchrun (a signal stops them all; nothing is saved then)."""
    if config.nproc > 1 and ranks is None:
        if save_on_cancel:
            raise ConfigError("--save-on-cancel: not with train.nproc > 1 (a signal stops every rank)")
        return train_on_ranks(data, base, out, config, split_config, row_slice, device, progress, eval_data,
                              report=report)  # fmt: skip
    trained = fit_on_data(data, base, config, split_config, row_slice, device, cancel, progress, eval_data,
                          report=report, ranks=ranks)  # fmt: skip
    run = trained.run
    if out is not None and (not run.cancelled or save_on_cancel):
        run.saved_to = str(save_trained(trained, Path(out), data, base, config))
    return run


def train_on_ranks(data: str | Path, base: str | Path, out: str | Path | None, config: TrainConfig,
                   split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                   device: str = "auto", progress: bool = True, eval_data: str | Path | None = None,
                   nproc: int | None = None, report: Callable[[str], None] | None = None) -> TrainRun:  # fmt: skip
    """`train_on_data` on `nproc` (default `train.nproc`) torchrun ranks; `nproc=1` measures the launcher. Rank 0's
    progress lines come back to `report` (none are written without one)."""
    arguments = {"data": str(data), "base": str(base), "out": out and str(out), "row_slice": asdict(row_slice),
                 "eval_data": eval_data and str(eval_data), "progress": progress,
                 "report": report is not None}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="decision-ranks-") as folder:
        described = _run_ranks("train_on_data", Path(folder), arguments, config, split_config, device,
                               report=report, nproc=nproc or config.nproc)  # fmt: skip
    return TrainRun(**described)


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
                on_eval=None, inputs: dict[str, dict[str, Any]] | None = None, run_id: str | None = None,
                ranks: Ranks | None = None) -> dict[str, Any]:  # fmt: skip
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

    With `train.nproc` > 1 the stage runs on that many ranks under torchrun (`stages.train_ranks`): rank 0
    scores, checkpoints and writes all of the above, its lines and events come back to `report`, `on_log` and
    `on_eval` here, and every rank knows `run_id` (the MLflow run) as `MLFLOW_RUN_ID`. `ranks` is given only on
    a rank.
    """
    run_folder = RunFolder(run_dir)
    run_folder.root.mkdir(parents=True, exist_ok=True)
    if config.nproc > 1 and ranks is None:
        arguments = {"data": str(data), "base": str(base), "run_dir": str(run_dir), "inputs": inputs}
        return _run_ranks("train_stage", run_folder.ranks, arguments, config, split_config, device, run_id,
                          report, on_log, on_eval)  # fmt: skip
    checkpoints: list[dict[str, float]] = []

    def evaluated(step: int, metrics: dict[str, float]) -> None:
        checkpoints.append({"step": step, **metrics})
        if on_eval:
            on_eval(step, metrics)

    trained = fit_on_data(data, base, config, split_config, device=device, progress=progress, on_log=on_log,
                          report=report, on_eval=evaluated,
                          checkpoints=Checkpointer(run_folder.checkpoint, config), ranks=ranks)  # fmt: skip
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


def _run_ranks(job: str, folder: Path, arguments: dict[str, Any], config: TrainConfig,
               split_config: ValidateConfig, device: str, run_id: str | None = None, report=None, on_log=None,
               on_eval=None, nproc: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Write the ranks' spec into `folder`, run `job` on `nproc` (default `train.nproc`) ranks, and return rank 0's
    result."""
    folder.mkdir(parents=True, exist_ok=True)
    spec, result = folder / "spec.json", folder / "result.json"
    result.unlink(missing_ok=True)
    spec.write_text(json.dumps({"job": job, "arguments": arguments, "config": asdict(config),
                                "split_config": asdict(split_config), "device": device,
                                "result": str(result)}, indent=2))  # fmt: skip
    launch_ranks(RANKS_MODULE, spec, nproc or config.nproc, run_id, report, on_log, on_eval)
    return json.loads(result.read_text())
