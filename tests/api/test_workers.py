"""`decision serve --workers 2`: two processes answer on one port, each with its own model, identically."""

import os
import subprocess
import sys
import time

import httpx
import pytest

from pipeline.stages.smoke import free_port
from tests.api.conftest import QUESTIONS

pytestmark = pytest.mark.slow


def test_two_workers_share_one_port_and_answer_alike(served_folder, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "serve",
        "--model",
        str(served_folder),
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    with open(tmp_path / "serve.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        pids, answers = set(), {}
        deadline = time.monotonic() + 120
        while len(answers) < 2:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            assert time.monotonic() < deadline, (
                f"answers from {sorted(answers)}; log: {(tmp_path / 'serve.log').read_text()[-1500:]}"
            )
            try:  # a new connection each time, so the kernel may hand it to either process
                with httpx.Client(base_url=url, timeout=10) as http:
                    health = http.get("/healthz")
                    if health.status_code == 200:
                        pid = health.json()["pid"]
                        pids.add(pid)
                        answer = http.post(
                            "/v1/systemone", json={"state": "a fine day", "questions": QUESTIONS}
                        )
                        if answer.status_code == 200 and http.get("/healthz").json()["pid"] == pid:
                            answers[pid] = answer.json()["answers"]
            except httpx.HTTPError:
                time.sleep(0.2)
        assert len(pids) == 2 and server.pid not in pids  # the workers answer, not the parent
        first, second = answers.values()
        assert first == second
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
