"""Check data and model files against their DVC pins before anything trains on them, hashed by DVC itself.

A pin is the md5 DVC recorded for a path: a stage output in `dvc.lock` (`dvc repro`) or a `PATH.dvc` file
(`dvc add PATH`). Hashes come from `dvc_data`, the library `dvc status` compares with, so a folder's `.dir`
hash is the one DVC writes. One checker, `check_pins`: the retrain flow requires every input pinned and
matching, or it refuses; the ad-hoc commands require a pinned input to match and let an unpinned one (a user's
own file) pass; either way the run records which was which (`CheckedInputs`).

A DATA source that is not one path (a glob, one split of a saved DatasetDict, a Hub id: `sources.py`) is
pinned by the folder `dvc add` tracks for it (`sources.pin_path`); a Hub id cannot be pinned. `data_revision`
names the rows a source holds: DVC's md5 where the source is all of its pinned path, else an md5 over its
shards.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dvc_data.hashfile.build import build
from dvc_data.hashfile.db import HashFileDB
from dvc_objects.fs import MemoryFileSystem, localfs

from pipeline.data.sources import HUB_PREFIX, Source, open_source, pin_path

LOCK_FILE = "dvc.lock"
PIPELINE_FILE = "dvc.yaml"
OVERRIDE = (
    "or pass --allow-unpinned to train anyway: the run is tagged so, and its version is never promoted to "
    "champion without `decision promote VERSION --force`"
)


class PinMismatch(RuntimeError):
    """Files on disk differ from their DVC pins (or have none)."""


class Unpinned(PinMismatch):
    """Inputs no DVC pin covers: the retrain flow refuses them unless --allow-unpinned."""


def dvc_root(path: str | Path) -> Path | None:
    """The DVC repository `path` lies in (the nearest folder above it holding `.dvc/`), or None."""
    return next((p for p in Path(path).resolve().parents if (p / ".dvc").is_dir()), None)


def current_md5(path: str | Path) -> str:
    """The md5 DVC records for a file, or for a folder its `.dir` hash, computed by DVC's own `dvc_data`."""
    # dry_run: hash only; the objects DVC would cache go nowhere, and the tree's listing to a throwaway store.
    odb = HashFileDB(MemoryFileSystem(global_store=False), "/")
    _, _, obj = build(odb, str(Path(path).resolve()), localfs, "md5", dry_run=True)
    return obj.hash_info.value


def data_revision(source: str | Path | Source) -> str:
    """The revision of a DATA source: a changed, added or removed shard gives a new one.

    DVC's md5 of the pinned path where the source is all of it (a file, a folder of shards, a saved data set:
    what `dvc add` records, so a pinned source's revision is its pin); otherwise (a glob, one split of a
    DatasetDict, a Hub data set) an md5 over each shard's name, size and DVC md5, in reading order.
    """
    opened = source if isinstance(source, Source) else open_source(source)
    if opened.whole and opened.pin_path is not None:
        return current_md5(opened.pin_path)
    lines = [
        f"{_shard_name(shard.path, opened.pin_path)}\t{shard.path.stat().st_size}\t{current_md5(shard.path)}"
        for shard in opened.shards
    ]
    return hashlib.md5("\n".join(lines).encode()).hexdigest()


