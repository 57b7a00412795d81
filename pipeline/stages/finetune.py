"""The training stage end to end: pins, validation, split, items, base metrics, training, tuned metrics, save.

decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora --max-steps 40
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.families.laya.adapters import ADAPTER_FILE, save_adapter
from pipeline.scoring.calibration import softmax
from pipeline.config import ValidateConfig
from pipeline.families.laya.forward import score_items
from pipeline.families.laya.items import Item, build_items
from pipeline.scoring.metrics import heldout_metrics
from pipeline.families.laya.layout import LoadedModel, load_model, save_model
from pipeline.data.pins import pinned_outputs, verify_pins
from pipeline.data.read import RowSlice
from pipeline.data.split import Split, split_holdout
from pipeline.training.loop import CancelToken, TrainConfig, prepare_model, train
from pipeline.data.validate import validate_file


@dataclass
class TrainRun:
    """The outcome of `train_on_data`: counts, metrics before and after, timings, where it was saved."""

    rows: int
    decisions: int
    skipped: dict[str, int]
    train_decisions: int
    heldout: dict[str, Any]
    steps: int
    planned_steps: int
    cancelled: bool
    train_seconds: float
    s_per_step: float
    decisions_per_second: float
    saved_to: str | None
    compile: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    pins: dict[str, str] = field(default_factory=dict)
    losses: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_inputs(paths: list[str | Path], lock_path: str | Path = "dvc.lock") -> dict[str, str]:
    """Verify every input that dvc.lock pins (refusing on a mismatch); unpinned inputs pass through unchecked."""
    lock = Path(lock_path)
    if not lock.is_file():
        return {}
    pinned = pinned_outputs(lock)
    root = lock.resolve().parent
    relative = []
    for path in paths:
        try:
            rel = Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if rel in pinned:
            relative.append(rel)
    return verify_pins(relative, root=root) if relative else {}


def pick_device(name: str = "auto") -> torch.device:
    """cuda when available for "auto", else cpu; an explicit name is taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class Trained:
    """A trained model in memory with its held-out items and their raw logits before and after training."""

    run: TrainRun
    loaded: LoadedModel
    heldout_items: list[Item]
    base_logits: list[np.ndarray]
    tuned_logits: list[np.ndarray]
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option names per held-out question id


def fit_on_data(data: str | Path, base: str | Path, config: TrainConfig,
                split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                device: str = "auto", cancel: CancelToken | None = None, progress: bool = True,
                eval_data: str | Path | None = None, on_log=None) -> Trained:  # fmt: skip
    """Verify pins, validate, split, score the base, train, score again; nothing is written.

    The held-out decisions are split off `data` by content hash, or are all of `eval_data` when it is given.
    """
    pins = verify_inputs([data, base] + ([eval_data] if eval_data else []))
    validated = validate_file(data, row_slice)
    if eval_data is None:
        split = split_holdout(validated.records, split_config)
    else:
        split = Split(validated.records, validate_file(eval_data).records)
    loaded = load_model(base)
    train_items, skipped_train = build_items(split.train, loaded)
    heldout_items, skipped_heldout = build_items(split.heldout, loaded)
    skipped = _merge_counts(validated.report.skipped, skipped_train, skipped_heldout)
    dev = pick_device(device)
    loaded.model.to(dev)
    base_logits = _logits(loaded, heldout_items, dev, config, progress)
    prepare_model(loaded.model, config)
    result = train(loaded.model, train_items, loaded.tokenizer.pad_token_id, config, dev, cancel, on_log,
                   progress=progress)  # fmt: skip
    tuned_logits = _logits(loaded, heldout_items, dev, config, progress)
    run = TrainRun(
        rows=validated.report.rows, decisions=validated.report.decisions, skipped=skipped,
        train_decisions=len(train_items),
        heldout={"decisions": len(heldout_items), "base": _metrics(heldout_items, base_logits),
                 "tuned": _metrics(heldout_items, tuned_logits)},
        steps=result.steps, planned_steps=result.planned_steps, cancelled=result.cancelled,
        train_seconds=result.train_seconds, s_per_step=result.s_per_step,
        decisions_per_second=result.decisions_per_second, saved_to=None, compile=result.compile,
        precision=result.precision, pins=pins, losses=result.losses,
    )  # fmt: skip
    options = {d.question.id: d.question.options for r in split.heldout for d in r.decisions}
    return Trained(run, loaded, heldout_items, base_logits, tuned_logits, options)


