"""The held-out split: whole rows, chosen by a stable hash of each row's content (or of its group).

A row's place in the hash order depends on its content only, so reordering the file never moves it. Rows that
share a `group` (`Record.group`: a user, a document, a source) take one place, their group's, and go to one side
together, so a model is measured on groups it never saw; a ledger entry for any of them holds out all of them.
Rows are candidates when their hash falls below `holdout_fraction`; candidates are taken in hash order up to
`holdout_max_decisions` decisions. Without a memory, a new row that hashes low would push a held-out row into
training once the cap binds; so with `holdout_ledger` (params.yaml ships one), the rows it lists stay held out
whatever the budget, new candidates fill only what budget is left, and `record_heldout` adds them to it.

The validation split is carved from the training side the same way, from the other end of the hash order (the
rows that hash highest, up to `validation_fraction` and `validation_max_decisions`): never trained on, it is
what the calibrator is fitted on, so nothing fitted ever reads a held-out label. No ledger is needed: a row
that hashes that high is never a held-out candidate, so growth moves rows between training and validation only.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import ValidateConfig
from pipeline.data.contract import Record
from pipeline.data.mapping import load_mapping
from pipeline.data.read import RowSlice
from pipeline.data.shards import BadSource
from pipeline.data.validate import ValidationReport, validate_file


@dataclass(frozen=True)
class Split:
    """Training, held-out and validation records, each in file order."""

    train: list[Record]
    heldout: list[Record]
    validation: list[Record] = field(default_factory=list)
    """Carved from the training rows and not trained on (`carve_validation`): what calibration fits on."""

    def every_record(self) -> list[Record]:
        """Training, validation and held-out records together."""
        return self.train + self.validation + self.heldout

    def summary(self) -> dict[str, int]:
        """Row and decision counts on each side, and group counts where the rows have groups."""
        counts = {
            "train_rows": len(self.train),
            "train_decisions": _decisions(self.train),
            "heldout_rows": len(self.heldout),
            "heldout_decisions": _decisions(self.heldout),
            "validation_rows": len(self.validation),
            "validation_decisions": _decisions(self.validation),
        }
        if any(r.group is not None for r in self.every_record()):
            sides = {"train": self.train, "heldout": self.heldout, "validation": self.validation}
            counts |= {f"{side}_groups": len({r.group for r in rows if r.group is not None})
                       for side, rows in sides.items()}  # fmt: skip
        return counts


def _decisions(records: list[Record]) -> int:
    return sum(len(r.decisions) for r in records)


def hash_position(digest: str) -> float:
    """A row's content hash (`Record.content_hash`) as a number in [0, 1)."""
    return int(digest[:16], 16) / 2**64


def read_ledger(path: str | Path | None) -> frozenset[str]:
    """The content hashes a ledger lists (none when there is no ledger, or no file yet)."""
    if path is None or not Path(path).exists():
        return frozenset()
    return frozenset(
        line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
    )


def record_heldout(split: Split, path: str | Path) -> int:
    """Add the split's held-out rows to the ledger at `path` (written whole, then renamed); how many are new."""
    before = read_ledger(path)
    after = before | {r.content_hash() for r in split.heldout}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, encoding="utf-8") as tmp:
        tmp.write("".join(f"{digest}\n" for digest in sorted(after)))
    os.replace(tmp.name, target)
    return len(after) - len(before)


def split_holdout(records: list[Record], config: ValidateConfig) -> Split:
    """Split records into train and held-out sets (see the module docstring for the rule)."""
    ledger = read_ledger(config.holdout_ledger)
    digests = {id(r): r.content_hash() for r in records}  # hashed once: the ledger and the order both read it
    units = _units(records)
    positions = [_position(unit, lambda r: digests[id(r)]) for unit in units]
    ranked = sorted(range(len(units)), key=positions.__getitem__)
    # Candidates are fixed by their own hash, so a row keeps its side as rows are added until the cap binds (a
    # budget that grew with the data would let new low-hashing rows push held-out rows into training).
    budget = config.holdout_max_decisions
    chosen = {i for i, unit in enumerate(units) if any(digests[id(r)] in ledger for r in unit)}
    used = sum(_decisions(units[i]) for i in chosen)
    for i in ranked:
        if i in chosen:
            continue
        if positions[i] >= config.holdout_fraction or used + _decisions(units[i]) > budget:
            break
        chosen.add(i)
        used += _decisions(units[i])
    if not chosen and len(units) >= 2:
        chosen.add(ranked[0])  # a tiny set still gets one row (or group) to evaluate on
    if len(chosen) == len(units) and units:
        chosen.discard(ranked[-1])  # never hold out the last training row
    held = {id(r) for i in chosen for r in units[i]}
    return carve_validation(
        Split([r for r in records if id(r) not in held], [r for r in records if id(r) in held]), config
    )


