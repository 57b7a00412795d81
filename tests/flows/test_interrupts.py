"""Ctrl-C or SIGTERM on a flow run from the command line, on its own temporary Prefect API (no
PREFECT_API_URL): it stops in seconds with one line and exit 130, and leaves no API server running.

A terminal's Ctrl-C reaches the whole process group: the temporary API used to be in it, died with the flow,
and the flow then retried the dead API for minutes and exited 1; SIGTERM left the API running."""

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.flows.conftest import flow_env, write_tiny_params
from tests.flows.processes import kill_group, tail

TRAIN = {"max_steps": 4000, "min_steps": 4000, "log_every": 50, "checkpoint_every_steps": 20}


def _own_api_env(tmp_path) -> dict[str, str]:
    """A flow's environment with no PREFECT_API_URL (flow_env of no server names none): it starts its own
    API."""
    return flow_env({}, f"sqlite:///{tmp_path}/mlflow.db") | {"PREFECT_HOME": str(tmp_path / "prefect")}


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_flow_stops_at_once_with_its_temporary_api(
    how, tmp_path, synthetic_train_file, tiny_base
):
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base, train=TRAIN)
    env = _own_api_env(tmp_path)
    log = tmp_path / "flow.log"
    with log.open("wb") as out:
        # SIGINT as a terminal leaves it: a test run in a shell's background job inherits it ignored (bash
        # ignores SIGINT in asynchronous commands), and an ignored SIGINT is one Python never turns into
        # KeyboardInterrupt.
        flow = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "retrain", "--params", str(params)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 240
        while not any((tmp_path / "runs").glob("*/checkpoint*.pt")):  # mid-training
            assert flow.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.2)
        said = log.read_text()
        port = int(said.split("Starting temporary server on http://127.0.0.1:")[1].split()[0])
        assert _listening(port)
        if how == "ctrl-c":
            os.killpg(flow.pid, signal.SIGINT)  # the whole group, as a terminal sends it
        else:
            flow.send_signal(
                signal.SIGTERM
            )  # the command alone, as a scheduler or `timeout` sends it: passed on
        try:
            code = flow.wait(timeout=120)
        except subprocess.TimeoutExpired:  # what it was doing, for whoever reads the failure
            pytest.fail(f"the flow still ran 120 s after the {how}:\n{tail(log)}")
        assert code == 130, tail(log)
    finally:
        kill_group(flow)
    assert "retrain: interrupted; a rerun resumes from the last checkpoint" in log.read_text(), tail(log)
    assert not _listening(port)


def test_decision_retrain_passes_sigterm_on_and_waits(tmp_path, synthetic_train_file, tiny_base):
    # It exited 143 at once and left the flow training (and later registering) on its own.
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base, train=TRAIN)
    env = _own_api_env(tmp_path)
    log = tmp_path / "wrapper.log"
    with log.open("wb") as out:
        wrapper = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "retrain", "--params", str(params)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while not any((tmp_path / "runs").glob("*/checkpoint*.pt")):
            assert wrapper.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.2)
        flows = psutil.Process(wrapper.pid).children(recursive=True)
        assert any("flows.retrain" in " ".join(child.cmdline()) for child in flows), "no flow process ran"
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=60) == 130, tail(log)
        assert not [
            child for child in flows if child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        ], "the flow outlived its wrapper"
    finally:
        kill_group(wrapper)
    assert "retrain: interrupted" in log.read_text()
