"""`decision init` (and `make run DATA=...`): make a user's data and base the inputs of a named run.

One call checks the data source (any kind `pipeline.data.sources` reads; a mapping when it is a plain table)
and pins it (`dvc add` of the file or folder; copied into `data/own/` first when it lies outside the project,
as DVC tracks only what is inside; a Hub data set is written there as Parquet shards), pins the base
(`decision snapshot --from` for anything not pinned already; the stock MiniLM snapshot by default), and writes
the run config `configs/NAME.yaml` that the retrain flow reads (`decision retrain --run-config NAME`): the
data, the base, the run folder, the registered model name NAME, and the mapping (`validate.mapping`). Keys a
user added to that file by hand are kept. A rerun re-pins: a changed file or shard is a new data revision, and
the result says so. The data is split as the run will split it, and the rows held out are added to the data
set's ledger (`split.ledger_path`), so they stay held out however the data grows.

    init_run("~/exports/tickets.csv", name="tickets", mapping="tickets.yaml")   # data/own/tickets.csv pinned
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from pipeline.config import RUN_CONFIGS_DIR, ConfigError, RetrainConfig, ValidateConfig, load_params
from pipeline.data.contract import Record
from pipeline.data.facts import announced
from pipeline.data.mapping import load_mapping
from pipeline.data.pins import LOCK_FILE, PinMismatch, check_pins, pin_command
from pipeline.data.read import iter_tables
from pipeline.data.sources import HUB_PREFIX, is_glob, matched_files, pin_path
from pipeline.data.split import ledger_path, ledger_under, record_heldout, refuse_unusable, split_holdout
from pipeline.data.validate import validate_file
from pipeline.families import pick_family
from pipeline.lineage import uncommitted
from pipeline.stages.snapshot import pin_folder, run_dvc, snapshot_base
from pipeline.yaml_files import YamlFileError, load_yaml_file

OWN_DATA_DIR = Path("data/own")
SNAPSHOTS_DIR = Path("data/snapshots")
NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
INIT_HEADER = "# Written by `decision init`"


class BadInit(ValueError):
    """The run cannot be set up as asked (a bad name, no such data); the message says what to do."""


@dataclass(frozen=True)
class InitResult:
    """The run config written, and what was pinned for it."""

    name: str
    run_config: str
    data: str
    data_md5: str | None
    previous_data_md5: str | None
    """The data's pin before this call (None: it had none); differs from `data_md5` when the data changed."""
    base: str
    base_md5: str | None
    copied: bool
    """The data lay outside the project and was copied in."""
    updated: bool = False
    """The run config existed (an earlier init wrote it) and was updated, its other keys kept."""
    to_commit: tuple[str, ...] = ()
    """What init and DVC wrote that git does not hold yet: the run config, a mapping copy, the pins and DVC's
    .gitignore files (the bytes stay DVC's), for the user to commit."""
    mapping_dropped: bool = False
    """An earlier init's `validate.mapping` was removed: DATA holds decision rows now (`decision map --write`
    made them from the table, to harvest into)."""
    ledger: str | None = None
    """The data set's held-out ledger (`split.ledger_path`), in the project."""
    heldout: int = 0
    """Rows the run's split holds out, each listed in the ledger: they stay held out as the data grows."""

    @property
    def data_changed(self) -> bool:
        return self.previous_data_md5 is not None and self.previous_data_md5 != self.data_md5

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"data_changed": self.data_changed}


def run_name(data: str, name: str | None) -> str:
    """`name`, or the data's file or folder name without its suffix, lower-cased; BadInit when not usable as a
    registry and file name."""
    chosen = name if name is not None else Path(data.rstrip("/")).name.split(".")[0].lower()
    if not NAME_PATTERN.match(chosen):
        raise BadInit(
            f"run name {chosen!r}: use 1-63 of a-z, 0-9, '.', '_', '-' (starting and ending with a "
            "letter or digit); pass NAME=... (make) or --name"
        )
    return chosen


