"""Crash-safe export mechanics every family shares: CPU copies, LoRA merging, finiteness checks, staged
writes.

A family writes its layout into a staging folder beside the target (its marker file last), then the staging
folder is swapped with the target in one atomic rename (`renameat2` RENAME_EXCHANGE), so a reader sees the old
model or the new one, never a mix; a folder without the marker is never listed or loaded.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.families.base import ModelLayoutError
from pipeline.scoring.automation import Automation
from pipeline.scoring.calibrators import CALIBRATOR_FILE, Calibrator
from pipeline.scoring.certify import read_certificates
from pipeline.scoring.novelty import read_novelty

MANIFEST = "manifest.json"
TRAINING_STATES = "training_states"
"""The manifest's entry for the fingerprints of the states the model trained on
(`data.leakage.state_fingerprints`: sorted, distinct little-endian uint64s), by which `decision evaluate`
counts evaluation rows it trained on."""
TRAINING_STATES_FILE = "training_states.u64"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class NonFiniteWeights(ValueError):
    """A tensor to export holds NaN or infinity; nothing is written."""


def cpu_clone(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy (a Parameter stays a Parameter, frozen)."""
    clone = tensor.detach().to("cpu", copy=True)
    return torch.nn.Parameter(clone, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else clone


def cpu_copy(
    model: torch.nn.Module, clone: Callable[[torch.Tensor], torch.Tensor] = cpu_clone
) -> torch.nn.Module:
    """A deep copy of `model` on the CPU; `clone` makes each tensor's CPU copy."""
    # Copy straight to the CPU: deep-copying the module where it lives would grow the device's memory.
    memo = {id(t): clone(t) for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def merge_lora_layers(merged: torch.nn.Module) -> torch.nn.Module:
    """`merged` (changed in place) with every LoRA layer merged into its base layer and replaced by it."""
    if not has_peft_modules(merged):
        return merged  # nothing to merge: spare the peft import (seconds, with bitsandbytes installed)
    from peft.tuners.lora import LoraLayer

    for name, module in list(merged.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            set_module(merged, name, module.get_base_layer())
    return merged


def has_peft_modules(model: torch.nn.Module) -> bool:
    """Whether peft put any layer (LoRA, its wrapper) into `model`; asks without importing peft."""
    return any(type(m).__module__.startswith("peft.") for m in model.modules())


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A fp32 CPU copy of `model` with every LoRA adapter merged into its base layer and removed."""
    return merge_lora_layers(cpu_copy(model).float())


def set_module(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """Replace the submodule at dotted `name`."""
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def check_finite(state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float16) -> None:
    """Refuse, naming them, tensors with NaN or infinity (also after the cast to `dtype`, as written)."""
    bad = [
        name
        for name, tensor in state.items()
        if tensor.is_floating_point() and not torch.isfinite(tensor.to(dtype)).all()
    ]
    if bad:
        raise NonFiniteWeights(f"refusing to export non-finite weights: {', '.join(bad[:8])}")


def already_exported(
    out: Path,
    config: dict[str, Any],
    manifest: dict[str, Any],
    config_file: str,
    marker: str,
    calibrator: Calibrator,
) -> bool:
    """The same source (weights digest), decision config, calibrator and carried files (training states,
    certificates, the novelty gate) are already in place at `out`.

    `marker` is the file written last: without it the folder is no model.
    """
    if not all((out / name).is_file() for name in (config_file, MANIFEST, marker)):
        return False
    existing = read_manifest(out)
    digest = existing.get("source_digest")
    same_source = bool(digest) and digest == manifest.get("source_digest")
    same_calibrator = (existing.get("calibrator") or {}).get("sha256") == manifest["calibrator"]["sha256"]
    same_carried = all(existing.get(entry) == manifest.get(entry) for entry in CARRIED)
    same_config = json.loads((out / config_file).read_text()) == config
    return same_source and same_calibrator and same_carried and same_config


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLayoutError(f"{path}: not valid JSON ({error}); a corrupted export?") from error


def calibrator_bytes(calibrator: Calibrator) -> bytes:
    return json.dumps(calibrator.to_json(), indent=2, sort_keys=True).encode()


def calibrator_entry(calibrator: Calibrator, served_by_others: str) -> dict[str, Any]:
    """The manifest's record of the export's calibrator: its file, kind and hash, and what other readers
    apply."""
    return {
        "file": CALIBRATOR_FILE,
        "kind": calibrator.kind,
        "sha256": hashlib.sha256(calibrator_bytes(calibrator)).hexdigest(),
        "other_readers": served_by_others,
    }


def write_calibrator(folder: Path, calibrator: Calibrator) -> None:
    (folder / CALIBRATOR_FILE).write_bytes(calibrator_bytes(calibrator))


def read_calibrator(folder: str | Path) -> Calibrator | None:
    """The calibrator the folder's manifest names, checked against its hash; None for an export without one
    (older exports: type temperatures in the family's config). A named file missing or changed is an error."""
    folder = Path(folder)
    entry = read_manifest(folder).get("calibrator")
    if not entry:
        return None
    path = folder / entry.get("file", CALIBRATOR_FILE)
    if not path.is_file():
        raise ModelLayoutError(f"{path}: missing; the manifest names a {entry.get('kind')} calibrator there")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise ModelLayoutError(
            f"{path}: its bytes differ from the sha256 in {MANIFEST} (corrupted or edited)"
        )
    try:
        return Calibrator.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ModelLayoutError(f"{path}: not a calibrator: {error}") from error


CERTIFICATES = "certificates"
"""The manifest's entry for the automation rules certified per question (`scoring.certify`), which the server
applies (an export without one automates nothing)."""
CERTIFICATES_FILE = "certificates.json"
NOVELTY = "novelty"
"""The manifest's entry for the novelty gate's reference (`scoring.novelty`): a state unlike the training
states is never automated."""
NOVELTY_FILE = "novelty.npz"
CARRIED = {TRAINING_STATES: TRAINING_STATES_FILE, CERTIFICATES: CERTIFICATES_FILE, NOVELTY: NOVELTY_FILE}
"""The files an export carries beside its model, by manifest entry: each named in the manifest with its hash."""


def training_states_entry(fingerprints: bytes) -> dict[str, Any]:
    """The manifest's record of a training-states file (`TRAINING_STATES`): its file, count and hash."""
    return {
        "file": TRAINING_STATES_FILE,
        "count": len(fingerprints) // 8,
        "sha256": hashlib.sha256(fingerprints).hexdigest(),
        "fingerprint": "blake2b-64 of each training row's normalised state (pipeline.data.leakage)",
    }


def read_carried(folder: str | Path, entry_name: str) -> bytes | None:
    """The bytes of the file the folder's manifest names under `entry_name` (`CARRIED`); None where it names
    none (an older export, a base), or the file is missing or differs from its hash: nothing to apply then,
    never an error."""
    entry = read_manifest(Path(folder)).get(entry_name)
    path = Path(folder) / (entry or {}).get("file", CARRIED[entry_name])
    if not entry or not path.is_file():
        return None
    data = path.read_bytes()
    return data if hashlib.sha256(data).hexdigest() == entry.get("sha256") else None


def read_training_states(folder: str | Path) -> bytes | None:
    """The training-states file the folder's manifest names (`read_carried`)."""
    return read_carried(folder, TRAINING_STATES)


def read_automation(folder: str | Path) -> Automation:
    """The certificates and novelty gate the folder's manifest names (`read_carried`): none of either for an
    export made before them (it automates nothing), a base, or a fine-tune folder."""
    certificates = read_certificates(read_carried(folder, CERTIFICATES))
    return Automation(certificates, read_novelty(read_carried(folder, NOVELTY)))


def with_carried(
    manifest: dict[str, Any], files: dict[str, bytes], entry_name: str, data: bytes | None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(`manifest` naming the carried file `data` under `entry_name`, `files` with it); without `data` the
    manifest names none and nothing is added."""
    manifest = {k: v for k, v in manifest.items() if k != entry_name}
    if data is None:
        return manifest, files
    name = CARRIED[entry_name]
    entry = (
        training_states_entry(data)
        if entry_name == TRAINING_STATES
        else {"file": name, "sha256": hashlib.sha256(data).hexdigest()}
    )
    return manifest | {entry_name: entry}, files | {name: data}


def with_training_states(
    manifest: dict[str, Any], states: bytes | None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(`manifest` naming the training-states file `states`, the files an export writes for it); without
    `states` the manifest names none and there is nothing to write."""
    return with_carried(manifest, {}, TRAINING_STATES, states)


def write_files(folder: Path, files: dict[str, bytes] | None) -> None:
    """Files the export carries beside the model (`TRAINING_STATES_FILE`), each named in its manifest."""
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)


def load_weights(path: Path, load: Callable[[str], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """`load(path)` (a safetensors reader), with a truncated or corrupted file named in a ModelLayoutError."""
    if not path.is_file():
        raise ModelLayoutError(f"{path}: missing; an unfinished or damaged export?")
    try:
        return load(str(path))
    except Exception as error:  # safetensors raises its own SafetensorError (and OSError) on damaged files
        raise ModelLayoutError(
            f"{path}: unreadable weights ({type(error).__name__}: {error}); a truncated or corrupted export?"
        ) from error


def write_marker_last(folder: Path, name: str, write: Callable[[Path], None]) -> None:
    """Everything else in `folder` synced, then `write(partial)` and one rename to `name`: only now is it a
    model."""
    fsync_tree(folder)
    partial = folder / (name + ".partial")
    write(partial)
    fsync_file(partial)
    partial.replace(folder / name)


def write_staged(
    out: Path, write: Callable[[Path], None], settle: Callable[[Path], Any] | None = None
) -> Any:
    """`write(folder)` into a staging folder beside `out`, then swap it in atomically; nothing half-written
    stays. `settle(out)` runs once it is in place (a `dvc add`), and what it returns is returned; where it
    raises, `out` goes back to what it was."""
    staging = _staging_dir(out)
    try:
        write(staging)
        _swap_in(staging, out)
        return None if settle is None else _settle_or_swap_back(out, staging, settle)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _settle_or_swap_back(out: Path, previous: Path, settle: Callable[[Path], Any]) -> Any:
    try:
        return settle(out)
    except BaseException:
        if previous.exists():
            _swap_in(previous, out)
        else:
            shutil.rmtree(out, ignore_errors=True)
        raise


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fsync_file(path)


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


def _swap_in(staging: Path, out: Path) -> None:
    """Put the complete staging folder at `out` atomically; the previous model ends up in `staging`."""
    if out.exists() and _exchange(staging, out):
        return
    if out.exists():
        # No atomic exchange here: move the old one aside first; its marker goes last so it stays loadable.
        aside = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(aside)
        staging.rename(out)
        aside.rename(staging)
        return
    staging.rename(out)


def _exchange(a: Path, b: Path) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    result = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return result == 0
