"""`decision finetune`: the flow's chain in one command, through the same stage functions over a run folder:
validate and split once, train, calibrate, export. The run folder keeps what the flow's keeps (the fine-tune,
held-out logits, calibration report, expected answers, plots), so the files do not depend on the door.

    decision finetune --data data/processed/vader.jsonl --base data/snapshots/minilm --out models/tuned
    decision finetune ... --family joint        # the joint record head on the same MiniLM encoder
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, TrainConfig
from pipeline.data.leakage import overlap_warning
from pipeline.data.split import TrainSource
from pipeline.families import resolve_training
from pipeline.rundir import RunFolder
from pipeline.scoring.bag_of_words import BAG_OF_WORDS
from pipeline.stages.calibrate import CalibrationResult, calibrate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.train import checked_inputs, train_stage
from pipeline.stages.validate import write_validated
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.fit import TrainRun
from pipeline.training.state_fit import StateFit

SUMMARY_METRICS = ("accuracy", "record_accuracy", "ece", "brier", "loss")


@dataclass(frozen=True)
class FinetuneResult:
    """The chain's summary: the training run, the calibration, where the export and the run folder are."""

    family: str
    method: str
    rows: int
    decisions: int
    skipped: dict[str, int]
    heldout: dict[str, Any]
    """Base, fine-tune and calibrated figures on the held-out decisions."""
    export_dir: str | None
    """None when cancelled: a cancel during training or calibration exports nothing."""
    run_dir: str
    cancelled: bool
    steps: int
    train_seconds: float
    s_per_step: float
    decisions_per_second: float
    peak_memory_mb: float | None
    precision: str
    budget: str
    temperatures: dict[str, float] = field(default_factory=dict)
    temperature_notes: dict[str, str] = field(default_factory=dict)
    calibrator: str | None = None
    calibrator_nll: float | None = None
    calibrator_fitted_on: str | None = None
    """The validation split the calibrator was fitted on (or, without one, the held-out rows, cross-fitted)."""
    temperature_intervals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each type's temperature with its 95% bootstrap interval over what it was fitted on."""
    compile: dict[str, Any] = field(default_factory=dict)
    losses: list[tuple[int, float]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    """What the calibrate stage found worth a look (`CalibrationResult.notices`)."""
    pins: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    states: StateFit | None = None
    """How the states fit the model's window (`TrainRun.states`)."""
    early_stopping: dict[str, Any] = field(default_factory=dict)
    """With `train.early_stopping`: the validation checks, the best step and where training ended."""
    choice: dict[str, Any] = field(default_factory=dict)
    """With candidates (`train.lexicon: auto`): each one's validation figures and the one kept (`TrainRun.choice`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_run_dir(out: str | Path) -> Path:
    """Where `finetune` keeps its run folder unless told: beside the export, `<out>.run`."""
    return Path(out).with_name(Path(out).name + ".run")


def finetune(source: TrainSource, base: str | Path, out: str | Path, config: TrainConfig, device: str = "auto",
             hooks: RunHooks = RunHooks(), controls: RunControls = RunControls(),
             run_dir: str | Path | None = None) -> FinetuneResult:  # fmt: skip
    """Validate and split `source` once, then the flow's train, calibrate and export stages over `run_dir`
    (default `<out>.run`, started afresh); the export goes to `out`. A cancel during training or calibration
    exports nothing."""
    if config.nproc > 1:  # a cancel (Ctrl-C) is this process's; the ranks' stage has no cancel to share it
        raise ConfigError(f"train.nproc={config.nproc}: finetune trains in one process; train data-parallel with "
                          "`decision train --nproc N` or the retrain flow (train.nproc in params.yaml)")  # fmt: skip
    _, config = resolve_training(base, config)  # refuse a method the family lacks before validating
    checked = checked_inputs({"data": source.data, "base": base, "eval_data": source.eval_data})
    validated = source.validated(hooks.report)  # a source refused here leaves no run folder behind
    run = RunFolder(run_dir or default_run_dir(out))
    run.root.mkdir(parents=True, exist_ok=True)
    for checkpoint in run.root.glob(f"{run.checkpoint.stem}*{run.checkpoint.suffix}"):  # candidates' too
        checkpoint.unlink()  # a finetune starts afresh: its folder is not keyed by the data
    split = write_validated(validated, run.validation, run.split).split  # as the flow's validate task
    hooks.say(f"run folder {run.root}: {split['train_rows']:,} training rows ({split['train_decisions']:,} decisions), "
              f"{split['validation_rows']:,} for validation ({split['validation_decisions']:,} decisions), "
              f"{split['heldout_rows']:,} held out ({split['heldout_decisions']:,} decisions){_groups(split)}"
              f"{validated.split.kept_together.describe()}")  # fmt: skip
    if warning := overlap_warning(validated.split.eval_overlap_rows, split["heldout_rows"]):
        hooks.say(warning)  # --eval-data rows whose state DATA's training rows hold
    trained = train_stage(run.root, base, config, device, hooks, controls, checked)
    if trained.cancelled or controls.cancelled:
        return _result(trained, None, None, run, cancelled=True)
    calibration = calibrate_stage(run.root, bag_of_words_rows=config.bag_of_words_rows, say=hooks.say)
    if controls.cancelled:
        return _result(trained, calibration, None, run, cancelled=True)
    exported = export_stage(run.root, out, source.data, base, config)
    return _result(trained, calibration, exported.out, run, cancelled=False)


def _result(run: TrainRun, calibration: CalibrationResult | None, export_dir: str | None, folder: RunFolder,
            cancelled: bool) -> FinetuneResult:  # fmt: skip
    # The calibrate stage's figures beside the train stage's.
    later = (
        {k: v for k, v in calibration.heldout.items() if k in ("calibrated", BAG_OF_WORDS)}
        if calibration
        else {}
    )
    heldout = dict(run.heldout) | later
    calibrated = {
        "temperatures": calibration.temperatures, "temperature_notes": calibration.notes,
        "calibrator": calibration.calibrator["kind"], "calibrator_nll": calibration.calibrator["cross_fitted_nll"],
        "calibrator_fitted_on": calibration.calibrator.get("fitted_on"),
        "temperature_intervals": calibration.calibrator.get("temperature_intervals", {}),
    } if calibration else {}  # fmt: skip
    return FinetuneResult(
        family=run.family, method=run.method, rows=run.rows, decisions=run.decisions, skipped=run.skipped,
        heldout={k: summary_metrics(v) if isinstance(v, dict) else v for k, v in heldout.items()},
        export_dir=export_dir, run_dir=str(folder.root), cancelled=cancelled, steps=run.steps,
        train_seconds=run.train_seconds, s_per_step=run.s_per_step, decisions_per_second=run.decisions_per_second,
        peak_memory_mb=run.peak_memory_mb, precision=run.precision, budget=run.budget, compile=run.compile,
        losses=run.losses, warnings=run.warnings, pins=run.pins, inputs=run.inputs, states=run.states,
        early_stopping=run.early_stopping, choice=run.choice, notices=calibration.notices if calibration else [],
        **calibrated,
    )  # fmt: skip


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The figures a summary shows of a metrics dict."""
    return {k: metrics[k] for k in SUMMARY_METRICS if k in metrics}


def _groups(split: dict[str, int]) -> str:
    """`; groups: T training, V validation, H held out` where the rows have groups (each on one side)."""
    if "heldout_groups" not in split:
        return ""
    return (f"; groups: {split['train_groups']:,} training, {split['validation_groups']:,} validation, "
            f"{split['heldout_groups']:,} held out")  # fmt: skip
