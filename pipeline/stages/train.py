"""The train stage: fit a fine-tune of a base on decision rows validated and split once, and save it (any
family).

decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora --max-steps 40
decision train ... --nproc 2     # data-parallel under torchrun: 2 ranks, each on its share of every window
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, TrainConfig
from pipeline.data.pins import CheckedInputs, check_pins
from pipeline.data.split import SplitData, TrainSource
from pipeline.device import peak_memory_mb
from pipeline.families import resolve_training
from pipeline.lineage import MAPPING_OPTIONS, options_of, source_digest
from pipeline.rundir import RunFolder
from pipeline.scoring.decisions import with_groups
from pipeline.scoring.heldout import HeldOut, save_heldout
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.fit import Trained, TrainRun, fit, training_description
from pipeline.training.launch import launch_ranks

RANKS_MODULE = "pipeline.stages.train_ranks"
"""What torchrun runs on each rank when `train.nproc` > 1 (named, not imported: it imports this module)."""


def save_trained(
    trained: Trained,
    out: Path,
    data: str | Path,
    base: str | Path,
    options: dict[str, list[str]] | None = None,
) -> Path:
    """The fine-tune as its family keeps it, with what it was trained on and how, and with `options` (a mapped
    table's, `lineage.options_of`) what `decision export` puts in the manifest for `decision predict`."""
    run, config = trained.run, trained.config
    digest = source_digest(data, base, config, run.pins, run.steps, run.losses)
    training = training_description(config, base, run, digest) | (
        {MAPPING_OPTIONS: options} if options else {}
    )
    return trained.family.save_finetune(trained.loaded, out, training)


def train_on_data(
    source: TrainSource,
    base: str | Path,
    out: str | Path | None,
    config: TrainConfig,
    device: str = "auto",
    hooks: RunHooks = RunHooks(),
    controls: RunControls = RunControls(),
) -> TrainRun:
    """`decision train`: validate and split `source`, train a fine-tune of `base` and save it to `out`
    (nothing when cancelled, unless `controls.save_on_cancel`). With `train.nproc` > 1 the ranks train under
    torchrun (a signal stops them all; nothing is saved then)."""
    checked = check_pins({"data": source.data, "base": base, "eval_data": source.eval_data})
    resolve_training(base, config)  # refuse a base no family starts from before the data is read
    data = source.validated(hooks.report)
    if config.nproc > 1 and controls.ranks is None:
        if controls.save_on_cancel:
            raise ConfigError("--save-on-cancel: not with train.nproc > 1 (a signal stops every rank)")
        return train_on_ranks(data, base, out, config, device, hooks, controls, checked)
    return fit_and_save(data, base, out, config, device, hooks, controls, checked)


def fit_and_save(
    data: SplitData,
    base: str | Path,
    out: str | Path | None,
    config: TrainConfig,
    device: str,
    hooks: RunHooks,
    controls: RunControls,
    checked: CheckedInputs,
) -> TrainRun:
    """Train on `data` and save the fine-tune to `out` unless cancelled (or asked to save anyway); the run
    records the `checked` pins and inputs (`pins.check_pins`)."""
    trained = _recorded(fit(data, base, config, device, hooks, controls), checked)
    if out is None or (trained.run.cancelled and not controls.save_on_cancel):
        return trained.run
    saved = save_trained(trained, Path(out), data.report.source, base, options_of(data.report.labels))
    return replace(trained.run, saved_to=str(saved))


def train_on_ranks(
    data: SplitData,
    base: str | Path,
    out: str | Path | None,
    config: TrainConfig,
    device: str = "auto",
    hooks: RunHooks = RunHooks(),
    controls: RunControls = RunControls(),
    checked: CheckedInputs = CheckedInputs(),
    nproc: int | None = None,
) -> TrainRun:
    """`fit_and_save` on `nproc` (default `train.nproc`) torchrun ranks; `nproc=1` measures the launcher. Rank
    0's progress lines come back to `hooks.report` (none are written without one)."""
    with tempfile.TemporaryDirectory(prefix="decision-ranks-") as folder:
        split = data.save(Path(folder) / "split.pkl")
        arguments = {
            "base": str(base),
            "out": out and str(out),
            "progress": controls.progress,
            "report": hooks.report is not None,
            "checked": checked.to_dict(),
        }
        described = _run_ranks(
            "fit_and_save", Path(folder), split, arguments, config, device, hooks, nproc or config.nproc
        )
    return TrainRun.from_dict(described)


def train_stage(
    run_dir: str | Path,
    base: str | Path,
    config: TrainConfig,
    device: str = "auto",
    hooks: RunHooks = RunHooks(),
    controls: RunControls = RunControls(),
    checked: CheckedInputs = CheckedInputs(),
) -> TrainRun:
    """The train stage: on the run folder's split (`RunFolder.split`, from the validate stage), the fine-tune,
    the held-out logits and a summary, into the run folder.

    `finetune/` holds the fine-tune, `heldout.npz` the held-out decisions with base and tuned logits,
    `validation.npz` the validation split's decisions with tuned logits (what calibration fits on),
    `out_of_fold.npz` (where the validation split is small) the training rows answered out of fold,
    `train.json` the run with its logged steps (loss, lr, s/step) and held-out checkpoints. `checkpoint.pt`
    holds the training state (every `train.checkpoint_every_steps` steps or `train.checkpoint_every_minutes`
    minutes): a run killed mid-training resumes from it, and `train.json` says from which step
    (`resumed_from_step`). A resumed run's held-out checkpoints are those scored after the resume (the earlier
    ones were sent to `hooks.on_eval` before the kill). `checked` holds the `pins` and `inputs` the caller
    checked (the flow's pin task), recorded on the run.

    With `train.nproc` > 1 the stage runs on that many ranks under torchrun (`stages.train_ranks`): rank 0
    scores, checkpoints and writes all of the above, its lines and events come back to `hooks` here, and every
    rank knows `hooks.mlflow_run_id` as `MLFLOW_RUN_ID`. `controls.ranks` is given only on a rank.
    """
    run_folder = RunFolder(run_dir)
    if config.nproc > 1 and controls.ranks is None:
        arguments = {"base": str(base), "run_dir": str(run_dir), "checked": checked.to_dict()}
        described = _run_ranks(
            "train_stage", run_folder.ranks, run_folder.split, arguments, config, device, hooks
        )
        # Rank 0 wrote to the run through MLFLOW_RUN_ID; the run it reports back is this process's to name.
        return replace(TrainRun.from_dict(described), mlflow_run_id=hooks.mlflow_run_id)
    checkpoints: list[dict[str, float]] = []

    def evaluated(step: int, metrics: dict[str, float]) -> None:
        checkpoints.append({"step": step, **metrics})
        hooks.evaluated(step, metrics)

    data = SplitData.load(run_folder.split)
    controls = replace(controls, checkpoints=Checkpointer(run_folder.checkpoint, config))
    trained = _recorded(fit(data, base, config, device, replace(hooks, on_eval=evaluated), controls), checked)
    saved = save_trained(trained, run_folder.finetune, run_folder.split, base, options_of(data.report.labels))
    run = replace(
        trained.run,
        saved_to=str(saved),
        heldout_checkpoints=checkpoints,
        peak_memory_mb=peak_memory_mb(),
        mlflow_run_id=hooks.mlflow_run_id,
    )
    # Saved with their rows' groups: the calibrate stage cross-fits and bootstraps by group without the split.
    heldout = with_groups(trained.heldout, [record.group for record in data.split.heldout])
    save_heldout(
        run_folder.heldout, HeldOut(heldout, trained.base_logits, trained.tuned_logits, trained.options)
    )
    run_folder.validation_logits.unlink(missing_ok=True)
    if trained.validation:
        validation = with_groups(trained.validation, [record.group for record in data.split.validation])
        save_heldout(
            run_folder.validation_logits,
            HeldOut(validation, None, trained.validation_logits, trained.options),
        )
    run_folder.out_of_fold.unlink(missing_ok=True)
    if trained.out_of_fold.decisions:
        answered = with_groups(trained.out_of_fold.decisions, [record.group for record in data.split.train])
        save_heldout(
            run_folder.out_of_fold, HeldOut(answered, None, trained.out_of_fold.logits, trained.options)
        )
    run_folder.train_summary.write_text(json.dumps(run.to_dict(), indent=2, default=str))
    return run


def _recorded(trained: Trained, checked: CheckedInputs) -> Trained:
    """The fit with the caller's checked `pins` and `inputs` on its run, before anything is saved (the
    fine-tune's source digest reads the pins)."""
    return replace(trained, run=replace(trained.run, pins=checked.pins, inputs=checked.inputs))


def _run_ranks(
    job: str,
    folder: Path,
    split: Path,
    arguments: dict[str, Any],
    config: TrainConfig,
    device: str,
    hooks: RunHooks = RunHooks(),
    nproc: int | None = None,
) -> dict[str, Any]:
    """Write the ranks' spec into `folder`, run `job` on `nproc` (default `train.nproc`) ranks over the saved
    `split`, and return rank 0's result."""
    folder.mkdir(parents=True, exist_ok=True)
    spec, result = folder / "spec.json", folder / "result.json"
    result.unlink(missing_ok=True)
    spec.write_text(
        json.dumps(
            {
                "job": job,
                "split": str(split),
                "arguments": arguments,
                "config": asdict(config),
                "device": device,
                "result": str(result),
            },
            indent=2,
        )
    )
    launch_ranks(RANKS_MODULE, spec, nproc or config.nproc, hooks, config.threads)
    return json.loads(result.read_text())
