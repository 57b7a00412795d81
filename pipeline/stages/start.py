"""The start of a run, one function for the retrain and the sweep flow: the tracking store answers, the params
load, the inputs are checked against their DVC pins and opened, and the run gets its idempotency key and
lineage tags.

    start = start_run("params.yaml", "tiny", lock="dvc.lock", allow_unpinned=False)
    with RunFolder(start.folder()).driven(): ...      # one process drives a run

`check_inputs` is the part a command runs before it starts a flow (one line and exit 2, where a flow run would
log a traceback); the flow's own process checks once more (a deployment runs it without the command).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, Params, load_params
from pipeline.data.pins import LOCK_FILE, CheckedInputs, PinMismatch, check_pins, current_md5, data_revision
from pipeline.data.read import iter_tables
from pipeline.data.shards import BadSource, UnreadableInput
from pipeline.families import resolve_training
from pipeline.families.base import ModelLayoutError
from pipeline.lineage import (
    TAGGED_SETTINGS,
    DataRevision,
    code_digest,
    git_commit,
    idempotency_key,
    keyed_sections,
    settings_changed,
)
from pipeline.mlops.promotion import CHAMPION, UNPINNED_TAG
from pipeline.mlops.registry import alias_data_revision, registry_lineage, tracking_uri
from pipeline.mlops.store import check_tracking_store
from pipeline.mlops.tracking import flat_params

REFUSED_INPUTS = (ConfigError, PinMismatch, UnreadableInput, ModelLayoutError)
"""What `check_inputs` raises: a run's inputs refused in one line (exit 2 from a command)."""


@dataclass(frozen=True)
class RunStart:
    """A run about to start: its params, its checked inputs, what they hash to, and its key and tags."""

    params: Params
    checked: CheckedInputs
    data_md5: str
    base_md5: str
    code: str
    unpinned: bool
    """Trained with --allow-unpinned: the run and its version are tagged so, and the gate holds the
    version."""
    key: str
    tags: dict[str, str]
    """Lineage (data and base md5, code digest, git commit), the inputs and whether DVC pins them, the
    owner."""

    def folder(self, *under: str) -> Path:
        """The run's folder: `retrain.runs_dir`/`under`.../the key's first 16 characters."""
        return Path(self.params.retrain.runs_dir, *under, self.key[:16])

    def keyed_with(self, parts: dict[str, Any]) -> RunStart:
        """The same start under a key that also reads `parts` (a sweep's space)."""
        key = _key(self.params, self.data_md5, self.base_md5, self.code, self.unpinned, parts)
        return replace(self, key=key)


def check_inputs(params: Params, lock: str | Path = LOCK_FILE, allow_unpinned: bool = False) -> CheckedInputs:
    """The run's data and base against their pins (every one pinned unless `allow_unpinned`), the data opened
    and holding a row, and the base one its family trains from: one of `REFUSED_INPUTS` otherwise."""
    config = params.retrain
    checked = check_pins({"data": config.data, "base": config.base}, lock, require=not allow_unpinned)
    if next(iter_tables(config.data, 1), None) is None:
        raise BadSource(f"{config.data}: no rows; give a data set with decision rows (docs/data-format.md)")
    resolve_training(config.base, params.train)
    return checked


def start_run(
    params_file: str,
    run_config: str | None,
    lock: str | Path = LOCK_FILE,
    allow_unpinned: bool = False,
    owner: str | None = None,
) -> RunStart:
    """Check the tracking store (a store that is down fails the run now, not after training), load the params,
    check the inputs once, and key and tag the run."""
    check_tracking_store(tracking_uri())
    params = load_params(params_file, run_config)
    config = params.retrain
    checked = check_inputs(params, lock, allow_unpinned)
    data_md5, base_md5, code = data_revision(config.data), current_md5(Path(config.base)), code_digest()
    lineage = {
        "data_md5": data_md5,
        "base_md5": base_md5,
        "code_digest": code,
        "git_commit": git_commit() or "none",
    }
    optional = ({"owner": owner} if owner else {}) | ({UNPINNED_TAG: "true"} if allow_unpinned else {})
    return RunStart(
        params=params,
        checked=checked,
        data_md5=data_md5,
        base_md5=base_md5,
        code=code,
        unpinned=allow_unpinned,
        key=_key(params, data_md5, base_md5, code, allow_unpinned),
        tags=lineage | {"data": config.data, "base": config.base} | checked.tags() | optional,
    )


def _key(
    params: Params,
    data_md5: str,
    base_md5: str,
    code: str,
    unpinned: bool,
    parts: dict[str, Any] | None = None,
) -> str:
    return idempotency_key(
        data_md5, base_md5, keyed_sections(params) | (parts or {}), code, unpinned=unpinned
    )


def revision_of(start: RunStart) -> DataRevision:
    """The run's data revision against the model's last version, with what else changed since (one registry
    query): what a retrain says first."""
    config = start.params.retrain
    found = registry_lineage(config.model_name, start.key)
    now = {name: str(value) for name, value in flat_params(start.params.sections()).items()}
    now |= {tag: str(start.tags[tag]) for tag in TAGGED_SETTINGS if start.tags.get(tag)}
    return DataRevision(
        source=config.data,
        revision=start.data_md5,
        previous_version=found.previous,
        previous_revision=found.previous_revision,
        rerun_of=found.rerun_of,
        changes=settings_changed(found.previous_settings, now) if found.previous else (),
    )


def unchanged_since_champion(start: RunStart, run_config: str | None) -> str | None:
    """The one-line reason to skip a run whose data revision the champion was trained on (nothing new to
    learn), else None; the harvest command it names is the run's, ready to paste."""
    name, data = start.params.retrain.model_name, start.params.retrain.data
    champion = alias_data_revision(name, CHAMPION)
    if champion is None or champion[1] != start.data_md5:
        return None
    harvest = "decision harvest" + (f" --run-config {run_config}" if run_config else "")
    return (
        f"skipped: no new rows in {data} since champion {name} version {champion[0]} (data revision "
        f"{start.data_md5[:8]}); harvest labelled decisions ({harvest}) to give it something to learn"
    )
