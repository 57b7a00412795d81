"""The MLflow UI as `make ui` starts it, opened in headless Chromium: the experiment lists a logged run, and
the run's page shows its metrics. Screenshots land in tests/artifacts/ (ignored by git) for a person to look
at.

    python -m pytest tests/flows/test_mlflow_ui.py -s   # -s prints where the screenshots are

Needs a chromium binary on PATH (`make browser` installs Debian's); without one the test is skipped.
"""

from __future__ import annotations

import re

import pytest

from tests import browser
from tests.browser import ARTIFACTS

SCREENSHOT = ARTIFACTS / "mlflow_ui.png"
RUNS_SCREENSHOT = ARTIFACTS / "mlflow_ui_runs.png"
RUN_NAME = "ui-test-run"
ACCURACY = 0.8765  # distinctive: nothing else on the page renders this number


@pytest.fixture
def chromium() -> str:
    return browser.chromium_or_skip()


@pytest.mark.slow
def test_the_ui_lists_the_run_and_shows_its_metrics(chromium, mlflow_store, tmp_path):
    experiment_id, run_id = _log_run()
    runs_page = f"#/experiments/{experiment_id}/runs"
    run_page = f"{runs_page}/{run_id}"
    ARTIFACTS.mkdir(exist_ok=True)
    with browser.make_ui(tmp_path / "ui.log") as url:
        listing = browser.render(chromium, f"{url}/{runs_page}", RUNS_SCREENSHOT, [RUN_NAME], tmp_path)
        details = browser.render(
            chromium, f"{url}/{run_page}", SCREENSHOT, [RUN_NAME, "calibrated_accuracy"], tmp_path
        )
    print(f"screenshots: {SCREENSHOT} (the run), {RUNS_SCREENSHOT} (the experiment's runs)")

    assert RUN_NAME in browser.visible_text(listing)
    assert f'href="{run_page}"' in listing  # the run's name links to its page
    text = browser.visible_text(details)
    assert RUN_NAME in text
    assert re.search(rf"calibrated_accuracy {ACCURACY}\b", text), f"no metric row on the run page: {text}"
    assert re.search(r"lora_r 4\b", text), f"no param row on the run page: {text}"
    browser.assert_screenshot(SCREENSHOT)
    browser.assert_screenshot(RUNS_SCREENSHOT)


def _log_run() -> tuple[str, str]:
    """A finished run in the project's experiment; the client API, so MLflow's global tracking URI is
    untouched."""
    from pipeline.mlops.registry import client, ensure_experiment

    experiment_id = ensure_experiment()
    tracking = client()
    run_id = tracking.create_run(experiment_id, run_name=RUN_NAME).info.run_id
    tracking.log_param(run_id, "lora_r", 4)
    tracking.log_param(run_id, "max_steps", 8)
    tracking.log_metric(run_id, "calibrated_accuracy", ACCURACY)
    tracking.log_metric(run_id, "ece", 0.0421)
    tracking.set_terminated(run_id)
    return experiment_id, run_id
