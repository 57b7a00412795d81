"""One typed result of a training run, whichever door started it: `decision finetune`, the retrain flow, a
sweep's trial.

The validate, train and calibrate stages' own results side by side (never copied field by field), the export,
and what a flow adds: the run's identity in MLflow (`Tracked`) and, once registered, smoke-tested and gated,
its `Release`. Built by keyword; MLflow tracking logs it (`stages.track`), `--json` prints `to_dict()`, and
the run folder keeps it (`RunFolder.result`) for a later process to read back.

    result = finetune(source, base, out, config)
    result.heldout["calibrated"]["accuracy"], result.calibration.temperatures, result.export_dir
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeline.lineage import DataRevision
from pipeline.stages.calibrate import CalibrationResult
from pipeline.stages.promote import GateResult
from pipeline.stages.smoke import SmokeResult
from pipeline.stages.validate import ValidateResult
from pipeline.training.fit import TrainRun


@dataclass(frozen=True)
class Tracked:
    """A run as MLflow and the registry know it: its idempotency key, name, params and tags, the data it read,
    and that data's revision against the model's previous version."""

    key: str
    params: dict[str, dict[str, Any]]
    """params.yaml's sections as the run resolved them (logged as `section.name`)."""
    data: str
    data_md5: str
    tags: dict[str, str] = field(default_factory=dict)
    run_name: str | None = None
    mlflow_run_id: str | None = None
    revision: DataRevision | None = None
    """Which revision of its data the run used, against the model's last version (the retrain flow's first
    line)."""

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Tracked:
        revision = values.get("revision")
        return cls(**(values | {"revision": DataRevision.from_dict(revision) if revision else None}))


@dataclass(frozen=True)
class Release:
    """A registered version's way through the smoke test and the promotion gate."""

    model: str
    version: str
    smoke: SmokeResult
    gate: GateResult

    @property
    def promoted(self) -> bool:
        return self.gate.promote

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "smoke": self.smoke.to_dict(),
            "gate": self.gate.to_dict(),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Release:
        smoke = {k: v for k, v in values["smoke"].items() if k != "passed"}  # `passed` is derived
        return cls(
            model=values["model"],
            version=values["version"],
            smoke=SmokeResult(**smoke),
            gate=GateResult(**values["gate"]),
        )


@dataclass(frozen=True)
class RunResult:
    """What one training run produced, and, from a flow, how it was tracked and released."""

    run_dir: str
    validation: ValidateResult
    train: TrainRun
    calibration: CalibrationResult | None = None
    """None when the run was cancelled before calibration."""
    export_dir: str | None = None
    """None when the run was cancelled, or is a sweep trial not (yet) exported."""
    tracked: Tracked | None = None
    """None outside a flow (`decision finetune`)."""
    release: Release | None = None
    """None until the version is registered, smoke-tested and gated (the retrain flow, a sweep's best
    trial)."""

    @property
    def cancelled(self) -> bool:
        return self.train.cancelled or self.calibration is None

    @property
    def heldout(self) -> dict[str, Any]:
        """The held-out figures: base, fine-tune, calibrated and the bag of words where scored (the train
        stage's base and fine-tune where the run stopped before calibration)."""
        return self.calibration.heldout if self.calibration is not None else self.train.heldout

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "validation": self.validation.to_dict(),
            "train": self.train.to_dict(),
            "calibration": self.calibration and self.calibration.to_dict(),
            "export_dir": self.export_dir,
            "tracked": self.tracked and asdict(self.tracked),
            "release": self.release and self.release.to_dict(),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunResult:
        """A result as `to_dict` wrote it (JSON from a flow's process, or a run folder's `result.json`)."""
        parts = {
            "validation": ValidateResult.from_dict,
            "train": TrainRun.from_dict,
            "calibration": lambda d: CalibrationResult(**d),
            "tracked": Tracked.from_dict,
            "release": Release.from_dict,
        }
        built = {f.name: values.get(f.name) for f in fields(cls)}
        return cls(**{k: parts[k](v) if k in parts and v is not None else v for k, v in built.items()})

    def saved(self, path: str | Path) -> RunResult:
        """This result, written to `path` beside, then renamed (a reader never finds half a result)."""
        target = Path(path)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, encoding="utf-8") as tmp:
            json.dump(self.to_dict(), tmp, indent=2, default=str)
        os.replace(tmp.name, target)
        return self

    @classmethod
    def load(cls, path: str | Path) -> RunResult:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class RunSkipped:
    """A retrain that did not run: `only_new_data` found the champion trained on this data revision
    already."""

    skip_reason: str
    model: str
    data_md5: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
