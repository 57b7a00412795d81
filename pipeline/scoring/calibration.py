"""Temperature calibration: one temperature per question type, fitted on held-out decisions against gold.

The temperature minimises the negative log-likelihood of the gold label (one-hot by default, or the soft gold
distribution) over log T, clamped to [0.5, 5]. A type with fewer than `min_decisions` held-out decisions keeps
T = 1. The before/after figures are cross-fitted: the held-out records are split in two halves, each half is
scored with the temperatures fitted on the other, so no figure is measured on the data that fitted it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.families.laya.items import Item
from pipeline.scoring.metrics import detailed_metrics

TYPE_NAMES = ("choice", "score", "noul")
T_MIN, T_MAX = 0.5, 5.0
MIN_DECISIONS = 10


@dataclass(frozen=True)
class Calibration:
    """Fitted temperatures ([choice, score, noul]) and a note per type on how each was decided."""

    temperatures: tuple[float, float, float]
    notes: dict[str, str] = field(default_factory=dict)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def _nll(log_t: float, logits: list[np.ndarray], targets: list[np.ndarray]) -> float:
    t = math.exp(log_t)
    total = 0.0
    for z, target in zip(logits, targets):
        scaled = np.asarray(z, dtype=np.float64) / t
        log_norm = scaled.max() + math.log(np.exp(scaled - scaled.max()).sum())
        total -= float(np.dot(target, scaled - log_norm))
    return total / max(1, len(logits))


def fit_temperature(
    logits: list[np.ndarray], targets: list[np.ndarray], lo: float = T_MIN, hi: float = T_MAX
) -> float:
    """The temperature in [lo, hi] that minimises the mean NLL (golden-section search over log T)."""
    a, b = math.log(lo), math.log(hi)
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = _nll(c, logits, targets), _nll(d, logits, targets)
    for _ in range(60):  # the bracket shrinks to ~1e-12 of log(10)
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = _nll(c, logits, targets)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = _nll(d, logits, targets)
    return float(min(max(math.exp((a + b) / 2), lo), hi))


def _targets(items: list[Item], soft: bool) -> list[np.ndarray]:
    return [
        np.asarray(it.target, dtype=np.float64) if soft else np.eye(len(it.markers))[it.label] for it in items
    ]


def fit_calibration(items: list[Item], logits: list[np.ndarray], soft: bool = False,
                    min_decisions: int = MIN_DECISIONS) -> Calibration:  # fmt: skip
    """One temperature per question type from held-out items and their raw logits."""
    temperatures, notes = [1.0, 1.0, 1.0], {}
    targets = _targets(items, soft)
    for qtype, name in enumerate(TYPE_NAMES):
        chosen = [i for i, it in enumerate(items) if it.qtype == qtype]
        if len(chosen) < min_decisions:
            notes[name] = f"kept T=1: {len(chosen)} held-out decisions (< {min_decisions})"
            continue
        temperatures[qtype] = fit_temperature([logits[i] for i in chosen], [targets[i] for i in chosen])
        notes[name] = f"fitted on {len(chosen)} held-out decisions"
    return Calibration((temperatures[0], temperatures[1], temperatures[2]), notes)


def apply_temperatures(items: list[Item], logits: list[np.ndarray], temperatures) -> list[np.ndarray]:
    """Probabilities with each item's type temperature applied."""
    return [softmax(z, temperatures[it.qtype]) for it, z in zip(items, logits)]


def cross_fitted_metrics(items: list[Item], logits: list[np.ndarray], soft: bool = False,
                         min_decisions: int = MIN_DECISIONS, fit=None) -> dict[str, float]:  # fmt: skip
    """Held-out metrics after calibration, each half scored with the temperatures fitted on the other half.

    `fit(items, logits)` gives the effective temperature per type ([choice, score, noul]); by default one
    temperature per type (`fit_calibration`), as the encoder family calibrates.
    """
    fit = fit or (lambda its, zs: fit_calibration(its, zs, soft, min_decisions).temperatures)
    halves = [[i for i, it in enumerate(items) if it.record % 2 == side] for side in (0, 1)]
    probabilities: list[np.ndarray | None] = [None] * len(items)
    for fit_on, score_on in ((halves[0], halves[1]), (halves[1], halves[0])):
        temperatures = fit([items[i] for i in fit_on], [logits[i] for i in fit_on])
        for i in score_on:
            probabilities[i] = softmax(logits[i], temperatures[items[i].qtype])
    return detailed_metrics(items, probabilities)


CALIBRATION_FILE, PLOTS_DIR = "calibration.json", "plots"


def calibrate_stage(run_dir: str | Path, soft: bool = False) -> dict[str, Any]:
    """The flow's calibrate stage: temperatures from `run_dir/heldout.npz`, figures before and after, plots.

    Writes `run_dir/calibration.json` (temperatures, notes, base/tuned/calibrated metrics; the calibrated ones
    cross-fitted) and, under `run_dir/plots`, reliability diagrams before and after and a confusion matrix per
    question.
    """
    from pipeline.stages.finetune import HELDOUT_FILE
    from pipeline.scoring.heldout import load_heldout

    run_dir = Path(run_dir)
    held = load_heldout(run_dir / HELDOUT_FILE)
    calibration = fit_calibration(held.items, held.tuned_logits, soft)
    result = {
        "temperatures": dict(zip(TYPE_NAMES, calibration.temperatures)), "notes": calibration.notes,
        "heldout": {"decisions": len(held.items),
                    "base": detailed_metrics(held.items, [softmax(z) for z in held.base_logits]),
                    "tuned": detailed_metrics(held.items, [softmax(z) for z in held.tuned_logits]),
                    "calibrated": cross_fitted_metrics(held.items, held.tuned_logits, soft)},
        "plots": _write_plots(held, calibration, run_dir / PLOTS_DIR),
    }  # fmt: skip
    (run_dir / CALIBRATION_FILE).write_text(json.dumps(result, indent=2))
    return result


def _write_plots(held, calibration: Calibration, folder: Path) -> list[str]:
    from pipeline.scoring.plots import reliability_diagram, write_plots

    tuned = [softmax(z) for z in held.tuned_logits]
    calibrated = apply_temperatures(held.items, held.tuned_logits, calibration.temperatures)
    before = reliability_diagram(held.items, tuned, folder / "reliability_before.png", "fine-tune, T = 1")
    after = write_plots(held.items, calibrated, held.options, folder, "reliability_after.png", "calibrated")
    return [str(p) for p in [before, *after]]
