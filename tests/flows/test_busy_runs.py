"""A run another process is driving is refused in one line: the retrain and sweep flows end Failed with the
lock's words (no traceback in their log: Prefect printed one before the refusal), and the command exits 2. The
other process is real: a child holding the run's lock file, taken when the flow reaches for it."""

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

import flows.retrain
import flows.sweep
from pipeline.rundir import RunFolder
from tests.flows.conftest import write_tiny_params
from tests.flows.processes import launched_here

HOLD = "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"


@contextmanager
def held_elsewhere(path: Path):
    """`path` locked by another process until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def run_taken_elsewhere_first(monkeypatch) -> list[Path]:
    """`RunFolder.driven` (a run's, or a sweep's) with another process holding its lock first; the lock files
    held."""
    original, held = RunFolder.driven, []

    @contextmanager
    def contended(run, what="run"):
        lock = run.root / f"{what}.lock"
        with held_elsewhere(lock):
            held.append(lock)
            with original(run, what):
                yield

    monkeypatch.setattr(RunFolder, "driven", contended)
    return held


def assert_one_line_refusal(code: int, err: str, records, lock: str) -> None:
    assert code == 2
    assert "Traceback" not in err and f"error: another process is running this {lock}" in err, err[-3000:]
    assert not [r.getMessage() for r in records if r.exc_info or "Traceback" in r.getMessage()]
    said = [r.getMessage() for r in records]
    assert any(f"Finished in state Failed('another process is running this {lock}" in m for m in said), said


@pytest.mark.usefixtures("prefect_harness", "mlflow_store")
def test_a_retrain_of_a_run_another_process_drives_is_one_line_and_exit_2(
    tmp_path, synthetic_train_file, tiny_base, monkeypatch, capfd, caplog
):
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base)
    monkeypatch.chdir(tmp_path)  # where its dvc.lock pins the inputs
    held = run_taken_elsewhere_first(monkeypatch)
    capfd.readouterr()
    code, _ = launched_here(flows.retrain.main, {"params_file": str(params)}, tmp_path)
    assert held, "the flow never reached for its run's lock"
    assert_one_line_refusal(code, capfd.readouterr().err, caplog.records, "run")
    assert not (held[0].parent / "validation.json").exists()  # nothing of the run was written


@pytest.mark.usefixtures("prefect_harness", "mlflow_store")
def test_a_sweep_another_process_drives_is_one_line_and_exit_2_before_its_split_is_written(
    tmp_path, synthetic_train_file, tiny_base, monkeypatch, capfd, caplog
):
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base)
    monkeypatch.chdir(tmp_path)  # where its dvc.lock pins the inputs
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"trials": 1, "space": {"train.max_steps": [4]}}))
    held = run_taken_elsewhere_first(monkeypatch)
    capfd.readouterr()
    code, _ = launched_here(
        flows.sweep.main, {"space_file": str(space), "params_file": str(params)}, tmp_path
    )
    assert held, "the flow never reached for its sweep's lock"
    assert_one_line_refusal(code, capfd.readouterr().err, caplog.records, "sweep")
    assert not RunFolder(held[0].parent).split.exists()
