"""The files a retraining run writes under `runs/<key>/`, named in one place (every stage reads them from
here).

run = RunFolder("runs/3f2a...")
run.train_summary, run.checkpoint, run.finetune, run.heldout, run.calibration, run.calibrator, run.expected_answers,
run.result, run.plots, run.export
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.locking import held_exclusively


class RunBusy(RuntimeError):
    """Another process is running this run or sweep (the same data, base, params and code) now."""


@dataclass(frozen=True)
class RunFolder:
    """One run's folder and the name of everything in it."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @contextmanager
    def driven(self, what: str = "run") -> Iterator[None]:
        """This process alone drives the run (or a sweep: `what`) while it holds this (released if it dies);
        RunBusy at once where another does: two runs of one key shared its checkpoint and MLflow run, and the
        second crashed reading a checkpoint the first was writing; two sweeps rewrote each other's split."""
        lock = self.root / f"{what}.lock"
        busy = RunBusy(
            f"another process is running this {what} ({lock} is locked): the same data, base, params and "
            f"code; wait for it, or stop it and run the {what} again to resume"
        )
        with held_exclusively(lock, lambda: busy):
            yield

    @property
    def validation(self) -> Path:
        """The validation report of the run's data."""
        return self.root / "validation.json"

    @property
    def split(self) -> Path:
        """The validated rows split into training and held-out (`data.split.SplitData`): validated once, read
        by training, the smoke test and the gate."""
        return self.root / "split.pkl"

    @property
    def train_summary(self) -> Path:
        """The training run: counts, timings, the logged steps."""
        return self.root / "train.json"

    @property
    def checkpoint(self) -> Path:
        """The training state at the last checkpoint (`training.checkpoint`): a killed run resumes from it.
        Kept after training, so a rerun whose train task did not finish resumes at the end instead of
        retraining; it holds the trainable weights with their optimizer moments and may be deleted once the
        run is done."""
        return self.root / "checkpoint.pt"

    @property
    def ranks(self) -> Path:
        """A data-parallel run's spec for its ranks and rank 0's result (`stages.train_ranks`)."""
        return self.root / "ranks"

    @property
    def finetune(self) -> Path:
        """The trained model as its family saves it before calibration (not yet an export)."""
        return self.root / "finetune"

    @property
    def heldout(self) -> Path:
        """Held-out decisions with the base's and the fine-tune's raw logits."""
        return self.root / "heldout.npz"

    @property
    def validation_logits(self) -> Path:
        """The validation split's decisions with the fine-tune's raw logits: what the calibrator is fitted
        on."""
        return self.root / "validation.npz"

    @property
    def out_of_fold(self) -> Path:
        """The training rows' decisions with raw logits from fold models that never trained on them
        (`training.out_of_fold`), where the validation split is small: fitted on with it."""
        return self.root / "out_of_fold.npz"

    @property
    def calibration(self) -> Path:
        """Temperatures, notes and the before/after held-out figures."""
        return self.root / "calibration.json"

    @property
    def calibrator(self) -> Path:
        """The chosen calibrator (`pipeline.scoring.calibrators`), as the export carries it."""
        return self.root / "calibrator.json"

    @property
    def expected_answers(self) -> Path:
        """Every held-out decision's calibrated probabilities from the trained model: what serving must
        reproduce."""
        return self.root / "expected_answers.npz"

    @property
    def calibration_report(self) -> Path:
        """The calibration report (JSON; a markdown table beside it)."""
        return self.root / "calibration_report.json"

    @property
    def certificates(self) -> Path:
        """Per question, the automation rule certified on the validation split (`scoring.certify`), as the export
        carries it."""
        return self.root / "certificates.json"

    @property
    def novelty(self) -> Path:
        """The novelty gate (`scoring.novelty`): training state vectors and the distance beyond which a state is
        novel and never automated, as the export carries it."""
        return self.root / "novelty.npz"

    @property
    def result(self) -> Path:
        """The run's typed result (`stages.result.RunResult`): what a later process reads the run back
        from."""
        return self.root / "result.json"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def export(self) -> Path:
        """The merged, calibrated, servable model."""
        return self.root / "export"
