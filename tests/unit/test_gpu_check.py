"""The GPU check's CPU dry run (`bash scripts/gpu_check.sh --dry-run`): every row runs on the tiny models with
the packages the GPU machine lacks hidden, prints its table and writes its JSON; the compiled runs really
compiled (dynamo, eager backend) and matched eager; what the CPU cannot do is skipped with its reason, never
crashed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.gpu_check import ROWS

ROOT = Path(__file__).resolve().parents[2]
STATUSES = {"pass", "fail", "skipped"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    environment = {**os.environ, "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_OUT": str(out)}
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, json.loads(out.read_text())


@pytest.mark.slow
def test_the_dry_run_checks_every_row_and_fails_none(dry_run):
    done, results = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {row["row"]: row for row in results["rows"]}
    assert list(rows) == list(ROWS)
    for name, row in rows.items():
        assert row["status"] in STATUSES and row["reason"], row
        assert row["status"] != "fail", row
        assert name in done.stdout  # the printed table has the row
    hidden = set(results["hidden_packages"])
    assert results["device"] == "cpu" and {"dvc", "mlflow", "bitsandbytes"} <= hidden
    assert "pandera" not in hidden  # carried: the stage's fit imports it through the split


@pytest.mark.slow
def test_the_default_fit_keeps_the_ensemble_through_the_stages_fit(dry_run):
    numbers = next(r for r in dry_run[1]["rows"] if r["row"] == "default_fit")["numbers"]
    assert numbers["config"] == {"family": "joint", "method": "head", "lexicon": "both"}
    cpu = numbers["cpu fp32"]
    assert cpu["kept"] == "ensemble" and cpu["finite"] and cpu["steps"] > 0
    assert cpu["base_difference"] == 0.0 and cpu["accuracy_below_cpu"] == 0.0  # the reference itself
    assert cpu["accuracy"] >= 0.9  # the rows give their tone away: a fit that learns nothing fails here


@pytest.mark.slow
@pytest.mark.parametrize("row", ["laya_train", "joint_train"])
def test_the_compiled_runs_compiled_and_matched_eager(dry_run, row):
    numbers = next(r for r in dry_run[1]["rows"] if r["row"] == row)["numbers"]
    for label in ("fp32 compiled", "bf16 compiled"):
        report = numbers[label]["compile"]
        assert report["enabled"] and report["fallback_error"] is None and report["graphs_compiled"] > 0, (
            report
        )
        assert report["reason"] == "forced on by DECISION_COMPILE=1"
    assert not numbers["fp32 eager"]["compile"]["enabled"]
    assert numbers["fp32 compiled"]["gradient_difference"] < 1e-3
    assert numbers["fp32 compiled"]["loss_difference"] < 1e-3


@pytest.mark.slow
def test_what_the_cpu_cannot_check_is_skipped_with_its_reason(dry_run):
    rows = {row["row"]: row for row in dry_run[1]["rows"]}
    assert rows["qlora"]["status"] == "skipped" and "bitsandbytes" in rows["qlora"]["reason"]
    assert rows["gpu_tests"]["status"] == "skipped" and "no CUDA device" in rows["gpu_tests"]["reason"]
    assert rows["gpu_tests"]["numbers"]["skipped"] == rows["gpu_tests"]["numbers"]["tests"] > 0
    assert rows["data_parallel"]["numbers"]["torchrun"]["backend"] == "gloo"


def test_hidden_packages_are_absent_to_finders_and_imports():
    code = (
        "import importlib.util, sys\nfrom scripts.gpu_check_absent import "
        "hide_absent\nhide_absent(('pandera', 'mlflow'))\nassert importlib.util.find_spec('pandera') is None "
        "and importlib.util.find_spec('json') is not None\ntry:\n    import mlflow.tracking\nexcept "
        "ModuleNotFoundError:\n    sys.exit(0)\nsys.exit(1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
