"""The held-out split: whole rows, chosen by a stable hash of each row's content (or of its group).

A row's place in the hash order depends on its content only, so reordering the file never moves it. Rows that
share a `group` (`Record.group`: a user, a document, a source) take one place, their group's, and go to one
side together, so a model is measured on groups it never saw; a ledger entry for any of them holds out all of
them. Rows that share a normalised state, or are near-duplicates (`leakage`), are joined to one unit with
their groups (transitively), placed at the lowest of their rows' places: one state asked two ways never lands
on both sides, and a row alone or a group alone falls where it always did. Rows are candidates when their hash
falls below `holdout_fraction`; candidates are taken in hash order up to `holdout_max_decisions` decisions.
Without a memory, a new row that hashes low would push a held-out row into training once the cap binds; so
each data set has a ledger (`ledger_path`: `validate.holdout_ledger`, or `<data>.holdout-ledger.txt` beside
the path DVC pins): the rows it lists stay held out whatever the budget, new candidates fill only what budget
is left, and `record_heldout` adds them to it (the validate stage, `decision init` and `decision harvest` do).

The validation split is carved from the training side the same way, from the other end of the hash order (the
rows that hash highest, up to `validation_fraction` and `validation_max_decisions`): never trained on, it is
what the calibrator is fitted on, so nothing fitted ever reads a held-out label. No ledger is needed: a row
that hashes that high is never a held-out candidate, so growth moves rows between training and validation
only.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pipeline.config import ConfigError, ValidateConfig
from pipeline.data.contract import Record
from pipeline.data.facts import gc_paused
from pipeline.data.leakage import KeptTogether, StateKeys, overlapping, state_fingerprints, state_keys
from pipeline.data.mapping import load_mapping
from pipeline.data.read import RowSlice
from pipeline.data.shards import BadSource
from pipeline.data.sources import pin_path
from pipeline.data.validate import ValidationReport, validate_file


@dataclass(frozen=True)
class Split:
    """Training, held-out and validation records, each in file order."""

    train: list[Record]
    heldout: list[Record]
    validation: list[Record] = field(default_factory=list)
    """Carved from the training rows and not trained on (`carve_validation`): what calibration fits on."""
    kept_together: KeptTogether = field(default_factory=KeptTogether)
    """Rows that share a normalised state, or are near-duplicates, with another row: each kept on one side."""
    eval_overlap_rows: int | None = None
    """With the held-out rows from another file (`--eval-data`): how many share a normalised state with a
    training row; None when the held-out rows were split from the data."""

    def every_record(self) -> list[Record]:
        """Training, validation and held-out records together."""
        return self.train + self.validation + self.heldout

    def summary(self) -> dict[str, int]:
        """Row and decision counts on each side, group counts where the rows have groups, the rows kept on one
        side with another (`kept_together`), and with `--eval-data` the held-out rows that share a training
        row's state."""
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
            counts |= {
                f"{side}_groups": len({r.group for r in rows if r.group is not None})
                for side, rows in sides.items()
            }
        counts |= asdict(self.kept_together)
        if self.eval_overlap_rows is not None:
            counts["eval_overlap_rows"] = self.eval_overlap_rows
        return counts


def _decisions(records: list[Record]) -> int:
    return sum(len(r.decisions) for r in records)


def hash_position(digest: str) -> float:
    """A row's content hash (`Record.content_hash`) as a number in [0, 1)."""
    return int(digest[:16], 16) / 2**64


LEDGER_SUFFIX = ".holdout-ledger.txt"


def ledger_path(data: str | Path, config: ValidateConfig) -> Path | None:
    """The held-out ledger of the data set `data`: `validate.holdout_ledger` where set, else
    `<name>.holdout-ledger.txt` beside the file or folder DVC pins for it (beside the pinned folder a file
    lies in: a ledger inside would change the data revision); None for a Hub id, which nothing pins.
    ConfigError for a set ledger inside that folder."""
    pinned = _pinned_path(data)
    if config.holdout_ledger is None:
        return None if pinned is None else pinned.with_name(pinned.name + LEDGER_SUFFIX)
    ledger = Path(config.holdout_ledger)
    if pinned is not None and pinned.is_dir() and ledger.resolve().is_relative_to(pinned.resolve()):
        raise ConfigError(
            f"validate.holdout_ledger: {ledger} lies inside {pinned}, the data set's folder DVC pins (its "
            "revision would change); put it beside that folder, or null for the default there"
        )
    return ledger


def ledger_under(config: ValidateConfig, root: Path) -> ValidateConfig:
    """`config` with the ledger it sets (a path in params.yaml or a run config) under the project `root`,
    where the data it names lies."""
    if config.holdout_ledger is None:
        return config
    return replace(config, holdout_ledger=str(root / config.holdout_ledger))


