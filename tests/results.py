"""Typed run results for tests that need one without training (`pipeline.stages.result`): every field a test
does not name gets a plain value."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pipeline.data.validate import ValidationReport
from pipeline.lineage import DataRevision
from pipeline.stages.calibrate import CalibrationResult
from pipeline.stages.promote import GateResult
from pipeline.stages.result import Release, RunResult, Tracked
from pipeline.stages.smoke import SmokeResult
from pipeline.stages.validate import ValidateResult
from pipeline.training.fit import TrainRun

SCORES = {"accuracy": 0.77, "record_accuracy": 0.47, "ece": 0.02, "brier": 0.32, "loss": 0.6}


def train_run(**fields: Any) -> TrainRun:
    plain = TrainRun(
        rows=40,
        decisions=120,
        skipped={},
        train_decisions=80,
        heldout={"decisions": 40, "base": SCORES, "tuned": SCORES},
        steps=12,
        planned_steps=12,
        cancelled=False,
        train_seconds=9.0,
        s_per_step=0.75,
        decisions_per_second=10.0,
        saved_to=None,
    )
    return replace(plain, **fields)


def calibration(heldout: dict[str, Any] | None = None, **fields: Any) -> CalibrationResult:
    heldout = heldout or {"decisions": 40, "base": SCORES, "tuned": SCORES, "calibrated": SCORES}
    overall = {"ece": 0.02, "ece_low": 0.01, "ece_high": 0.04, "nll": 0.6}
    plain = CalibrationResult(
        temperatures={},
        notes={},
        calibrator={"kind": "type_temperature", "fitted_on": "validation split"},
        heldout=heldout,
        report={"overall": overall, "by_type": {}},
        plots=[],
    )
    return replace(plain, **fields)


def validation(**report: Any) -> ValidateResult:
    values = {"rows": 40, "decisions": 120, "kept": 120, "skipped": {}, "examples": {}} | report
    return ValidateResult(ValidationReport(**values), split={})


def tracked(**fields: Any) -> Tracked:
    plain = Tracked(
        key="k" * 32,
        params={},
        data="rows.jsonl",
        data_md5="md5",
        run_name="run",
        mlflow_run_id="abc",
        revision=DataRevision(source="rows.jsonl", revision="1a2b3c4d"),
    )
    return replace(plain, **fields)


def release(
    model: str = "decision-model",
    version: str = "1",
    champion: str | None = "1",
    reasons: tuple[str, ...] = ("no champion yet",),
) -> Release:
    smoke = SmokeResult(
        url="http://127.0.0.1:1",
        model=f"{model}/{version}",
        requests=4,
        decisions=12,
        agreement=1.0,
        max_probability_diff=0.0,
        latency_ms={"p50": 20.0},
    )
    gate = GateResult(promote=champion == version, reasons=list(reasons), champion=champion)
    return Release(model=model, version=version, smoke=smoke, gate=gate)


def run_result(**fields: Any) -> RunResult:
    plain = RunResult(
        run_dir="runs/x",
        validation=validation(),
        train=train_run(),
        calibration=calibration(),
        export_dir="runs/x/export",
        tracked=tracked(),
    )
    return replace(plain, **fields)
