"""Processes a flow test starts: each in its own session, stopped (its whole process group, and children that
left it) whatever the outcome; a Prefect server waited on until it answers.

    with background([sys.executable, "-m", "prefect", "server", "start"], env, tmp / "server.log") as server:
        wait_healthy("http://127.0.0.1:4200/api", server, tmp / "server.log")
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
        proc = subprocess.Popen(
            command, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
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
    group (started a session of its own); waits until all of them are gone (a flow's own process holds its
    run's lock until it is)."""
    family: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        family = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    proc.wait(timeout=30)
    psutil.wait_procs(family, timeout=30)


@dataclass(frozen=True)
class Launch:
    """A flow's process as `pipeline.cli.launch.launch_flow` would start it: its module, the flow's parameters
    from its request file, and its environment."""

    module: str
    parameters: dict
    env: dict


def record_launches(monkeypatch, exit_code: int = 0, result: dict | None = None) -> list[Launch]:
    """The flows `launch_flow` starts, none of them run: each "process" reads its request, writes `result` as
    the flow's (where given) and exits `exit_code` when waited for."""
    launched = []

    class Process:
        def __init__(self, command, env):
            request, written = Path(command[-2]), Path(command[-1])
            launched.append(Launch(command[2], json.loads(request.read_text()), env))
            if result is not None:
                written.write_text(json.dumps(result))

        def wait(self):
            return exit_code

    monkeypatch.setattr(subprocess, "Popen", Process)
    return launched


def skip_input_checks(monkeypatch) -> None:
    """A command's checks of a run's inputs (`stages.start.check_inputs`) pass whatever this checkout holds:
    for tests of what a command hands its flow."""
    import pipeline.stages.start

    monkeypatch.setattr(pipeline.stages.start, "check_inputs", lambda *args, **kwargs: None)


def launched_here(main, parameters: dict, folder: Path) -> tuple[int, dict | None]:
    """A flow module's `main` run in this process on `parameters`, as `decision` starts its process (request
    and result files in `folder`): the exit code, and the result it wrote (None where it wrote none)."""
    request, result = folder / "request.json", folder / "result.json"
    request.write_text(json.dumps(parameters))
    result.unlink(missing_ok=True)
    code = main([str(request), str(result)])
    return code, json.loads(result.read_text()) if result.exists() else None