def _pinned_path(data: str | Path) -> Path | None:
    """What DVC pins for `data` (`sources.pin_path`), or the folder above it that a `.dvc` file pins (`data`
    is a shard of that folder); None for a Hub id."""
    path = pin_path(data)
    if path is None:
        return None
    path = path if path.name else path.absolute()
    return next((a for a in path.parents if a.name and a.with_name(a.name + ".dvc").is_file()), path)


def read_ledger(path: str | Path | None) -> frozenset[str]:
    """The content hashes a ledger lists (none when there is no ledger, or no file yet)."""
    if path is None or not Path(path).exists():
        return frozenset()
    return frozenset(
        line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
    )


def record_heldout(split: Split, path: str | Path) -> int:
    """Add the split's held-out rows to the ledger at `path` (written whole, then renamed, under a lock: two
    runs adding at once both land); how many are new."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _ledger_lock(target):
        before = read_ledger(target)
        after = before | {r.content_hash() for r in split.heldout}
        if after == before and target.exists():
            return 0
        with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, encoding="utf-8") as tmp:
            tmp.write("".join(f"{digest}\n" for digest in sorted(after)))
        os.chmod(tmp.name, 0o644)  # a file to commit and share, not the temporary file's 0600
        os.replace(tmp.name, target)
    return len(after) - len(before)


@contextmanager
def _ledger_lock(ledger: Path) -> Iterator[None]:
    """The ledger's folder locked (no lock file is left beside the data) while its ledger is read and
    replaced."""
    folder = os.open(ledger.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # closing releases the lock


@gc_paused()  # its keys and units are many small containers, none in a cycle
def split_holdout(
    records: list[Record], config: ValidateConfig, ledger_file: str | Path | None = None
) -> Split:
    """Split records into train and held-out sets (see the module docstring for the rule); the rows the ledger
    at `ledger_file` lists (`ledger_path`; None: no ledger) stay held out."""
    ledger = read_ledger(ledger_file)
    hashed = _Hashed.of(records)  # once: the ledger, the order and both splits' units read them
    units = _units(records, hashed.state)
    positions = [_position(unit, hashed.digest) for unit in units]
    ranked = sorted(range(len(units)), key=positions.__getitem__)
    # Candidates are fixed by their own hash, so a row keeps its side as rows are added until the cap binds (a
    # budget that grew with the data would let new low-hashing rows push held-out rows into training).
    budget = config.holdout_max_decisions
    chosen = {i for i, unit in enumerate(units) if any(hashed.digest(r) in ledger for r in unit)}
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
    sides = Split([r for r in records if id(r) not in held], [r for r in records if id(r) in held])
    return _carved(
        replace(sides, kept_together=KeptTogether.count(list(hashed.keys.values()))), config, hashed
    )


@gc_paused()
def carve_validation(split: Split, config: ValidateConfig) -> Split:
    """`split` with its validation split carved from the training rows (or groups) that hash highest (module
    docstring): up to `validation_fraction` of the training decisions and `validation_max_decisions`; none
    when that is fewer than `validation_min_decisions`, or would leave no training row."""
    return _carved(split, config, _Hashed.of(split.train))


def folds_of_rows(records: list[Record], folds: int) -> list[int]:
    """The fold (0 to `folds` - 1) of each of `records` for out-of-fold answers: rows that would go to one side
    of a split together (a shared group, normalised state or near-duplicate; module docstring) share a fold, and
    the units are dealt in hash order, so the folds are balanced and the same for the same rows."""
    hashed = _Hashed.of(records)
    units = sorted(_units(records, hashed.state), key=lambda unit: _position(unit, hashed.digest))
    fold_by_row = {id(record): i % folds for i, unit in enumerate(units) for record in unit}
    return [fold_by_row[id(record)] for record in records]


@dataclass(frozen=True)
class _Hashed:
    """Each row's content hash and state keys, by the row's id: computed once for both splits."""

    digests: dict[int, str]
    keys: dict[int, StateKeys]

    @staticmethod
    def of(records: list[Record]) -> _Hashed:
        return _Hashed(
            {id(r): r.content_hash() for r in records}, {id(r): state_keys(r.state) for r in records}
        )

    def digest(self, record: Record) -> str:
        return self.digests[id(record)]

    def state(self, record: Record) -> StateKeys:
        return self.keys[id(record)]


def _carved(split: Split, config: ValidateConfig, hashed: _Hashed) -> Split:
    """`carve_validation`, with the training rows' hashes and state keys at hand."""
    train = split.train
    budget = min(config.validation_max_decisions, config.validation_fraction * _decisions(train))
    if budget < config.validation_min_decisions:
        return split
    units = _units(train, hashed.state)
    chosen, used = set(), 0
    for unit in sorted(units, key=lambda u: -_position(u, hashed.digest)):
        if used + _decisions(unit) > budget:
            break
        chosen.update(id(r) for r in unit)
        used += _decisions(unit)
    if used < config.validation_min_decisions or len(chosen) == len(train):
        return split
    kept = [r for r in train if id(r) not in chosen]
    return replace(split, train=kept, validation=[r for r in train if id(r) in chosen])


