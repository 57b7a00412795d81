"""Merged export: a fine-tune becomes one self-describing Laya-layout folder, written crash-safe.

LoRA is merged into a copy on the CPU (the training model keeps its adapters and its device memory does not
grow); every tensor is checked finite, then written in fp16 with the temperatures in `rl_agent_config.json` and
a `manifest.json` with lineage. Files are written into a staging folder beside the target, `rl_agent_config.json`
last, and the staging folder is swapped with the target in one atomic rename (`renameat2` RENAME_EXCHANGE), so a
reader sees the old model or the new one, never a mix; a folder without `rl_agent_config.json` is never loaded.

    decision export --adapter runs/lora --out runs/export
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.families.laya.layout import CONFIG_FILE, LoadedModel

MANIFEST = "manifest.json"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class NonFiniteWeights(ValueError):
    """A tensor to export holds NaN or infinity; nothing is written."""


@dataclass(frozen=True)
class ExportResult:
    """Where the export went and whether anything had to be written."""

    out: str
    written: bool
    manifest: dict[str, Any]


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of `model` with every LoRA adapter merged into its base layer and removed."""
    return merge_lora_layers(cpu_copy(model).float())


def cpu_copy(model: torch.nn.Module, clone=None) -> torch.nn.Module:
    """A deep copy of `model` on the CPU; `clone` (default `_cpu_clone`) makes each tensor's CPU copy."""
    clone = clone or _cpu_clone
    # Copy straight to the CPU: deep-copying the module where it lives would grow the device's memory.
    memo = {id(t): clone(t) for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def merge_lora_layers(merged: torch.nn.Module) -> torch.nn.Module:
    """`merged` (changed in place) with every LoRA layer merged into its base layer and replaced by it."""
    if not any(type(m).__module__.startswith("peft.") for m in merged.modules()):
        return merged  # nothing to merge: spare the peft import (seconds, with bitsandbytes installed)
    from peft.tuners.lora import LoraLayer

    for name, module in list(merged.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(
                merged.get_submodule(parent_name) if parent_name else merged, child, module.get_base_layer()
            )
    return merged


def _cpu_clone(tensor: torch.Tensor) -> torch.Tensor:
    clone = tensor.detach().to("cpu", copy=True)
    return torch.nn.Parameter(clone, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else clone


def check_finite(state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16) -> None:
    """Refuse, naming them, tensors with NaN or infinity (also after the cast to `dtype`, as written)."""
    bad = [
        name
        for name, tensor in state.items()
        if tensor.is_floating_point() and not torch.isfinite(tensor.to(dtype)).all()
    ]
    if bad:
        raise NonFiniteWeights(f"refusing to export non-finite weights: {', '.join(bad[:8])}")


def export_model(loaded: LoadedModel, out: str | Path, temperatures: list[float] | tuple[float, ...],
                 manifest: dict[str, Any]) -> ExportResult:  # fmt: skip
    """Merge, check and write `loaded` to `out` crash-safe; a no-op when `out` already holds this export."""
    out = Path(out)
    config = {**loaded.config, "temperature": [float(t) for t in temperatures], "fine_tuned": True}
    manifest = {**manifest, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if _already_exported(out, config, manifest):
        return ExportResult(str(out), False, json.loads((out / MANIFEST).read_text()))
    model = merged_copy(loaded.model)
    state = model.state_dict()
    check_finite(state)
    write_staged(
        out, lambda staging: _write_layout(model, state, loaded.tokenizer, config, manifest, staging)
    )
    return ExportResult(str(out), True, manifest)


def write_staged(out: Path, write) -> None:
    """`write(folder)` into a staging folder beside `out`, then swap it in atomically; nothing half-written stays."""
    staging = _staging_dir(out)
    try:
        write(staging)
        _swap_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _already_exported(out: Path, config: dict[str, Any], manifest: dict[str, Any],
                      config_file: str = CONFIG_FILE, marker: str | None = None) -> bool:  # fmt: skip
    """The same source (weights digest) and the same decision config are already in place.

    `marker` is the file written last (the config itself unless named): without it the folder is no model.
    """
    if not all((out / name).is_file() for name in (config_file, MANIFEST, marker or config_file)):
        return False
    existing = json.loads((out / MANIFEST).read_text())
    same_source = existing.get("source_digest") and existing.get("source_digest") == manifest.get(
        "source_digest"
    )
    return bool(same_source) and json.loads((out / config_file).read_text()) == config


def _staging_dir(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def _remove_stale(out: Path) -> None:
    """Staging and set-aside folders left by an export that was killed (its process is gone)."""
    for leftover in out.parent.glob(f".{out.name}.*-*"):
        pid = leftover.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_layout(model, state, tokenizer, config, manifest, folder: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().half().contiguous() for k, v in state.items()}, str(folder / "model.safetensors")
    )
    model.encoder.config.save_pretrained(str(folder / "encoder"))
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    _fsync_tree(folder)
    partial = folder / (CONFIG_FILE + ".partial")
    partial.write_text(json.dumps(config, indent=2))
    _fsync_file(partial)
    partial.replace(folder / CONFIG_FILE)  # last: only now is the staging folder a model


def _swap_in(staging: Path, out: Path) -> None:
    """Put the complete staging folder at `out` atomically; the previous model ends up in `staging`."""
    if out.exists() and _exchange(staging, out):
        return
    if out.exists():
        # No atomic exchange here: move the old one aside first; its config goes last so it stays loadable.
        aside = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(aside)
        staging.rename(out)
        shutil.rmtree(aside, ignore_errors=True)
        return
    staging.rename(out)


def _exchange(a: Path, b: Path) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    result = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return result == 0


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            _fsync_file(path)


def export_folder(source: str | Path, out: str | Path) -> ExportResult:
    """`decision export`: a LoRA fine-tune folder (or a full model folder) to a merged export at `out`."""
    from pipeline.families.laya.adapters import load_for_inference
    from pipeline.data.pins import current_md5

    source, out = Path(source), Path(out)
    if source.resolve() == out.resolve() and (out / CONFIG_FILE).is_file():
        return ExportResult(str(out), False, _read_manifest(out))  # already a merged model in place
    loaded = load_for_inference(source)
    manifest = {**_read_manifest(source), "source": str(source), "source_digest": current_md5(source)}
    temperatures = loaded.config.get("temperature", [1.0, 1.0, 1.0])
    return export_model(loaded, out, temperatures, manifest)


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def export_stage(
    run_dir: str | Path, out: str | Path, data: str | Path, base: str | Path, config
) -> ExportResult:
    """The flow's export stage: the fine-tune in `run_dir` with the temperatures of its calibration, merged."""
    from dataclasses import fields

    from pipeline.families.laya.adapters import load_for_inference
    from pipeline.scoring.calibration import CALIBRATION_FILE, TYPE_NAMES
    from pipeline.stages.finetune import FINETUNE_DIR, TRAIN_SUMMARY, TrainRun, lineage

    run_dir = Path(run_dir)
    summary = json.loads((run_dir / TRAIN_SUMMARY).read_text())
    calibration = json.loads((run_dir / CALIBRATION_FILE).read_text())
    run = TrainRun(**{f.name: summary[f.name] for f in fields(TrainRun) if f.name in summary})
    temperatures = [calibration["temperatures"][name] for name in TYPE_NAMES]
    manifest = lineage(data, base, config, run, temperatures, calibration["heldout"])
    return export_model(load_for_inference(run_dir / FINETUNE_DIR), out, temperatures, manifest)
