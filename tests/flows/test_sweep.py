"""The sweep flow on the tiny project: trials as MLflow children of one parent run with `make run`'s names,
the best trial (by the validation split) registered with its model card, the noise floor over seeds, the
parent's summary and plots, MLflow's compare page of the children in headless Chromium, and a killed sweep
resumed where it stopped.

    python -m pytest tests/flows/test_sweep.py -q -s     # -s prints where the compare page's screenshot is
"""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import browser
from tests.browser import ARTIFACTS
from tests.flows.conftest import flow_env, write_tiny_params
from tests.flows.processes import kill_group, tail

pytestmark = pytest.mark.slow

SPACE = {
    "objective": "validation_nll",
    "trials": 3,
    "seed": 0,
    "space": {"train.lora_lr": {"low": 0.0005, "high": 0.02, "log": True}, "train.max_steps": [4, 8]},
}
COMPARE_SCREENSHOT = ARTIFACTS / "mlflow_compare_sweep.png"


def write_space(folder: Path, **changes) -> Path:
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(SPACE | changes))
    return path


@pytest.fixture
def swept(prefect_harness, mlflow_store, tmp_path, synthetic_train_file, tiny_base):
    """A three-trial sweep of the tiny project, two trials at a time, with two repeats of its best settings,
    run in-process."""
    from flows.sweep import sweep

    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base)
    space = write_space(tmp_path, parallel=2)
    summary = sweep(str(space), str(params), lock=str(tmp_path / "dvc.lock"), repeat_best=2)
    return summary, params


def _children(parent_id: str) -> list:
    from pipeline.mlops.registry import client, ensure_experiment

    found = client().search_runs([ensure_experiment()], f"tags.mlflow.parentRunId = '{parent_id}'")
    return sorted(found, key=lambda run: run.info.run_name)


def test_a_sweep_logs_children_under_a_parent_and_registers_its_best_trial(swept):
    from pipeline.mlops.registry import client

    summary, _ = swept
    parent_id = summary.parent_run_id
    children = _children(parent_id)
    trials = [run for run in children if run.data.tags["sweep_role"] == "trial"]
    repeats = [run for run in children if run.data.tags["sweep_role"] == "repeat"]
    assert [run.info.run_name for run in trials] == ["trial-0", "trial-1", "trial-2"]
    assert len(repeats) == 2 and all(run.info.status == "FINISHED" for run in children)
    first, second = trials[0].info, trials[1].info  # asked together (parallel: 2): they ran at the same time
    assert max(first.start_time, second.start_time) < min(first.end_time, second.end_time)
    # The same param and metric names as a `make run` run: params.yaml flattened, held-out and validation
    # figures.
    for run in trials:
        assert {"train.lora_lr", "train.max_steps", "validate.holdout_max_decisions"} <= set(run.data.params)
        assert {
            "calibrated_accuracy",
            "calibrated_ece",
            "validation_nll",
            "validation_accuracy",
            "score_ms_per_decision",
        } <= set(run.data.metrics)
    # Two trials trained in two threads, each loading the base and adding adapters: nothing left torch's
    # initialisers swapped out (every model built later would hold uninitialised memory), and every figure is
    # finite.
    assert all(math.isfinite(run.data.metrics["calibrated_loss"]) for run in children)
    assert torch.isfinite(torch.nn.Linear(64, 64).weight).all()
    sampled = {(run.data.params["train.lora_lr"], run.data.params["train.max_steps"]) for run in trials}
    assert len(sampled) == 3  # three different settings were tried

    # The best trial is the lowest validation NLL (never a held-out figure), and it is the registered version.
    best = min(trials, key=lambda run: run.data.metrics["validation_nll"])
    assert summary.best.number == int(best.data.tags["sweep_trial"])
    version = client().get_model_version("tiny-model", summary.release.version)
    assert version.run_id == best.info.run_id and version.tags["sweep_trial"] == best.data.tags["sweep_trial"]
    assert version.tags["smoke"] == "passed" and summary.release.smoke.passed
    assert f"the best trial (number {summary.best.number}) of sweep" in version.description
    assert "noise floor" in version.description and "2 seeds" in version.tags["sweep_repeat"]

    # The parent: the summary table as its description, the trade-off and per-question plots, the noise floor.
    parent = client().get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep_role"] == "parent"
    assert f"**{summary.best.number}**" in parent.data.tags["mlflow.note.content"]
    # Every trial scored the same bag of words on the sweep's one split; the summary says what it reached.
    words = {run.data.metrics["bag_of_words_accuracy"] for run in _children(parent_id)}
    assert (
        len(words) == 1 and f"held-out accuracy {words.pop():.4f}." in parent.data.tags["mlflow.note.content"]
    )
    assert parent.data.metrics["trials_finished"] == 3.0
    assert parent.data.metrics["best_validation_nll"] == pytest.approx(best.data.metrics["validation_nll"])
    accuracies = [run.data.metrics["calibrated_accuracy"] for run in repeats]
    assert parent.data.metrics["repeat_accuracy_mean"] == pytest.approx(sum(accuracies) / 2)
    artifacts = {a.path for a in client().list_artifacts(parent_id, "plots")}
    assert artifacts == {"plots/sweep_tradeoff.png", "plots/sweep_questions.png"}
    assert (Path(summary.folder) / "optuna.db").is_file()


