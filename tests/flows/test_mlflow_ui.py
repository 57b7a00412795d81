"""The MLflow UI as `make ui` starts it, opened in headless Chromium: the experiment lists a logged run, and the
run's page shows its metrics. Screenshots land in tests/artifacts/ (ignored by git) for a person to look at.

    python -m pytest tests/flows/test_mlflow_ui.py -s   # -s prints where the screenshots are

Needs a chromium binary on PATH (`make browser` installs Debian's); without one the test is skipped.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from pipeline.stages.smoke import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
SCREENSHOT = ARTIFACTS / "mlflow_ui.png"
RUNS_SCREENSHOT = ARTIFACTS / "mlflow_ui_runs.png"
BROWSERS = ("chromium", "chromium-browser")
WINDOW = (1400, 1200)  # tall enough that the run page shows its metrics table, not only "About this run"
RUN_NAME = "ui-test-run"
ACCURACY = 0.8765  # distinctive: nothing else on the page renders this number
# The SPA draws after its API calls; a slow first load gets more virtual time before the DOM is read.
BUDGETS_MS = (10_000, 20_000, 40_000)


@pytest.fixture
def browser() -> str:
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    if found is None:
        pytest.skip(f"no chromium on PATH (looked for {' and '.join(BROWSERS)}); `make browser` installs it")
    return found


@pytest.mark.slow
def test_the_ui_lists_the_run_and_shows_its_metrics(browser, mlflow_store, tmp_path):
    experiment_id, run_id = _log_run()
    runs_page = f"#/experiments/{experiment_id}/runs"
    run_page = f"{runs_page}/{run_id}"
    ARTIFACTS.mkdir(exist_ok=True)
    with _make_ui(tmp_path / "ui.log") as url:
        listing = _render(browser, f"{url}/{runs_page}", RUNS_SCREENSHOT, [RUN_NAME], tmp_path)
        details = _render(
            browser, f"{url}/{run_page}", SCREENSHOT, [RUN_NAME, "calibrated_accuracy"], tmp_path
        )
    print(f"screenshots: {SCREENSHOT} (the run), {RUNS_SCREENSHOT} (the experiment's runs)")

    assert RUN_NAME in _visible_text(listing)
    assert f'href="{run_page}"' in listing  # the run's name links to its page
    text = _visible_text(details)
    assert RUN_NAME in text
    assert re.search(rf"calibrated_accuracy {ACCURACY}\b", text), f"no metric row on the run page: {text}"
    assert re.search(r"lora_r 4\b", text), f"no param row on the run page: {text}"
    _assert_screenshot(SCREENSHOT)
    _assert_screenshot(RUNS_SCREENSHOT)


def _log_run() -> tuple[str, str]:
    """A finished run in the project's experiment; the client API, so MLflow's global tracking URI is untouched."""
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


@contextlib.contextmanager
def _make_ui(log: Path) -> Iterator[str]:
    """`make ui` on a free loopback port over $MLFLOW_TRACKING_URI; its whole process group is stopped after.

    `-o STAMP` keeps make from reinstalling the virtualenv mid-test; the environment drops a parent make's flags
    (under `make test`) so this runs as `make ui` typed in a shell.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    command = ["make", "--no-print-directory", "-o", _stamp(env), "ui", f"UI_PORT={port}"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for_http(f"{url}/health", process, log)
            yield url
        finally:
            _stop_group(process)


def _stamp(env: dict[str, str]) -> str:
    """The Makefile's virtualenv stamp, asked of make itself so the test never copies its formula."""
    probe = ["make", "-s", "--no-print-directory", "--eval", "print-stamp: ; @echo $(STAMP)", "print-stamp"]
    return subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _wait_for_http(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"`make ui` exited with {process.returncode} before answering:\n{_tail(log)}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.25)
    pytest.fail(f"`make ui` did not answer {url} within {timeout_s:.0f} s:\n{_tail(log)}")


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to make, mlflow and uvicorn together; SIGKILL to any still running 20 s later.

    Waits on the processes seen at start rather than the group: an orphan's zombie may never be reaped here.
    """
    tree = []
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while any(map(_running, tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for survivor in filter(_running, tree):
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    process.wait()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _render(browser: str, url: str, png: Path, expected: list[str], scratch: Path) -> str:
    """The page's DOM once every expected string is visible (or after the longest budget), with a screenshot."""
    for budget_ms in BUDGETS_MS:
        dom = _chromium(browser, url, png, budget_ms, scratch / "profile")
        if all(part in _visible_text(dom) for part in expected):
            break
    return dom


def _chromium(browser: str, url: str, png: Path, budget_ms: int, profile: Path) -> str:
    """One headless load: the DOM on stdout and a screenshot, both taken when the virtual-time budget runs out.

    --no-sandbox because CI runs as root; a private profile so parallel runs and a user's own profile never clash.
    """
    command = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--virtual-time-budget={budget_ms}",
               f"--screenshot={png}", "--dump-dom", url]  # fmt: skip
    png.unlink(missing_ok=True)  # a screenshot left by an earlier run must not pass for this one
    done = subprocess.run(command, capture_output=True, text=True, timeout=budget_ms / 1000 + 60)
    assert done.returncode == 0, f"{browser} failed on {url} ({done.returncode}):\n{done.stderr[-2000:]}"
    return done.stdout


def _visible_text(dom: str) -> str:
    """The text a reader sees, whitespace collapsed (scripts and styles dropped)."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def _assert_screenshot(png: Path) -> None:
    """A PNG of the whole window with real content: a blank page compresses to a few KiB."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    assert struct.unpack(">II", data[16:24]) == WINDOW, f"{png} is not {WINDOW[0]}x{WINDOW[1]}"
    assert len(data) > 30_000, f"{png} is {len(data)} bytes: nearly blank"


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
