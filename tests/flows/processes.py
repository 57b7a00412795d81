"""Processes a flow test starts: each in its own session, stopped (its whole process group, and children that
left it) whatever the outcome; a Prefect server waited on until it answers.

    with background([sys.executable, "-m", "prefect", "server", "start"], env, tmp / "server.log") as server:
        wait_healthy("http://127.0.0.1:4200/api", server, tmp / "server.log")
"""

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil


def tail(log: Path, chars: int = 6000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


@contextlib.contextmanager
def background(command: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """A process in its own session (so a group signal reaches everything it starts), stopped on exit: SIGINT
    to the group, then SIGKILL to whatever is left, including children that started sessions of their own (an
    idle Prefect 3.9 worker never finishes the graceful stop its first SIGINT starts)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        family: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess):
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        proc.wait(timeout=10)


def wait_healthy(api: str, server: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"prefect server exited ({server.returncode}):\n{tail(log)}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"prefect server not healthy after {timeout} s:\n{tail(log)}")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started in its own session, everything in its group, and any child that left the
    group (started a session of its own); waits until the process is gone."""
    family: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        family = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    proc.wait(timeout=30)


def record_launches(monkeypatch, exit_code: int = 0, with_env: bool = False) -> list:
    """The commands `pipeline.cli.registry.launch_flow` starts (with their environments), none of them run: each
    "process" exits `exit_code` when waited for."""
    launched = []

    class Launched:
        def __init__(self, command, env):
            launched.append((command, env) if with_env else command)

        def wait(self):
            return exit_code

    monkeypatch.setattr(subprocess, "Popen", Launched)
    return launched
