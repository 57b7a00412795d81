"""The harvest stage: labelled served decisions become a new, pinned revision of a data set.

Feedback is joined to the inference log (`flywheel.harvest.labelled_rows`), the rows are validated with the
training contract (unusable ones counted by reason and left out), and the usable ones become one new shard of
the data set (a folder of Parquet or JSONL shards). The folder is then pinned again (`dvc add`), and where the
project is a git repository the new pin is committed, so the revision a retrain reads names these rows. The
held-out rule (content hash and ledger, `data.split`) decides which new rows are held out; the result counts
them, and the rows it holds out are added to the data set's ledger (`split.ledger_path`), committed with the
pin: rows held out before stay held out, and so do these, however the data grows.

    harvest("inference", "data/tickets", params.validate)   # -> HarvestResult(rows=180, revision=...)
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.config import ValidateConfig
from pipeline.data.pins import data_revision, dvc_root
from pipeline.data.sources import open_source
from pipeline.data.split import SplitData, TrainSource, ledger_path, record_heldout
from pipeline.data.validate import validate_rows
from pipeline.flywheel.harvest import (
    HarvestRefused,
    harvest_lock,
    harvest_target,
    harvested_gold,
    labelled_rows,
    write_shard,
)
from pipeline.flywheel.table import open_store
from pipeline.stages.snapshot import pin_folder


@dataclass(frozen=True)
class HarvestResult:
    dataset: str
    rows: int
    """New decision rows written (0: nothing new, and no new revision)."""
    labels: int
    """Labelled decisions (questions) in them."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Unusable labelled decisions left out, by reason code."""
    already_harvested: int = 0
    not_logged: int = 0
    other_models: dict[str, int] = field(default_factory=dict)
    """Labelled decisions of other models left out, by model name (another run's traffic in a shared log)."""
    late_labels: int = 0
    """Labels given after their decision was harvested: in no row (a decision is harvested once)."""
    heldout: int = 0
    """New rows the held-out rule holds out (scored by the gate, never trained on)."""
    shard: str | None = None
    revision: str | None = None
    previous_revision: str | None = None
    pinned_by: str | None = None
    committed: str | None = None
    first_decision: str | None = None
    last_decision: str | None = None
    models: tuple[str, ...] = ()
    decision_ids: tuple[str, ...] = ()
    ledger: str | None = None
    """The data set's held-out ledger, where the held-out rows were added."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "decision_ids"} | {"models": list(self.models)}

    def line(self) -> str:
        if not self.rows:
            said = (
                f"harvest: nothing new for {self.dataset} ({self.already_harvested} labelled decisions "
                "already harvested); its revision is unchanged"
            )
        else:
            said = (
                f"harvest: {self.rows} {'row' if self.rows == 1 else 'rows'} ({self.labels} labels, "
                f"{self.heldout} held out) from {', '.join(self.models)} into {self.shard}; {self.dataset} "
                f"revision {(self.previous_revision or '-')[:8]} -> {(self.revision or '-')[:8]}"
            )
        return "\n".join([said, *self.notes()])

    def notes(self) -> list[str]:
        """What was left out and why, a line each (none when nothing was)."""
        notes = []
        if self.other_models:
            shown = ", ".join(f"{name} ({n})" for name, n in sorted(self.other_models.items()))
            notes.append(
                f"left out: labelled decisions of other models: {shown} (the log is shared; --model names "
                "whose to harvest)"
            )
        if self.late_labels:
            notes.append(
                f"left out: {self.late_labels} label(s) given after their decision was harvested (a "
                "decision is harvested once; its row keeps the labels it had then)"
            )
        if self.not_logged:
            notes.append(f"left out: {self.not_logged} labelled decision(s) not in this inference log")
        return notes


def harvest(
    inference: str,
    dataset: str | Path,
    split_config: ValidateConfig,
    commit: bool = True,
    wait: bool = True,
    model: str | None = None,
) -> HarvestResult:
    """Harvest the labelled decisions `model` made (a name or NAME/VERSION; None: any model's) in the
    inference log at `inference` into the data set at `dataset`."""
    check_target(dataset, split_config)
    folder = Path(dataset)
    with harvest_lock(folder, wait):
        source = open_source(folder)
        fmt = harvest_target(source)
        previous = data_revision(source)
        labelled = labelled_rows(open_store(inference), harvested_gold(source), model)
        checked = validate_rows(labelled.rows)
        usable = [labelled.rows[r.row] for r in checked.records]
        base = HarvestResult(
            dataset=str(dataset),
            rows=0,
            labels=0,
            skipped=dict(checked.report.skipped),
            already_harvested=labelled.already_harvested,
            not_logged=labelled.not_logged,
            other_models=labelled.other_models,
            late_labels=labelled.late_labels,
            previous_revision=previous,
        )
        if not usable:
            return base
        like = source.schema() if fmt == "parquet" else None
        shard = write_shard(folder, fmt, usable, like)
        revision, pinned_by = pin_folder(folder)
        ledger = ledger_path(folder, split_config)
        heldout = _record_held_out(
            TrainSource(str(folder), split_config=split_config).validated(), ledger, checked.records
        )
    message = f"harvest: {len(usable)} labelled decisions into {folder}"
    committed = _git_commit(folder, pinned_by, ledger, message) if commit else None
    times = sorted(row["decided_at"] for row in usable)
    return replace(
        base,
        rows=len(usable),
        labels=sum(len(r.decisions) for r in checked.records),
        heldout=heldout,
        shard=str(shard),
        revision=revision or data_revision(folder),
        pinned_by=pinned_by,
        committed=committed,
        first_decision=times[0],
        last_decision=times[-1],
        models=tuple(sorted({r["decided_by"] for r in usable})),
        decision_ids=tuple(row["decision_id"] for row in usable),
        ledger=None if ledger is None else str(ledger),
    )


def check_target(dataset: str | Path, split_config: ValidateConfig) -> None:
    """HarvestRefused, before anything is read or locked, where harvested rows cannot go into `dataset`: a run
    that maps a plain table, no such folder, or a data set that is not a folder of shards."""
    if split_config.mapping is not None:
        raise HarvestRefused(
            f"{dataset}: the run maps a plain table to decisions (validate.mapping), and harvested rows are "
            "decision rows; make the run's data decision rows once: decision map --run-config NAME --write "
            "data/own/NAME-rows/part-0.parquet, then decision init --data data/own/NAME-rows --name NAME"
        )
    if not Path(dataset).exists():  # the lock is made beside it
        raise HarvestRefused(
            f"{dataset}: no such folder; harvested rows go into an existing folder of Parquet or "
            "JSONL shards (the run config's retrain.data, or --dataset)"
        )
    harvest_target(open_source(Path(dataset)))


def _record_held_out(split: SplitData, ledger: Path | None, new_records) -> int:
    """The split's held-out rows added to the data set's `ledger`; how many of them are new rows."""
    if ledger is not None:
        record_heldout(split.split, ledger)
    heldout = {record.content_hash() for record in split.split.heldout}
    return sum(record.content_hash() in heldout for record in new_records)


def _git_commit(folder: Path, pin: str | None, ledger: Path | None, message: str) -> str | None:
    """Commit the data set's new pin (its .dvc file and the .gitignore DVC keeps) with its held-out ledger
    (left out where git ignores it), where git tracks the project."""
    if pin is None:
        return None
    root = _git_root(folder)
    if root is None:
        return None
    project = dvc_root(folder)
    paths = [str(project / pin), str(project / Path(pin).parent / ".gitignore")]
    paths += [str(ledger.resolve())] if ledger is not None and not _ignored(ledger, root) else []
    paths = [p for p in paths if Path(p).exists()]
    subprocess.run(["git", "add", "--", *paths], cwd=root, check=True, capture_output=True)
    done = subprocess.run(
        ["git", "commit", "-q", "-m", message, "--", *paths], cwd=root, capture_output=True, text=True
    )
    if done.returncode != 0:
        return None  # nothing to commit, or no git identity: the pin is on disk either way
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()


def _ignored(path: Path, root: Path) -> bool:
    done = subprocess.run(
        ["git", "check-ignore", "-q", "--", str(path.resolve())], cwd=root, capture_output=True
    )
    return done.returncode == 0


def _git_root(folder: Path) -> Path | None:
    done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=folder, capture_output=True, text=True)
    return Path(done.stdout.strip()) if done.returncode == 0 else None