def init_run(
    data: str,
    base: str | None = None,
    name: str | None = None,
    mapping: str | dict[str, Any] | None = None,
    root: str | Path = ".",
    report: Callable[[str], None] | None = None,
) -> InitResult:
    """Pin `data` and `base` (None: the stock snapshot) and write `configs/<name>.yaml` under `root`; the data
    source, the mapping and the base are checked before anything is copied or pinned. `report` hears of each
    step that runs past 2 s (reading and checking the data, copying it in, snapshotting the base, pinning)."""
    root = Path(root).resolve()
    name = run_name(data, name)
    config_file = root / RUN_CONFIGS_DIR / f"{name}.yaml"
    existing = _existing_run_config(config_file)  # one init did not write is never taken over
    # Without a mapping DATA must hold decision rows (validated so below): an earlier init's mapping of a
    # table would make the run read them as that table.
    mapping_dropped = mapping is None and "mapping" in existing.get("validate", {})
    if mapping_dropped:
        existing["validate"] = {k: v for k, v in existing["validate"].items() if k != "mapping"}
        existing = {section: keys for section, keys in existing.items() if keys or section != "validate"}
    data = data if data.startswith(HUB_PREFIX) else os.path.expanduser(data)
    loaded = load_mapping(mapping) if mapping is not None else None  # MappingError, before anything is pinned
    # BadSource / UnreadableInput (an empty folder or file, shards that disagree, a Hub id offline, a table
    # with no mapping) and a source with no usable decision are refused here, with the reasons, before
    # anything is pinned
    checked = validate_file(data, mapping=loaded, report=report)  # its records make the run's first split
    refuse_unusable(data, checked.report)
    # The base is checked (it loads as a base) before the data is pinned.
    rel_base, base_md5 = _pinned_base(base, root, report)
    sections = {
        "retrain": {
            "data": _run_data_text(data, root, name),
            "base": rel_base,
            "runs_dir": f"runs/{name}",
            "model_name": name,
        },
        "validate": {} if mapping is None else {"mapping": _mapping_entry(mapping, root, name)},
    }
    merged = _merged(existing, sections)
    try:  # the config as it will be written, checked before anything is copied, pinned or written
        split_config = ledger_under(load_params(root / "params.yaml", overrides=merged).validate, root)
        ledger = ledger_path(root / sections["retrain"]["data"], split_config)
    except ConfigError as error:
        raise BadInit(f"{config_file}: {error}") from None
    data_text, pinned, copied = _inside(data, root, name, report)
    previous = _current_pin(pinned.relative_to(root).as_posix(), root)
    with announced(report, f"pinning {pinned.relative_to(root)} (dvc add hashes its files)"):
        data_md5, _ = pin_folder(pinned)
    if isinstance(mapping, str):
        _copy_mapping(mapping, root, name)
    config = _write_run_config(config_file, name, merged)
    heldout = _record_split(checked.records, split_config, ledger)
    rel_ledger = None if ledger is None else _in_project(ledger, root)
    written = [
        config.relative_to(root).as_posix(),
        _mapping_copy(root, name).relative_to(root).as_posix(),
        *_pin_files(pinned.relative_to(root).as_posix()),
        *_pin_files(rel_base),
        "dvc.lock",
        *filter(None, [rel_ledger]),
    ]
    return InitResult(
        name=name,
        run_config=config.relative_to(root).as_posix(),
        data=data_text,
        data_md5=data_md5,
        previous_data_md5=previous,
        base=rel_base,
        base_md5=base_md5,
        copied=copied,
        updated=bool(existing),
        to_commit=tuple(uncommitted(written, root)),
        mapping_dropped=mapping_dropped,
        ledger=rel_ledger,
        heldout=heldout,
    )


def _record_split(records: list[Record], config: ValidateConfig, ledger: Path | None) -> int:
    """The run's first split of `records`: its held-out rows added to the data set's `ledger` (the retrain
    flow's split reads it), so they stay held out as the data grows; how many rows it holds out."""
    split = split_holdout(records, config, ledger)
    if ledger is not None:
        record_heldout(split, ledger)
    return len(split.heldout)


