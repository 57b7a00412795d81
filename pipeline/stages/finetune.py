"""`decision finetune`: the whole chain for any family: pins, validation, slice, split, training, calibration,
merged export, one JSON-ready summary.

    decision finetune --data data/processed/vader.jsonl --base data/snapshots/minilm --out models/tuned
    decision finetune ... --family joint        # the joint record head on the same MiniLM encoder
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, TrainConfig, ValidateConfig
from pipeline.data.read import RowSlice
from pipeline.device import peak_memory_mb
from pipeline.lineage import export_manifest
from pipeline.scoring.calibrators import choose_calibrator
from pipeline.scoring.metrics import detailed_metrics
from pipeline.training.fit import fit_on_data
from pipeline.training.loop import CancelToken

SUMMARY_METRICS = ("accuracy", "record_accuracy", "ece", "brier", "loss")


def finetune(data: str | Path, base: str | Path, out: str | Path, config: TrainConfig,
             split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
             device: str = "auto", cancel: CancelToken | None = None, progress: bool = True,
             eval_data: str | Path | None = None, soft_calibration: bool = False,
             report=None, on_eval=None) -> dict[str, Any]:  # fmt: skip
    """validate, slice, split, train, calibrate, export. A cancel during training or calibration exports nothing.

    `report` gets a line at each long step (the budget and why, scoring, training progress); `on_eval(step,
    metrics)` the held-out figures before, during (a third and two thirds of the way) and after training."""
    if config.nproc > 1:
        raise ConfigError(f"train.nproc={config.nproc}: finetune trains in one process; train data-parallel with "
                          "`decision train --nproc N` or the retrain flow (train.nproc in params.yaml)")  # fmt: skip
    trained = fit_on_data(data, base, config, split_config, row_slice, device, cancel, progress, eval_data,
                          report=report, on_eval=on_eval)  # fmt: skip
    run, decisions = trained.run, trained.heldout
    choice = choose_calibrator(decisions, trained.tuned_logits, soft_calibration)
    calibrator = choice.calibrator
    heldout = dict(run.heldout, calibrated=detailed_metrics(decisions, choice.cross_fitted))
    cancelled = run.cancelled or (cancel is not None and cancel.cancelled)
    export_dir = None
    if not cancelled:
        manifest = export_manifest(
            data, base, config, run.family, run.to_dict(), calibrator.temperatures, heldout
        )
        export_dir = trained.family.export(trained.loaded, out, calibrator, manifest).out
    return {
        "family": run.family, "method": run.method, "rows": run.rows, "decisions": run.decisions,
        "skipped": run.skipped, "heldout": {k: summary_metrics(v) if isinstance(v, dict) else v for k, v in heldout.items()},
        "temperatures": calibrator.by_name(), "temperature_notes": calibrator.notes, "calibrator": calibrator.kind,
        "calibrator_nll": choice.nll, "export_dir": export_dir,
        "cancelled": cancelled, "train_seconds": run.train_seconds, "s_per_step": run.s_per_step, "steps": run.steps,
        "decisions_per_second": run.decisions_per_second, "peak_memory_mb": peak_memory_mb(),
        "precision": run.precision, "compile": run.compile, "losses": run.losses, "warnings": run.warnings,
        "budget": run.budget, "pins": run.pins, "inputs": run.inputs,
    }  # fmt: skip


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The figures a summary shows of a metrics dict."""
    return {k: metrics[k] for k in SUMMARY_METRICS if k in metrics}