def _shard_name(path: Path, folder: Path | None) -> str:
    """The shard's path within its pinned folder (its file name for a Hub data set's cache files)."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix() if folder else path.name
    except ValueError:
        return path.name


def pinned_outputs(lock_path: str | Path = LOCK_FILE) -> dict[str, str]:
    """Every stage output in dvc.lock as {path: md5}."""
    lock = yaml.safe_load(Path(lock_path).read_text()) or {}
    pins = {}
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs", []):
            pins[out["path"]] = out["md5"]
    return pins


@dataclass(frozen=True)
class CheckedInputs:
    """A run's inputs as checked against their DVC pins (`check_pins`): what it records of them."""

    pins: dict[str, str] = field(default_factory=dict)
    """md5 by path (relative to the lock's folder) of every input a pin covers, each verified."""
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each named input (data, base, eval_data) as {"path", "pinned"}."""

    @property
    def unpinned(self) -> list[str]:
        """The inputs no pin covers (their paths as given), unchecked."""
        return [entry["path"] for entry in self.inputs.values() if not entry["pinned"]]

    def tags(self) -> dict[str, str]:
        """Run and version tags: `data_pinned=true`, `base_pinned=false`, ..."""
        return pin_tags(self.inputs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_pins(
    named: dict[str, str | Path | None], lock_path: str | Path = LOCK_FILE, require: bool = False
) -> CheckedInputs:
    """Check each named input (None: not given) against its DVC pin: a pinned one must match (`PinMismatch`
    listing every problem); one no pin covers passes unchecked, or with `require` is refused (`Unpinned`,
    raised before anything is hashed, naming each path and the command that pins it)."""
    lock = Path(lock_path)
    root = lock.resolve().parent
    given = {name: str(path) for name, path in named.items() if path is not None}
    pinned = {name: _relative_to(path, root) for name, path in given.items() if _is_pinned(path, root, lock)}
    missing = [path for name, path in given.items() if name not in pinned]
    if require and missing:
        raise Unpinned(_unpinned_message(missing, lock))
    inputs = {name: {"path": path, "pinned": name in pinned} for name, path in given.items()}
    return CheckedInputs(_verified(list(dict.fromkeys(pinned.values())), root, lock), inputs)


def _verified(paths: list[str], root: Path, lock: Path) -> dict[str, str]:
    """{path: md5} for each pinned path (relative to `root`) whose bytes match its pin, or PinMismatch listing
    every one that does not."""
    problems, verified = [], {}
    for rel in paths:
        md5, source = _pin_of(rel, root, lock)
        # A stage output is rebuilt by its stage; a `dvc add`ed folder has only its cache to come back from.
        added = str(source).endswith(".dvc")
        restore = f"dvc checkout --force {rel}" if added else "dvc repro"
        if not (root / rel).exists():
            problems.append(f"{rel}: missing (pinned md5 {md5}); run `{restore}` or `dvc pull` to restore it")
        elif (found := current_md5(root / rel)) != md5:
            pin_these = f"dvc add {rel}" if added else "dvc commit"
            problems.append(
                f"{rel}: bytes differ from {source} (pinned md5 {md5}, found md5 {found}); `{restore}` "
                f"brings back the pinned bytes, `{pin_these}` pins these"
            )
        else:
            verified[rel] = found
    if problems:
        raise PinMismatch("refusing to train on unpinned data:\n  " + "\n  ".join(problems))
    return verified


def pin_tags(status: dict[str, dict]) -> dict[str, str]:
    """`CheckedInputs.inputs` as run and version tags: `data_pinned=true`, `base_pinned=false`, ..."""
    return {f"{name}_pinned": str(entry["pinned"]).lower() for name, entry in status.items()}


def pin_command(rel: str, root: str | Path = ".") -> str:
    """The DVC command that pins `rel`: `dvc repro STAGE` for a stage output of dvc.yaml, else `dvc add`."""
    stage = producing_stage(rel, root)
    return f"dvc repro {stage[0]}" if stage is not None else f"dvc add {rel}"


def producing_stage(rel: str, root: str | Path = ".") -> tuple[str, str] | None:
    """(name, cmd) of the dvc.yaml stage whose output `rel` is, or None."""
    pipeline = Path(root) / PIPELINE_FILE
    stages = (yaml.safe_load(pipeline.read_text()) or {}).get("stages", {}) if pipeline.is_file() else {}
    for name, stage in stages.items():
        # An out is a path, or {path: options} when it carries options (persist, cache).
        if rel in {next(iter(out)) if isinstance(out, dict) else out for out in stage.get("outs", [])}:
            return name, str(stage.get("cmd", ""))
    return None


def _unpinned_message(missing: list[str], lock: Path) -> str:
    root = lock.resolve().parent
    state = f"{lock} is missing" if not lock.is_file() else f"neither {lock} nor a .dvc file pins them"
    lines = [_unpinned_line(path, root) for path in missing]
    return f"refusing to train on unpinned inputs ({state}):\n  " + "\n  ".join(lines) + f"\n{OVERRIDE}"


def _unpinned_line(path: str, root: Path) -> str:
    if path.startswith(HUB_PREFIX):
        return (
            f"{path}: a Hub data set, which DVC cannot pin; save it with `save_to_disk` to a folder in "
            f"{root} and `dvc add` that folder"
        )
    rel = _relative_to(path, root)
    if rel is None:  # DVC tracks only what lies inside its repository
        return f"{path}: outside {root}, where DVC cannot pin it; copy it in and `dvc add` it"
    return f"{path}: not pinned; pin it with `{pin_command(rel, root)}` in {root}"


def _is_pinned(path: str | Path, root: Path, lock: Path) -> bool:
    rel = _relative_to(path, root)
    return rel is not None and _pin_of(rel, root, lock) is not None


def _pin_of(rel: str, root: Path, lock: Path) -> tuple[str, str] | None:
    """(md5, where it is recorded) for `rel`: a stage output in dvc.lock, else `rel.dvc` (`dvc add`)."""
    if lock.is_file() and (md5 := pinned_outputs(lock).get(rel)):
        return md5, lock.name
    dvc_file = root / f"{rel}.dvc"
    if not dvc_file.is_file():
        return None
    outs = (yaml.safe_load(dvc_file.read_text()) or {}).get("outs") or []
    md5 = next((out["md5"] for out in outs if out.get("path") == Path(rel).name), None)
    return (md5, dvc_file.name) if md5 else None


def _relative_to(path: str | Path, root: Path) -> str | None:
    """The path DVC pins for `path` (a glob's folder, a DatasetDict's root: `sources.pin_path`) relative to
    `root`; None outside it, or for a Hub id."""
    target = pin_path(path)
    if target is None:
        return None
    try:
        return target.resolve().relative_to(root).as_posix()
    except ValueError:
        return None