def _units(records: list[Record], keys: Callable[[Record], StateKeys]) -> list[list[Record]]:
    """What goes to one side whole, in the order of each one's first row: rows joined, directly or through
    others, by a shared group (`Record.group`), normalised state or near-duplicate key (`keys`); each other
    row alone."""
    parent = list(range(len(records)))
    firsts: tuple[dict, dict, dict] = ({}, {}, {})  # each state's, group's and near-duplicate key's first row
    for i, record in enumerate(records):
        key = keys(record)
        for first, link in zip(firsts, (key.state, record.group, key.near), strict=True):
            if link is not None and (j := first.setdefault(link, i)) != i:
                parent[_root(parent, i)] = _root(parent, j)
    units: dict[int, list[Record]] = {}
    for i, record in enumerate(records):
        units.setdefault(i if parent[i] == i else _root(parent, i), []).append(record)
    return list(units.values())


def _root(parent: list[int], i: int) -> int:
    """The union-find root of row i (halving the path on the way)."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _position(unit: list[Record], digest: Callable[[Record], str]) -> float:
    """Where a unit falls in the hash order: the lowest of its rows' places, a row's by its content hash
    (`digest`), a grouped row's by the hash of its group's key, whatever its rows hold. So a row alone, or a
    group alone, falls where it always did."""
    return min(_row_position(record, digest) for record in unit)


def _row_position(record: Record, digest: Callable[[Record], str]) -> float:
    if record.group is None:
        return hash_position(digest(record))
    return hash_position(hashlib.blake2b(record.group.encode(), digest_size=16, person=b"group").hexdigest())


@dataclass(frozen=True)
class TrainSource:
    """Where a run's decisions come from and how they split: rows START:END of a file, split by
    `split_config`, or all of them for training with `eval_data` held out instead."""

    data: str | Path
    row_slice: RowSlice = field(default_factory=RowSlice)
    eval_data: str | Path | None = None
    split_config: ValidateConfig = field(default_factory=ValidateConfig)

    def validated(self, report: Callable[[str], None] | None = None) -> SplitData:
        """Validate the rows (and `eval_data`) and split them, the data set's ledger (`ledger_path`) read:
        once per run; later steps read the result.

        With `split_config.mapping` both files are plain tables mapped to decision rows, `eval_data` with the
        options fixed on `data` (so both ask the same questions). `report` hears of each file's reading and
        checking where they run past 2 s (`validate_file`)."""
        mapping = load_mapping(self.split_config.mapping) if self.split_config.mapping is not None else None
        validated = validate_file(self.data, self.row_slice, mapping=mapping, report=report)
        refuse_unusable(self.data, validated.report)
        if self.eval_data is None:
            ledger = ledger_path(self.data, self.split_config)
            return SplitData(validated.report, split_holdout(validated.records, self.split_config, ledger))
        held = validate_file(self.eval_data, mapping=validated.mapping, report=report)
        refuse_unusable(self.eval_data, held.report)
        return SplitData(validated.report, self._held_apart(validated.records, held.records))

    def _held_apart(self, records: list[Record], held: list[Record]) -> Split:
        """All of `records` for training (less the validation split carved from them), `held` held out, and
        how many of those share a normalised state with a training row."""
        split = carve_validation(Split(records, held), self.split_config)
        trained = state_fingerprints(r.state for r in split.train)
        return replace(split, eval_overlap_rows=overlapping((r.state for r in held), trained))


def refuse_unusable(source: str | Path, report: ValidationReport) -> None:
    """BadSource naming `source` and the reasons when none of its decisions is usable: nothing to train on or
    score, so nothing is loaded, trained or written for it."""
    if report.kept == 0:
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in report.skipped.items() if n) or "no rows"
        raise BadSource(
            f"{source}: no usable decision ({report.decisions:,} decisions; skipped: {reasons}); "
            f"`decision validate {source}` shows an example of each reason"
        )


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

    def question_ids(self) -> set[str]:
        """Every question id the split's usable decisions ask (training, validation and held-out rows)."""
        split = self.split
        rows = (*split.train, *split.validation, *split.heldout)
        return {decision.question.id for row in rows for decision in row.decisions}

    @staticmethod
    def load(path: str | Path) -> SplitData:
        """What `save` wrote (a file of this run's own: pickle is safe to read here, never for foreign
        files)."""
        with open(path, "rb") as handle:
            loaded = pickle.load(handle)
        if not isinstance(loaded, SplitData):
            raise TypeError(f"{path}: not a saved split")
        return loaded
