"""The calibrate stage: the calibrator chosen by cross-fitted NLL from the run's held-out logits, the figures
before and after (the calibrated ones cross-fitted), the calibration report, the trained model's calibrated
answers for the smoke test to compare serving with, and the plots. Family-free: it reads logits only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.rundir import RunFolder
from pipeline.scoring.calibration import plain_probabilities
from pipeline.scoring.calibrators import choose_calibrator
from pipeline.scoring.heldout import HeldOut, load_heldout, save_expected
from pipeline.scoring.metrics import detailed_metrics
from pipeline.scoring.plots import reliability_by_type, reliability_diagram, write_plots
from pipeline.scoring.report import calibration_report, report_table


def calibrate_stage(run_dir: str | Path, soft: bool = False) -> dict[str, Any]:
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
    result = {
        "temperatures": calibrator.by_name(), "notes": calibrator.notes,
        "calibrator": {"kind": calibrator.kind, "cross_fitted_nll": choice.nll},
        "heldout": {
            "decisions": len(held.items),
            "base": detailed_metrics(held.items, plain_probabilities(held.base_logits)),
            "tuned": detailed_metrics(held.items, plain_probabilities(held.tuned_logits)),
            "calibrated": detailed_metrics(held.items, choice.cross_fitted),
        },
        "report": {"overall": report["overall"], "by_type": report["by_type"]},
        "plots": _write_plots(held, calibrator.kind, served, choice.cross_fitted, run.plots),
    }  # fmt: skip
    run.calibration.write_text(json.dumps(result, indent=2))
    return result


def _write_plots(held: HeldOut, kind: str, served, cross_fitted, folder: Path) -> list[str]:
    tuned = plain_probabilities(held.tuned_logits)
    before = reliability_diagram(held.items, tuned, folder / "reliability_before.png", "fine-tune, T = 1")
    by_type = reliability_by_type(held.items, cross_fitted, folder / "reliability_by_type.png", "calibrated")
    after = write_plots(held.items, served, held.options, folder, "reliability_after.png",
                        f"calibrated ({kind})")  # fmt: skip
    return [str(p) for p in [before, by_type, *after]]