def carve_validation(split: Split, config: ValidateConfig) -> Split:
    """`split` with its validation split carved from the training rows (or groups) that hash highest (module
    docstring): up to `validation_fraction` of the training decisions and `validation_max_decisions`; none when
    that is fewer than `validation_min_decisions`, or would leave no training row."""
    train = split.train
    budget = min(config.validation_max_decisions, config.validation_fraction * _decisions(train))
    if budget < config.validation_min_decisions:
        return split
    units = _units(train)
    chosen, used = set(), 0
    for unit in sorted(units, key=lambda u: -_position(u)):
        if used + _decisions(unit) > budget:
            break
        chosen.update(id(r) for r in unit)
        used += _decisions(unit)
    if used < config.validation_min_decisions or len(chosen) == len(train):
        return split
    return Split(
        [r for r in train if id(r) not in chosen], split.heldout, [r for r in train if id(r) in chosen]
    )


def _units(records: list[Record]) -> list[list[Record]]:
    """What goes to one side whole: each group's rows (`Record.group`), and each row without a group alone."""
    groups: dict[str, list[Record]] = {}
    units: list[list[Record]] = []
    for record in records:
        if record.group is None:
            units.append([record])
        elif record.group in groups:
            groups[record.group].append(record)
        else:
            groups[record.group] = [record]
            units.append(groups[record.group])
    return units


def _position(unit: list[Record], digest: Callable[[Record], str] = Record.content_hash) -> float:
    """Where a unit falls in the hash order: a row alone by its content hash (`digest`; so data without groups
    splits as it always did), a group by the hash of its key, whatever its rows hold."""
    group = unit[0].group
    if group is None:
        return hash_position(digest(unit[0]))
    return hash_position(hashlib.blake2b(group.encode(), digest_size=16, person=b"group").hexdigest())


@dataclass(frozen=True)
class TrainSource:
    """Where a run's decisions come from and how they split: rows START:END of a file, split by `split_config`,
    or all of them for training with `eval_data` held out instead."""

    data: str | Path
    row_slice: RowSlice = field(default_factory=RowSlice)
    eval_data: str | Path | None = None
    split_config: ValidateConfig = field(default_factory=ValidateConfig)

    def validated(self, report: Callable[[str], None] | None = None) -> SplitData:
        """Validate the rows (and `eval_data`) and split them: once per run; later steps read the result.

        With `split_config.mapping` both files are plain tables mapped to decision rows, `eval_data` with the
        options fixed on `data` (so both ask the same questions). `report` hears of each file's reading and
        checking where they run past 2 s (`validate_file`)."""
        mapping = load_mapping(self.split_config.mapping) if self.split_config.mapping is not None else None
        validated = validate_file(self.data, self.row_slice, mapping=mapping, report=report)
        refuse_unusable(self.data, validated.report)
        if self.eval_data is not None:
            held = validate_file(self.eval_data, mapping=validated.mapping, report=report)
            refuse_unusable(self.eval_data, held.report)
            split = carve_validation(Split(validated.records, held.records), self.split_config)
        else:
            split = split_holdout(validated.records, self.split_config)
        return SplitData(validated.report, split)


def refuse_unusable(source: str | Path, report: ValidationReport) -> None:
    """BadSource naming `source` and the reasons when none of its decisions is usable: nothing to train on or
    score, so nothing is loaded, trained or written for it."""
    if report.kept == 0:
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in report.skipped.items() if n) or "no rows"
        raise BadSource(f"{source}: no usable decision ({report.decisions:,} decisions; skipped: {reasons}); "
                        f"`decision validate {source}` shows an example of each reason")  # fmt: skip


@dataclass(frozen=True)
class SplitData:
    """A run's validated rows split in two, with the report that accounts for the rest.

    Validation and the split run once per run (`TrainSource.validated`, the flow's validate stage); training,
    the smoke test and the promotion gate read this (`RunFolder.split`) instead of validating again.
    """

    report: ValidationReport
    split: Split

    def save(self, path: str | Path) -> Path:
        """Write beside, then rename: a kill never leaves half a file where a later stage reads."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=target.parent, delete=False) as tmp:
            pickle.dump(self, tmp, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp.name, target)
        return target

    @staticmethod
    def load(path: str | Path) -> SplitData:
        """What `save` wrote (a file of this run's own: pickle is safe to read here, never for foreign files)."""
        with open(path, "rb") as handle:
            loaded = pickle.load(handle)
        if not isinstance(loaded, SplitData):
            raise TypeError(f"{path}: not a saved split")
        return loaded