def _in_project(path: Path, root: Path) -> str:
    """`path` as the run config and git name it: relative to the project where it lies inside."""
    resolved = path.resolve()
    return resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else str(path)


def _pin_files(rel: str) -> list[str]:
    """The files DVC writes to pin `rel` with `dvc add`: its .dvc file and the .gitignore beside it."""
    return [f"{rel}.dvc", (Path(rel).parent / ".gitignore").as_posix()]


def _existing_run_config(path: Path) -> dict[str, Any]:
    """The sections of a run config an earlier init wrote ({} where there is none); BadInit for one init did
    not write (a shipped or hand-written config, which a rerun must not take over) or one that cannot be
    read."""
    if not path.exists():
        return {}
    try:
        sections = load_yaml_file(path) or {}
    except YamlFileError as error:  # its message names the file
        raise BadInit(f"{error}; fix or remove it, or give another --name") from None
    except OSError as error:
        raise BadInit(f"{path}: {error.strerror}; fix or remove it, or give another --name") from None
    if not isinstance(sections, dict) or not all(isinstance(v, dict | None) for v in sections.values()):
        raise BadInit(f"{path}: expected sections of keys (retrain:, train:, ...); fix or remove it")
    written_for = (sections.get("retrain") or {}).get("model_name")
    if written_for != path.stem:  # init always names the model after the run
        raise BadInit(
            f"{path} exists and `decision init` did not write it (its retrain.model_name is "
            f"{written_for!r}, not {path.stem!r}): give another --name (NAME=), or move that file away"
        )
    return {section: values or {} for section, values in sections.items()}


