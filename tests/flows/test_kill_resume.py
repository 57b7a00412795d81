"""Exactly once under real kills: the retrain flow, run as `decision retrain` on the tiny project, is
SIGKILLed (its whole process group) at three points and rerun to completion; every time the key ends with one
FINISHED MLflow run and one model version, and a kill mid-training resumes from the training checkpoint.

    python -m pytest tests/flows/test_kill_resume.py -q -s     # -s shows a line per kill point

The kill points: (a) mid-training, once a checkpoint is on disk; (b) after calibration, before registration;
(c) once the version exists, before the flow finishes (its smoke test is running). The flows talk to one
private Prefect server (its start costs ~15 s; each flow's own temporary server would cost that per run).
"""

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.stages.result import RunResult
from tests.flows.conftest import flow_env, write_tiny_params
from tests.flows.processes import kill_group, tail

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Enough steps that a kill lands mid-training (~0.04 s a step on the tiny model), checkpoints every 20 of
# them.
TRAIN = {"max_steps": 160, "min_steps": 160, "log_every": 5, "checkpoint_every_steps": 20}
POLL_S = 0.05


@dataclass(frozen=True)
class KillPoint:
    name: str
    reached: Callable[[Path], bool]
    """Is the flow working in `runs_dir` there yet?"""


def _versions() -> list[str]:
    from pipeline.mlops.registry import client

    return [str(v.version) for v in client().search_model_versions("name='tiny-model'")]


KILL_POINTS = [
    KillPoint("mid-training, after a checkpoint", lambda runs: any(runs.glob("*/checkpoint.pt"))),
    KillPoint("after calibration, before registration", lambda runs: any(runs.glob("*/calibration.json"))),
    KillPoint("after the version was registered, before the flow finished", lambda runs: bool(_versions())),
]


def _start_flow(params: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "retrain", "--params", str(params), "--json"],
            env=env,
            cwd=params.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill_at(point: KillPoint, params: Path, env: dict[str, str], log: Path, timeout: float = 150) -> None:
    """Start the flow, SIGKILL its process group the moment it reaches `point`."""
    runs = params.parent / "runs"
    proc = _start_flow(params, env, log)
    deadline = time.monotonic() + timeout
    try:
        while not point.reached(runs):
            assert proc.poll() is None, (
                f"the flow ended ({proc.returncode}) before {point.name}:\n{tail(log)}"
            )
            assert time.monotonic() < deadline, (
                f"the flow did not reach {point.name} in {timeout} s:\n{tail(log)}"
            )
            time.sleep(POLL_S)
    finally:
        kill_group(proc)


def _rerun(params: Path, env: dict[str, str], log: Path) -> RunResult:
    with log.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "retrain", "--params", str(params), "--json"],
            env=env,
            cwd=params.parent,
            stdout=subprocess.PIPE,
            stderr=out,
            timeout=300,
        )
    assert done.returncode == 0, f"the rerun failed ({done.returncode}):\n{tail(log)}"
    return RunResult.from_dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))


def _visible_runs() -> list:
    """Every run MLflow's default search shows (deleted runs are not shown)."""
    from pipeline.mlops.registry import client

    return client().search_runs([e.experiment_id for e in client().search_experiments()])


@pytest.mark.parametrize("point", KILL_POINTS, ids=["mid-training", "before-register", "after-register"])
def test_a_killed_flow_reruns_to_one_finished_run_and_one_version(
    point, prefect_api, tmp_path, monkeypatch, synthetic_train_file, tiny_base
):
    from pipeline.mlops.registry import ensure_experiment

    uri = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    (tmp_path / "mlflow").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ensure_experiment()  # the store's tables exist before the flow and this test's polling both open it
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base, train=TRAIN)
    env = flow_env(prefect_api, uri)

    _kill_at(point, params, env, tmp_path / "killed.log")
    run_dir = next((tmp_path / "runs").iterdir())
    killed_train = run_dir / "train.json"
    trained_before = killed_train.stat().st_mtime_ns if killed_train.exists() else None
    versions_before, runs_before = _versions(), [r.info.status for r in _visible_runs()]
    summary = _rerun(params, env, tmp_path / "rerun.log")

    train = json.loads((run_dir / "train.json").read_text())
    runs, versions = _visible_runs(), _versions()
    print(
        f"\nkilled {point.name}: train.json {'written' if trained_before else 'absent'}, runs "
        f"{runs_before or 'none'}, versions {versions_before or 'none'}; rerun: "
        f"{_resumed_what(train, trained_before, killed_train)}; then {len(runs)} run(s) "
        f"{[r.info.status for r in runs]}, versions {versions}"
    )
    assert [r.info.status for r in runs] == ["FINISHED"]
    assert runs[0].data.tags["idempotency_key"] == summary.tracked.key
    assert runs[0].info.run_id == summary.tracked.mlflow_run_id
    assert versions == ["1"] and summary.release.version == "1"
    assert train["steps"] == train["planned_steps"] == TRAIN["max_steps"]
    _assert_killed_where_meant(point, trained_before, versions_before, train)
    _assert_one_point_per_step(runs[0].info.run_id, train)


def _assert_killed_where_meant(point: KillPoint, trained_before, versions_before, train) -> None:
    if point is KILL_POINTS[0]:  # mid-training: the rerun trained on from the checkpoint
        assert trained_before is None and versions_before == []
        assert 0 < train["resumed_from_step"] < train["planned_steps"]
    elif point is KILL_POINTS[1]:
        assert trained_before is not None and versions_before == []
    else:
        assert trained_before is not None and versions_before == ["1"]
    if point is not KILL_POINTS[0]:  # the finished train task was not run again
        assert train["resumed_from_step"] == 0


def _assert_one_point_per_step(run_id: str, train: dict) -> None:
    """The loss curve has each logging step once, the steps logged before a kill included, and the held-out
    curve each of its steps once (the base's, step 0, is scored again by a resumed run)."""
    from pipeline.mlops.registry import client

    steps = [m.step for m in client().get_metric_history(run_id, "loss")]
    assert sorted(steps) == [e["step"] for e in train["logged_steps"]]
    assert steps and len(steps) == len(set(steps)) and max(steps) == train["planned_steps"]
    heldout = sorted(m.step for m in client().get_metric_history(run_id, "heldout_accuracy"))
    assert heldout == sorted(set(heldout)) and heldout[0] == 0 and heldout[-1] == train["planned_steps"]


def _resumed_what(train: dict, trained_before, train_file: Path) -> str:
    if train["resumed_from_step"]:
        return f"resumed from step {train['resumed_from_step']} of {train['planned_steps']}"
    if trained_before is not None and train_file.stat().st_mtime_ns == trained_before:
        return "training cached (train.json untouched)"
    return "trained from the start"
