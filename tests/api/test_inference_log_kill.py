"""The inference log under real signals, on a real `decision serve` process: SIGTERM writes everything
answered, and SIGKILL loses at most what was answered within the last flush interval."""

import os
import signal
import sys
import time

import httpx

from pipeline.flywheel.table import open_store
from pipeline.stages.smoke import free_port
from tests.api.conftest import QUESTIONS
from tests.flows.processes import background, tail


def serve(folder, inference, flush_s: float, log):
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "serve",
        "--model",
        str(folder),
        "--port",
        str(port),
        "--inference-log",
        str(inference),
        "--log-flush-seconds",
        str(flush_s),
        "--threads",
        "1",
    ]
    return background(command, dict(os.environ), log), f"http://127.0.0.1:{port}"


def healthy(url: str, proc, log) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, tail(log)
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(tail(log))


def answer(url: str, n: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return [
            client.post("/v1/systemone", json={"state": f"late {i}", "questions": QUESTIONS}).json()[
                "x_decision_id"
            ]
            for i in range(n)
        ]


def test_sigterm_writes_every_answered_decision(served_folder, tmp_path):
    started, url = serve(served_folder, tmp_path / "inference", 60, tmp_path / "serve.log")
    with started as proc:
        healthy(url, proc, tmp_path / "serve.log")
        ids = answer(url, 20)  # a 60 s interval: nothing is due yet
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully (the lifespan flushes the log), then re-raises the signal: -15
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM), tail(tmp_path / "serve.log")
    written = set(open_store(tmp_path / "inference").decisions().column("decision_id").to_pylist())
    assert written == set(ids)


def test_sigkill_loses_at_most_the_last_flush_interval(served_folder, tmp_path):
    flush_s = 1.0
    started, url = serve(served_folder, tmp_path / "inference", flush_s, tmp_path / "serve.log")
    with started as proc:
        healthy(url, proc, tmp_path / "serve.log")
        early = answer(url, 20)
        time.sleep(2.5 * flush_s)  # past at least two flushes
        late = answer(url, 5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    written = set(open_store(tmp_path / "inference").decisions().column("decision_id").to_pylist())
    assert set(early) <= written  # older than the interval: on disk
    assert written <= set(early) | set(late)
