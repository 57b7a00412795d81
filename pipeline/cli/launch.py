"""A Prefect flow run in its own process for a `decision` command (the library never imports Prefect, so this
only launches it): the flow's parameters go to it by name in a request file, its result comes back in another,
and no command line is built twice (`flows.launched` is the other side).

    launched = launch_flow("flows.retrain", {"params_file": "params.yaml", "run_config": "tiny"})
    launched.code, launched.result      # the exit code, and the flow's result as a dict (None without one)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The flow's progress is its run logger's lines, which Prefect's console handler writes to stderr (its API
# handler still sends them to the server, for the UI); --quiet raises that handler, and MLflow's, to warnings.
QUIET = {"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING", "MLFLOW_LOGGING_LEVEL": "WARNING"}


@dataclass(frozen=True)
class Launched:
    """How a flow's process ended: its exit code, and the result it wrote (None where it wrote none)."""

    code: int
    result: dict[str, Any] | None


def launch_flow(module: str, parameters: dict[str, Any], quiet: bool = False) -> Launched:
    """Run the flow module `module` on `parameters` (its flow's own, by name) with the project's Prefect home,
    and wait for it."""
    with tempfile.TemporaryDirectory(prefix="decision-flow-") as folder:
        request, result = Path(folder, "request.json"), Path(folder, "result.json")
        request.write_text(json.dumps(parameters))
        child = subprocess.Popen(
            [sys.executable, "-m", module, str(request), str(result)], env=flow_env(quiet)
        )
        code = _waited(child)
        return Launched(code, json.loads(result.read_text()) if result.is_file() else None)


def flow_env(quiet: bool = False) -> dict[str, str]:
    """The environment of a flow's process: the project's Prefect home, no telemetry and no artifact bars
    unless the caller's environment says otherwise; console logging at warnings with `quiet`."""
    defaults = {
        "PREFECT_HOME": str(Path(".prefect").resolve()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }
    return {**defaults, **os.environ, **(QUIET if quiet else {})}


def _waited(child: subprocess.Popen) -> int:
    """`child`'s exit code, once it has stopped itself: a terminal's Ctrl-C reaches it too (one process
    group), and SIGTERM to this process (a scheduler, `timeout`) is passed on. Each flow stops in seconds,
    exit 130; killed here instead, or left running, it could not mark its run crashed or stop its temporary
    API."""
    previous = signal.signal(signal.SIGTERM, lambda number, frame: child.send_signal(number))
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