def train_on_data(data: str | Path, base: str | Path, out: str | Path | None, config: TrainConfig,
                  split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                  device: str = "auto", cancel: CancelToken | None = None, save_on_cancel: bool = False,
                  progress: bool = True, eval_data: str | Path | None = None) -> TrainRun:  # fmt: skip
    """Train a fine-tune of `base` on `data` and save it to `out` (adapters plus head, or full weights)."""
    trained = fit_on_data(data, base, config, split_config, row_slice, device, cancel, progress, eval_data)
    run = trained.run
    if out is not None and (not run.cancelled or save_on_cancel):
        run.saved_to = str(save_finetune(trained.loaded, Path(out), base, config, run.pins, run.steps))
    return run


def _logits(loaded: LoadedModel, items: list[Item], device: torch.device, config: TrainConfig,
            progress: bool) -> list[np.ndarray]:  # fmt: skip
    return score_items(loaded.model, items, loaded.tokenizer.pad_token_id, device, config.eval_batch_size,
                       progress=progress, logits=True)  # fmt: skip


def _metrics(items: list[Item], logits: list[np.ndarray]) -> dict[str, float]:
    return heldout_metrics(items, [softmax(z) for z in logits])


def _merge_counts(*counts: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for count in counts:
        for reason, n in count.items():
            merged[reason] = merged.get(reason, 0) + n
    return merged


def save_finetune(loaded: LoadedModel, out: Path, base: str | Path, config: TrainConfig, pins: dict[str, str],
                  steps: int) -> Path:  # fmt: skip
    """LoRA: adapters plus head (see pipeline.families.laya.adapters); full: a complete Laya-layout model."""
    training = {"method": config.method, "steps": steps, "config": asdict(config), "pins": pins,
                "base": str(base), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    loaded.model.to("cpu")
    if config.method == "lora":
        return save_adapter(loaded.model, out, {"decision_config": loaded.config, **training})
    full = replace(loaded, config={**loaded.config, "fine_tuned": True, "training": training})
    return save_model(full, out)


def describe_finetune(folder: str | Path) -> dict[str, Any]:
    """What a saved fine-tune folder holds."""
    folder = Path(folder)
    if (folder / ADAPTER_FILE).is_file():
        return json.loads((folder / ADAPTER_FILE).read_text())
    return json.loads((folder / "rl_agent_config.json").read_text())["training"]


def finetune(data: str | Path, base: str | Path, out: str | Path, config: TrainConfig,
             split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
             device: str = "auto", cancel: CancelToken | None = None, progress: bool = True,
             eval_data: str | Path | None = None, soft_calibration: bool = False) -> dict[str, Any]:  # fmt: skip
    """validate, slice, split, train, calibrate, export: the whole chain, one JSON-ready summary.

    A cancel during training or calibration exports nothing.
    """
    from pipeline.scoring.calibration import cross_fitted_metrics, fit_calibration
    from pipeline.families.joint.layout import is_causal_lm_folder, is_decoder_folder
    from pipeline.families.laya.export import export_model

    if is_causal_lm_folder(base) or is_decoder_folder(base):  # the decoder family: its own chain
        from pipeline.families.joint.training import decoder_finetune

        return decoder_finetune(
            data, base, out, config, split_config, row_slice, device, cancel, progress, eval_data
        )
    trained = fit_on_data(data, base, config, split_config, row_slice, device, cancel, progress, eval_data)
    run, items = trained.run, trained.heldout_items
    calibration = fit_calibration(items, trained.tuned_logits, soft_calibration)
    heldout = dict(
        run.heldout, calibrated=cross_fitted_metrics(items, trained.tuned_logits, soft_calibration)
    )
    cancelled = run.cancelled or (cancel is not None and cancel.cancelled)
    export_dir = None
    if not cancelled:
        manifest = lineage(data, base, config, run, calibration.temperatures, heldout)
        export_dir = export_model(trained.loaded, out, calibration.temperatures, manifest).out
    return {
        "rows": run.rows, "decisions": run.decisions, "skipped": run.skipped,
        "heldout": {k: _summary(v) if isinstance(v, dict) else v for k, v in heldout.items()},
        "temperatures": dict(zip(("choice", "score", "noul"), calibration.temperatures)),
        "temperature_notes": calibration.notes, "export_dir": export_dir, "cancelled": cancelled,
        "train_seconds": run.train_seconds, "s_per_step": run.s_per_step, "steps": run.steps,
        "decisions_per_second": run.decisions_per_second,
        "peak_memory_mb": peak_memory_mb(), "precision": run.precision, "compile": run.compile,
    }  # fmt: skip


def _summary(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in ("accuracy", "record_accuracy", "ece", "loss") if k in metrics}


def peak_memory_mb() -> float:
    """Peak resident memory of this process (or of the GPU when it used more), in MiB."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = max(peak, torch.cuda.max_memory_allocated() / 2**20)
    return round(peak, 1)


def lineage(data, base, config: TrainConfig, run: TrainRun, temperatures, heldout) -> dict[str, Any]:
    """What an export came from: data and base hashes, git commit, params, metrics."""
    from pipeline.data.pins import current_md5

    return {
        "data": str(data), "data_md5": current_md5(Path(data)), "base": str(base),
        "base_md5": current_md5(Path(base)), "pins": run.pins, "git_commit": _git_commit(),
        "params": {"train": asdict(config)}, "steps": run.steps, "temperatures": list(temperatures),
        "metrics": {k: v for k, v in heldout.items() if isinstance(v, dict)},
        "source_digest": _source_digest(data, base, config, run),
    }  # fmt: skip


def _git_commit() -> str | None:
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _source_digest(data, base, config: TrainConfig, run: TrainRun) -> str:
    import hashlib

    parts = json.dumps([str(data), str(base), asdict(config), run.pins, run.steps, run.losses], default=str)
    return hashlib.sha256(parts.encode()).hexdigest()


TRAIN_SUMMARY, FINETUNE_DIR, HELDOUT_FILE = "train.json", "finetune", "heldout.npz"


def train_stage(data: str | Path, base: str | Path, run_dir: str | Path, config: TrainConfig,
                split_config: ValidateConfig = ValidateConfig(), device: str = "auto",
                progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """The flow's train stage: train and write the fine-tune, the held-out logits and a summary to `run_dir`.

    `run_dir/finetune` holds the fine-tune, `run_dir/heldout.npz` the held-out decisions with base and tuned
    logits (what calibration needs), `run_dir/train.json` the run with its logged steps (loss, lr, s/step).
    """
    from pipeline.scoring.heldout import HeldOut, save_heldout

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, float]] = []
    trained = fit_on_data(
        data, base, config, split_config, device=device, progress=progress, on_log=steps.append
    )
    run = trained.run
    run.saved_to = str(
        save_finetune(trained.loaded, run_dir / FINETUNE_DIR, base, config, run.pins, run.steps)
    )
    save_heldout(run_dir / HELDOUT_FILE,
                 HeldOut(trained.heldout_items, trained.base_logits, trained.tuned_logits, trained.options))  # fmt: skip
    summary = run.to_dict() | {"logged_steps": steps, "peak_memory_mb": peak_memory_mb()}
    (run_dir / TRAIN_SUMMARY).write_text(json.dumps(summary, indent=2, default=str))
    return summary
