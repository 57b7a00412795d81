"""Headless Chromium over the MLflow UI as `make ui` starts it: start the UI on a free port, load a page until
the expected text shows, read its visible text, check its screenshot. Used by the UI tests (tests/flows).

    with make_ui(tmp / "ui.log") as url:
        dom = render(chromium, f"{url}/#/experiments/1/runs", tmp / "page.png", ["my-run"], tmp)
    assert "my-run" in visible_text(dom)
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

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
BROWSERS = ("chromium", "chromium-browser")
WINDOW = (1400, 1200)  # tall enough that the run page shows its metrics table, not only "About this run"
# The SPA draws after its API calls; a slow first load gets more virtual time before the DOM is read.
BUDGETS_MS = (10_000, 20_000, 40_000)


def chromium_or_skip() -> str:
    """The chromium binary on PATH; the test is skipped (saying how to install one) without."""
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    if found is None:
        pytest.skip(f"no chromium on PATH (looked for {' and '.join(BROWSERS)}); `make browser` installs it")
    return found


@contextlib.contextmanager
def make_ui(log: Path) -> Iterator[str]:
    """`make ui` on a free loopback port over $MLFLOW_TRACKING_URI; its whole process group is stopped after.

    `-o STAMP` keeps make from reinstalling the virtualenv mid-test; the environment drops a parent make's
    flags (under `make test`) so this runs as `make ui` typed in a shell.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    command = ["make", "--no-print-directory", "-o", stamp(env), "ui", f"UI_PORT={port}"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_http(f"{url}/health", process, log)
            yield url
        finally:
            stop_group(process)


def stamp(env: dict[str, str]) -> str:
    """The Makefile's virtualenv stamp, asked of make itself so the test never copies its formula."""
    probe = ["make", "-s", "--no-print-directory", "--eval", "print-stamp: ; @echo $(STAMP)", "print-stamp"]
    return subprocess.run(probe, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()


def wait_for_http(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"`make ui` exited with {process.returncode} before answering:\n{tail(log)}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.25)
    pytest.fail(f"`make ui` did not answer {url} within {timeout_s:.0f} s:\n{tail(log)}")


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to make, mlflow and uvicorn together; SIGKILL to any still running 20 s later.

    Waits on the processes seen at start rather than the group: an orphan's zombie may never be reaped here.
    """
    tree = []
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while any(map(running, tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for survivor in filter(running, tree):
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    process.wait()


def running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def render(browser: str, url: str, png: Path, expected: list[str], scratch: Path) -> str:
    """The page's DOM once every expected string is visible (or after the longest budget), with a
    screenshot."""
    for budget_ms in BUDGETS_MS:
        dom = chromium(browser, url, png, budget_ms, scratch / "profile")
        if all(part in visible_text(dom) for part in expected):
            break
    return dom


def chromium(browser: str, url: str, png: Path, budget_ms: int, profile: Path) -> str:
    """One headless load: the DOM on stdout and a screenshot, both taken when the virtual-time budget runs
    out.

    --no-sandbox because CI runs as root; a private profile so parallel runs and a user's own profile never
    clash.
    """
    command = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--virtual-time-budget={budget_ms}",
        f"--screenshot={png}",
        "--dump-dom",
        url,
    ]
    png.unlink(missing_ok=True)  # a screenshot left by an earlier run must not pass for this one
    done = subprocess.run(command, capture_output=True, text=True, timeout=budget_ms / 1000 + 60)
    assert done.returncode == 0, f"{browser} failed on {url} ({done.returncode}):\n{done.stderr[-2000:]}"
    return done.stdout


def visible_text(dom: str) -> str:
    """The text a reader sees, whitespace collapsed (scripts and styles dropped)."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def assert_screenshot(png: Path) -> None:
    """A PNG of the whole window with real content: a blank page compresses to a few KiB."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    assert struct.unpack(">II", data[16:24]) == WINDOW, f"{png} is not {WINDOW[0]}x{WINDOW[1]}"
    assert len(data) > 30_000, f"{png} is {len(data)} bytes: nearly blank"


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
