"""The calibrate stage: temperatures per question type from the run's held-out logits, figures before and after
(the calibrated ones cross-fitted), reliability and confusion plots. Family-free: it reads logits only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.rundir import RunFolder
from pipeline.scoring.calibration import (
    Calibration,
    apply_temperatures,
    fit_calibration,
    heldout_figures,
    plain_probabilities,
)
from pipeline.scoring.heldout import HeldOut, load_heldout
from pipeline.scoring.plots import reliability_diagram, write_plots


def calibrate_stage(run_dir: str | Path, soft: bool = False) -> dict[str, Any]:
    """Temperatures from `heldout.npz`, written to `calibration.json` with the figures; plots under `plots/`."""
    run = RunFolder(run_dir)
    held = load_heldout(run.heldout)
    calibration = fit_calibration(held.items, held.tuned_logits, soft)
    result = {
        "temperatures": calibration.by_name(), "notes": calibration.notes,
        "heldout": heldout_figures(held.items, held.base_logits, held.tuned_logits, soft),
        "plots": _write_plots(held, calibration, run.plots),
    }  # fmt: skip
    run.calibration.write_text(json.dumps(result, indent=2))
    return result


def _write_plots(held: HeldOut, calibration: Calibration, folder: Path) -> list[str]:
    tuned = plain_probabilities(held.tuned_logits)
    calibrated = apply_temperatures(held.items, held.tuned_logits, calibration.temperatures)
    before = reliability_diagram(held.items, tuned, folder / "reliability_before.png", "fine-tune, T = 1")
    after = write_plots(held.items, calibrated, held.options, folder, "reliability_after.png", "calibrated")
    return [str(p) for p in [before, *after]]
