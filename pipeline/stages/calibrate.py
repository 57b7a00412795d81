"""The calibrate stage: the calibrator chosen by cross-fitted NLL from the run's held-out logits, the figures
before and after (the calibrated ones cross-fitted), the calibration report, the trained model's calibrated
answers for the smoke test to compare serving with, and the plots. Family-free: it reads logits only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.rundir import RunFolder
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.calibrators import choose_calibrator
from pipeline.scoring.heldout import HeldOut, load_heldout, save_expected
from pipeline.scoring.metrics import detailed_metrics
from pipeline.scoring.plots import reliability_by_type, reliability_diagram, write_plots
from pipeline.scoring.report import calibration_report, report_table


@dataclass(frozen=True)
class CalibrationResult:
    """What the calibrate stage chose and measured (`calibration.json`)."""

    temperatures: dict[str, float]
    """Each question type's temperature, by type name."""
    notes: dict[str, str]
    """Why a type kept T = 1 (too few decisions, no gain), by type."""
    calibrator: dict[str, Any]
    """The chosen calibrator's kind and its cross-fitted NLL."""
    heldout: dict[str, Any]
    """The held-out figures of the base and the fine-tune at T = 1 and of the calibrated fine-tune (cross-fitted)."""
    report: dict[str, Any]
    """The calibration report's overall and per-type figures."""
    plots: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibrate_stage(run_dir: str | Path, soft: bool = False) -> CalibrationResult:
    """Calibrator, figures and report from `heldout.npz` into the run folder; plots under `plots/`."""
    run = RunFolder(run_dir)
    held = load_heldout(run.heldout)
    choice = choose_calibrator(held.items, held.tuned_logits, soft)
    calibrator = choice.calibrator
    run.calibrator.write_text(json.dumps(calibrator.to_json(), indent=2))
    served = calibrator.apply(held.items, held.tuned_logits)  # in-sample: what the export will answer
    save_expected(run.expected_answers, held.items, served)
    report = calibration_report(held.items, choice.cross_fitted)
    run.calibration_report.write_text(json.dumps(report, indent=2))
    run.calibration_report.with_suffix(".md").write_text(report_table(report) + "\n")
    result = CalibrationResult(
        temperatures=calibrator.by_name(), notes=dict(calibrator.notes),
        calibrator={"kind": calibrator.kind, "cross_fitted_nll": choice.nll},
        heldout={
            "decisions": len(held.items),
            "base": detailed_metrics(held.items, plain_probabilities(held.base_logits)),
            "tuned": detailed_metrics(held.items, plain_probabilities(held.tuned_logits)),
            "calibrated": detailed_metrics(held.items, choice.cross_fitted),
        },
        report={"overall": report["overall"], "by_type": report["by_type"]},
        plots=_write_plots(held, calibrator.kind, served, choice.cross_fitted, run.plots),
    )  # fmt: skip
    run.calibration.write_text(json.dumps(result.to_dict(), indent=2))
    return result


def _write_plots(held: HeldOut, kind: str, served, cross_fitted, folder: Path) -> list[str]:
    tuned = plain_probabilities(held.tuned_logits)
    before = reliability_diagram(held.items, tuned, folder / "reliability_before.png", "fine-tune, T = 1")
    by_type = reliability_by_type(held.items, cross_fitted, folder / "reliability_by_type.png", "calibrated")
    after = write_plots(held.items, served, held.options, folder, "reliability_after.png",
                        f"calibrated ({kind})")  # fmt: skip
    return [str(p) for p in [before, by_type, *after]]