def _merged(existing: dict[str, Any], sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`existing` with the keys of `sections` set; its other keys (a user's additions) kept."""
    merged = dict(existing)
    for section, values in sections.items():
        if values:
            merged[section] = {**(merged.get(section) or {}), **values}
    return merged


def _run_data_text(data: str, root: Path, name: str) -> str:
    """The DATA text the run will read (`_inside` makes it so): the source's path inside the project, or where
    it is copied to under data/own/."""
    if data.startswith(HUB_PREFIX):
        return (OWN_DATA_DIR / name).as_posix()
    path = pin_path(data).expanduser().resolve()
    rest = data[len(str(pin_path(data))) :]
    if path.is_relative_to(root):
        return path.relative_to(root).as_posix() + rest
    return (OWN_DATA_DIR / (name + "".join(path.suffixes) if path.is_file() else name)).as_posix() + rest


def _inside(data: str, root: Path, name: str, report: Callable[[str], None] | None) -> tuple[str, Path, bool]:
    """(the DATA text the run reads, the path DVC pins, whether it was copied in): the source as it is when
    its path lies inside the project; else its file or folder copied to data/own/ (replaced whole each time)
    with the glob or split kept; a Hub data set written there as Parquet shards."""
    text = _run_data_text(data, root, name)
    if data.startswith(HUB_PREFIX):
        target = root / OWN_DATA_DIR / name
        with announced(report, f"writing {data} into {target.relative_to(root)} as Parquet shards"):
            _staged(target, lambda staging: _write_shards(data, staging))
        return text, target, True
    path = pin_path(data).expanduser().resolve()
    if path.is_relative_to(root):
        return text, path, False
    target = root / OWN_DATA_DIR / (name + "".join(path.suffixes) if path.is_file() else name)
    with announced(
        report, f"copying {path} into {target.relative_to(root)} (DVC pins only what lies inside the project)"
    ):
        _staged(target, lambda staging: _copy(path, staging, data))
    return text, target, True


def _staged(target: Path, fill) -> None:
    """Fill a staging path beside `target`, then swap it in: a crash mid-copy leaves the old copy, never
    half."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.copying")
    shutil.rmtree(staging, ignore_errors=True)
    fill(staging)
    if target.is_dir():
        shutil.rmtree(target)
    staging.replace(target)


def _copy(path: Path, staging: Path, data: str) -> None:
    """The file, the folder, or of a glob's folder only the files it matches (their paths below it kept, so
    the glob reads the copy as it read them): nothing else there is pinned, or counts as a change of data."""
    if is_glob(data):
        pattern = str(Path(data).expanduser())
        for file in matched_files(pattern):
            copy = staging / os.path.relpath(file, pin_path(pattern))
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, copy)
    elif path.is_dir():
        shutil.copytree(path, staging, ignore=shutil.ignore_patterns(".*"))
    else:
        shutil.copy2(path, staging)


def _write_shards(data: str, staging: Path, rows_per_shard: int = 100_000) -> None:
    staging.mkdir(parents=True)
    for index, table in enumerate(iter_tables(data, rows_per_shard)):
        pq.write_table(table, staging / f"part-{index:05d}.parquet")


def _mapping_entry(mapping: str | dict[str, Any], root: Path, name: str) -> str | dict[str, Any]:
    """What `validate.mapping` holds: a mapping file inside the project by its path, one outside it by where
    `_copy_mapping` puts it (configs/<name>.mapping.yaml), flags' mapping inline."""
    if isinstance(mapping, dict):
        return mapping
    path = Path(mapping).expanduser().resolve()
    return (path if path.is_relative_to(root) else _mapping_copy(root, name)).relative_to(root).as_posix()


def _mapping_copy(root: Path, name: str) -> Path:
    return root / RUN_CONFIGS_DIR / f"{name}.mapping.yaml"


def _copy_mapping(mapping: str, root: Path, name: str) -> None:
    """A mapping file outside the project copied to configs/<name>.mapping.yaml (the run config names it
    there)."""
    path = Path(mapping).expanduser().resolve()
    if not path.is_relative_to(root):
        copy = _mapping_copy(root, name)
        copy.parent.mkdir(exist_ok=True)
        shutil.copy2(path, copy)


def _current_pin(rel: str, root: Path) -> str | None:
    pin = root / f"{rel}.dvc"
    if not pin.is_file():
        return None
    return (yaml.safe_load(pin.read_text()) or {}).get("outs", [{}])[0].get("md5")


def _pinned_base(
    base: str | None, root: Path, report: Callable[[str], None] | None
) -> tuple[str, str | None]:
    """(the base's path in the project, its md5): the stock snapshot by default, a pinned folder as it is (a
    dvc.yaml stage's output built or brought up to date first, now that the name, data and mapping passed),
    and anything else (a folder elsewhere, a Hub id) snapshotted to data/snapshots/<its name> and pinned."""
    folder = root / RetrainConfig().base if base is None else Path(base).expanduser().resolve()
    if folder.is_relative_to(root):
        rel = folder.relative_to(root).as_posix()
        if (command := pin_command(rel, root)).startswith("dvc repro"):
            with announced(report, f"building {rel} with {command}"):
                run_dvc(command.split()[1:], root)
        if base is not None and folder.exists():
            pick_family(folder)  # BadBase, naming it, when no family starts from it
        if base is None or command.startswith("dvc repro"):
            return rel, _stage_md5(rel, root)
        if folder.exists():
            md5, _ = pin_folder(folder)
            return rel, md5
    out = root / SNAPSHOTS_DIR / Path(base.rstrip("/")).name.lower()
    with announced(report, f"snapshotting base {base} into {out.relative_to(root)}"):
        pinned = snapshot_base(base, out)
    return out.relative_to(root).as_posix(), pinned.md5


def _stage_md5(rel: str, root: Path) -> str | None:
    """A dvc.yaml stage output's pin in dvc.lock (None until `dvc repro` has built it)."""
    try:
        return check_pins({rel: root / rel}, root / LOCK_FILE, require=True).pins[rel]
    except PinMismatch:  # no such stage here (a project without dvc.yaml's snapshot stage), or not built
        return None


def _write_run_config(path: Path, name: str, sections: dict[str, Any]) -> Path:
    """configs/<name>.yaml holding `sections` (checked already), written whole or not at all."""
    path.parent.mkdir(exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(
        f"{INIT_HEADER} (make run DATA=... NAME={name}); keys you add are kept.\n"
        + yaml.safe_dump(sections, sort_keys=False),
        encoding="utf-8",
    )
    staging.replace(path)
    return path