def test_the_compare_page_of_a_sweeps_children_shows_their_metrics(swept, tmp_path):
    from pipeline.mlops.registry import ensure_experiment

    summary, _ = swept
    children = [run for run in _children(summary.parent_run_id) if run.data.tags["sweep_role"] == "trial"]
    ids = json.dumps([run.info.run_id for run in children], separators=(",", ":"))
    page = f"#/compare-runs?runs={ids}&experiments={json.dumps([ensure_experiment()])}"
    chromium = browser.chromium_or_skip()
    ARTIFACTS.mkdir(exist_ok=True)
    # The metrics table has a column per child, in the order asked, each value rounded to 3 decimals; it
    # renders its first rows only (alphabetical), so the check reads calibrated_ece, one of them.
    eces = " ".join(str(round(run.data.metrics["calibrated_ece"], 3)) for run in children)
    expected = ["trial-0 trial-1 trial-2", "calibrated_ece", eces]
    with browser.make_ui(tmp_path / "ui.log") as url:
        dom = browser.render(chromium, f"{url}/{page}", COMPARE_SCREENSHOT, expected, tmp_path)
    print(f"compare page screenshot: {COMPARE_SCREENSHOT}")
    text = browser.visible_text(dom)
    for part in expected:
        assert part in text, (
            f"{part!r} not on the compare page: {text[text.find('Metrics Show diff') :][:1500]}"
        )
    browser.assert_screenshot(COMPARE_SCREENSHOT)


# Enough steps that a kill lands mid-trial (~0.04 s a step on the tiny model), checkpoints every 20 of them.
LONG = {"max_steps": 120, "min_steps": 120, "log_every": 5, "checkpoint_every_steps": 20}


def test_a_killed_sweep_resumes_where_it_stopped(
    prefect_api, tmp_path, monkeypatch, synthetic_train_file, tiny_base
):
    import optuna
    from optuna.trial import TrialState

    from pipeline.mlops.registry import client, ensure_experiment
    from pipeline.rundir import RunFolder
    from pipeline.sweep.report import SweepSummary

    uri = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    (tmp_path / "mlflow").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ensure_experiment()
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base, train=LONG)
    space = write_space(tmp_path, space={"train.lora_lr": {"low": 0.0005, "high": 0.02, "log": True}})
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "sweep",
        "--space",
        str(space),
        "--params",
        str(params),
        "--json",
    ]
    env = flow_env(prefect_api, uri)

    # Kill the sweep once its first trial has finished and the second has a training checkpoint.
    sweeps = tmp_path / "runs" / "sweeps"
    with (tmp_path / "killed.log").open("wb") as log:
        proc = subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 240
    try:
        while not (
            len(list(sweeps.glob("*/*/train.json"))) == 1 and len(list(sweeps.glob("*/*/checkpoint.pt"))) == 2
        ):
            assert proc.poll() is None, (
                f"the sweep ended ({proc.returncode}) first:\n{tail(tmp_path / 'killed.log')}"
            )
            assert time.monotonic() < deadline, f"no second trial in 240 s:\n{tail(tmp_path / 'killed.log')}"
            time.sleep(0.05)
    finally:
        kill_group(proc)
    folder = next(sweeps.iterdir())
    first = next(folder.glob("*/train.json"))
    first_written = first.stat().st_mtime_ns
    with RunFolder(folder).driven("sweep"):  # the killed driver's lock died with it
        pass

    with (tmp_path / "rerun.log").open("wb") as log:
        done = subprocess.run(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=log, timeout=400)
    assert done.returncode == 0, f"the resumed sweep failed:\n{tail(tmp_path / 'rerun.log')}"
    summary = SweepSummary.from_dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))

    storage = summary.storage
    loaded = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    states = [trial.state for trial in loaded.trials]
    assert (
        states.count(TrialState.COMPLETE) == 3 and states.count(TrialState.FAIL) == 1
    )  # the interrupted one
    interrupted = next(t for t in loaded.trials if t.state == TrialState.FAIL)
    retried = next(t for t in loaded.trials if t.user_attrs.get("requeued_from") == interrupted.number)
    assert retried.params == interrupted.params and retried.state == TrialState.COMPLETE
    assert first.stat().st_mtime_ns == first_written  # the finished trial was not trained again
    resumed = json.loads((Path(retried.user_attrs["run_dir"]) / "train.json").read_text())
    assert resumed["resumed_from_step"] > 0  # the interrupted trial went on from its checkpoint
    trials = [row for row in summary.trials if row.state == "finished"]
    assert len(trials) == 3 and summary.release.version == "1"
    runs = _children(summary.parent_run_id)
    assert len(runs) == 3 and all(run.info.status == "FINISHED" for run in runs)  # one run per setting

    # Run again, asking for the noise floor: no trial runs, one repeat trains, and the same version gets its
    # tag.
    with (tmp_path / "repeat.log").open("wb") as log:
        again = subprocess.run(
            [*command, "--repeat-best", "1"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=log,
            timeout=400,
        )
    assert again.returncode == 0, f"the rerun failed:\n{tail(tmp_path / 'repeat.log')}"
    repeated = SweepSummary.from_dict(json.loads(again.stdout.decode().strip().splitlines()[-1]))
    assert repeated.release.version == "1" and repeated.noise_floor["seeds"] == 1
    assert "1 seed:" in client().get_model_version("tiny-model", "1").tags["sweep_repeat"]
    assert len(client().search_model_versions("name='tiny-model'")) == 1
