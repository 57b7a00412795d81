"""`decision finetune`: the flow's chain in one command, through the same stage functions over a run folder:
validate and split once, train, calibrate, export. The run folder keeps what the flow's keeps (the fine-tune,
held-out logits, calibration report, expected answers, plots), so the files do not depend on the door.

    decision finetune --data data/processed/vader.jsonl --base data/snapshots/minilm --out models/tuned
    decision finetune ... --family joint        # the joint record head on the same MiniLM encoder
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.config import CertifyConfig, ConfigError, QuantizeConfig, TrainConfig
from pipeline.data.leakage import overlap_warning
from pipeline.data.pins import check_pins
from pipeline.data.split import TrainSource
from pipeline.families import resolve_training
from pipeline.rundir import RunFolder
from pipeline.stages.calibrate import calibrate_stage
from pipeline.stages.export import export_stage
from pipeline.stages.quantize import quantize_export, run_rows
from pipeline.stages.result import RunResult
from pipeline.stages.train import train_stage
from pipeline.stages.validate import write_validated
from pipeline.training.controls import RunControls, RunHooks


def default_run_dir(out: str | Path) -> Path:
    """Where `finetune` keeps its run folder unless told: beside the export, `<out>.run`."""
    return Path(out).with_name(Path(out).name + ".run")


def finetune(
    source: TrainSource,
    base: str | Path,
    out: str | Path,
    config: TrainConfig,
    device: str = "auto",
    hooks: RunHooks = RunHooks(),
    controls: RunControls = RunControls(),
    run_dir: str | Path | None = None,
    certify: CertifyConfig = CertifyConfig(),
    quantize: QuantizeConfig = QuantizeConfig(),
) -> RunResult:
    """Validate and split `source` once, then the flow's train, calibrate and export stages over `run_dir`
    (default `<out>.run`, started afresh); the export goes to `out`. A cancel during training or calibration
    exports nothing (the result says so: `RunResult.cancelled`). `certify` says which answers the export may
    automate (`scoring.certify`); `quantize` whether the export gets an int8 encoder with its report
    (`stages.quantize`)."""
    if config.nproc > 1:  # a cancel (Ctrl-C) is this process's; the ranks' stage has no cancel to share it
        raise ConfigError(
            f"train.nproc={config.nproc}: finetune trains in one process; train data-parallel with "
            "`decision train --nproc N` or the retrain flow (train.nproc in params.yaml)"
        )
    _, config = resolve_training(base, config)  # refuse a method the family lacks before validating
    checked = check_pins({"data": source.data, "base": base, "eval_data": source.eval_data})
    validated = source.validated(hooks.report)  # a source refused here leaves no run folder behind
    certify.unasked(validated.question_ids())  # refused before the training, not after
    run = RunFolder(run_dir or default_run_dir(out))
    run.root.mkdir(parents=True, exist_ok=True)
    for checkpoint in run.root.glob(f"{run.checkpoint.stem}*{run.checkpoint.suffix}"):  # candidates' too
        checkpoint.unlink()  # a finetune starts afresh: its folder is not keyed by the data
    validation = write_validated(validated, run.validation, run.split)  # as the flow's validate task
    hooks.say(
        f"run folder {run.root}: {describe_split(validation.split)}{validated.split.kept_together.describe()}"
    )
    if warning := overlap_warning(validated.split.eval_overlap_rows, validation.split["heldout_rows"]):
        hooks.say(warning)  # --eval-data rows whose state DATA's training rows hold
    trained = train_stage(run.root, base, config, device, hooks, controls, checked)
    result = RunResult(run_dir=str(run.root), validation=validation, train=trained)
    if trained.cancelled or controls.cancelled:
        return result
    calibration = calibrate_stage(
        run.root, bag_of_words_rows=config.bag_of_words_rows, say=hooks.say, certify_config=certify
    )
    if controls.cancelled:
        return result
    exported = export_stage(run.root, out, source.data, base, config)
    quantize_export(exported.out, run_rows(run.root), quantize, certify, say=hooks.say)
    return replace(result, calibration=calibration, export_dir=exported.out).saved(run.result)


def describe_split(split: dict[str, int]) -> str:
    """The split's rows and decisions on each side, in one line (groups too, where the rows have them)."""
    line = (
        f"{split['train_rows']:,} training rows ({split['train_decisions']:,} decisions), "
        f"{split['validation_rows']:,} for validation ({split['validation_decisions']:,} decisions), "
        f"{split['heldout_rows']:,} held out ({split['heldout_decisions']:,} decisions)"
    )
    if "heldout_groups" not in split:
        return line
    return (
        f"{line}; groups: {split['train_groups']:,} training, {split['validation_groups']:,} validation, "
        f"{split['heldout_groups']:,} held out"
    )
