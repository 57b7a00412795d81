"""The training stage end to end: pins, validation, split, items, base metrics, training, tuned metrics, save.

decision train --data data/processed/vader.jsonl --base data/snapshots/minilm --out runs/lora --max-steps 40
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from pipeline.adapters import ADAPTER_FILE, save_adapter
from pipeline.config import ValidateConfig
from pipeline.forward import score_items
from pipeline.items import Item, build_items
from pipeline.metrics import heldout_metrics
from pipeline.model import LoadedModel, load_model, save_model
from pipeline.pins import pinned_outputs, verify_pins
from pipeline.read import RowSlice
from pipeline.split import Split, split_holdout
from pipeline.train import CancelToken, TrainConfig, prepare_model, train
from pipeline.validate import validate_file


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


def train_on_data(data: str | Path, base: str | Path, out: str | Path | None, config: TrainConfig,
                  split_config: ValidateConfig = ValidateConfig(), row_slice: RowSlice = RowSlice(),
                  device: str = "auto", cancel: CancelToken | None = None, save_on_cancel: bool = False,
                  progress: bool = True, eval_data: str | Path | None = None) -> TrainRun:  # fmt: skip
    """Train a fine-tune of `base` on `data` and save it to `out` (adapters plus head, or full weights).

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
    base_metrics = _evaluate(loaded, heldout_items, dev, config, progress)
    prepare_model(loaded.model, config)
    result = train(
        loaded.model, train_items, loaded.tokenizer.pad_token_id, config, dev, cancel, progress=progress
    )
    tuned_metrics = _evaluate(loaded, heldout_items, dev, config, progress)
    saved = None
    if out is not None and (not result.cancelled or save_on_cancel):
        saved = str(save_finetune(loaded, Path(out), base, config, pins, result.steps))
    return TrainRun(
        rows=validated.report.rows, decisions=validated.report.decisions, skipped=skipped,
        train_decisions=len(train_items),
        heldout={"decisions": len(heldout_items), "base": base_metrics, "tuned": tuned_metrics},
        steps=result.steps, planned_steps=result.planned_steps, cancelled=result.cancelled,
        train_seconds=result.train_seconds, s_per_step=result.s_per_step,
        decisions_per_second=result.decisions_per_second, saved_to=saved, compile=result.compile,
        precision=result.precision, pins=pins, losses=result.losses,
    )  # fmt: skip


def _evaluate(loaded: LoadedModel, items: list[Item], device: torch.device, config: TrainConfig,
              progress: bool) -> dict[str, float]:  # fmt: skip
    probabilities = score_items(loaded.model, items, loaded.tokenizer.pad_token_id, device,
                                config.eval_batch_size, progress=progress)  # fmt: skip
    return heldout_metrics(items, probabilities)


def _merge_counts(*counts: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for count in counts:
        for reason, n in count.items():
            merged[reason] = merged.get(reason, 0) + n
    return merged


def save_finetune(loaded: LoadedModel, out: Path, base: str | Path, config: TrainConfig, pins: dict[str, str],
                  steps: int) -> Path:  # fmt: skip
    """LoRA: adapters plus head (see pipeline.adapters); full: a complete Laya-layout model."""
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
