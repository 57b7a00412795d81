"""Start N data-parallel ranks under `torch.distributed.run` (torchrun) and wait for them, relaying rank 0.

The ranks run a module (`pipeline.stages.train_ranks`) on a spec file; rank 0 prints its progress lines and,
as tagged JSON lines, its logging steps and held-out checkpoints, which this side hands to the caller's
`report`, `on_log` and `on_eval` as a run in this process would (so a flow's live MLflow run fills in from
here, and no rank opens one). Every rank gets the MLflow run id as `MLFLOW_RUN_ID`, so an `mlflow.start_run()`
in any of them would join that run rather than start another.

A rank that fails ends the stage: torchrun stops the other ranks and prints the root cause (rank, exit code,
the rank's traceback or the signal that killed it), and `RankFailed` carries that. A rank stuck in a
collective fails after `train.dist_timeout_minutes` (the process group's timeout), which ends the others the
same way.

    launch_ranks("pipeline.stages.train_ranks", spec_file, nproc=2, hooks=RunHooks(report=print))
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pipeline
from pipeline.cpu.budget import child_environment, plan_threads
from pipeline.training.controls import RunHooks

RANK_EVENT = "@decision-rank-event "
"""The prefix of rank 0's event lines on its stdout (the JSON object follows)."""
STDERR_KEPT = 400
"""Lines of the ranks' stderr kept to explain a failure (torchrun's summary comes last)."""


class RankFailed(RuntimeError):
    """A data-parallel rank failed (an error, a signal or a collective timeout); the message names it."""


def emit_event(kind: str, **payload: Any) -> None:
    """On rank 0: one event line for the launching process (`log`: a logging step, `eval`: held-out
    metrics)."""
    print(RANK_EVENT + json.dumps({"kind": kind, **payload}), flush=True)


def torchrun_command(module: str, spec: Path, nproc: int) -> list[str]:
    """torchrun on this machine (`--standalone`: its own rendezvous on a free port) running `module spec`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        str(spec),
    ]


def rank_environment(nproc: int, run_id: str | None, threads: int | None = None) -> dict[str, str]:
    """This environment, plus: this checkout first on the path (the ranks import the same code), the MLflow
    run id, and each rank's share of the CPU budget (`threads`: `train.threads`, None: the cores this process
    may use) as OpenMP's and MKL's thread counts (torchrun would give each rank one thread)."""
    env = dict(os.environ)
    root = str(Path(pipeline.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env |= child_environment(plan_threads(threads, "train.threads", share=nproc, sharing="ranks").threads)
    if run_id:
        env["MLFLOW_RUN_ID"] = run_id
    return env


def launch_ranks(
    module: str, spec: Path, nproc: int, hooks: RunHooks = RunHooks(), threads: int | None = None
) -> None:
    """Run `module spec` on `nproc` ranks and return when all have finished; `RankFailed` when one failed.

    Rank 0's plain stdout lines go to `hooks.report` (else to stderr, so a `--json` stdout stays one object),
    its events to `hooks.on_log` and `hooks.on_eval`. The ranks split `threads` (`train.threads`) between
    them."""
    environment = rank_environment(nproc, hooks.mlflow_run_id, threads)
    process = subprocess.Popen(
        torchrun_command(module, spec, nproc),
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        preexec_fn=_end_with_parent if sys.platform == "linux" else None,
    )
    kept: deque[str] = deque(maxlen=STDERR_KEPT)
    echo = threading.Thread(target=_echo_stderr, args=(process.stderr, kept), daemon=True)
    echo.start()
    try:
        for line in process.stdout:
            _relay(line.rstrip("\n"), hooks)
        code = process.wait()
    finally:
        if process.poll() is None:  # the caller was interrupted: take the ranks down with it
            process.terminate()
            process.wait()
    echo.join()
    if code != 0:
        raise RankFailed(describe_failure(list(kept), code, nproc))


def _end_with_parent() -> None:
    """In torchrun before it starts (Linux): SIGTERM when this process dies, killed or not. torchrun then
    stops its ranks, so a killed flow leaves no ranks training on into the run folder its rerun resumes
    from."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _relay(line: str, hooks: RunHooks) -> None:
    if not line.startswith(RANK_EVENT):
        (hooks.report or _to_stderr)(line)
        return
    event = json.loads(line[len(RANK_EVENT) :])
    if event["kind"] == "log":
        hooks.logged(event["entry"])
    elif event["kind"] == "eval":
        hooks.evaluated(event["step"], event["metrics"])


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _echo_stderr(stream, kept: deque[str]) -> None:
    for line in stream:
        sys.stderr.write(line)
        kept.append(line.rstrip("\n"))


def describe_failure(stderr: list[str], code: int, nproc: int) -> str:
    """The failed rank that explains the failure (`_culprit`), with its exit code and last error line, from
    torchrun's failure record; else the last lines the ranks wrote."""
    starts = (
        i for i, line in enumerate(stderr) if line.strip() == "Failures:" or line.startswith("Root Cause")
    )
    start = next(starts, None)
    if start is None:
        tail = "\n".join(stderr[-20:])
        return f"data-parallel training on {nproc} ranks failed (torchrun exit {code}):\n{tail}"
    record = []
    for line in stderr[start:]:
        if line.startswith("====="):
            break
        record.append(line)
    fields = _culprit([_failure_fields(entry) for entry in _entries(record)])
    error = fields.get("traceback", "").strip().splitlines()
    last = next((line.strip() for line in reversed(error) if line.strip()), "no error recorded")
    return (
        f"data-parallel training on {nproc} ranks failed: rank {fields.get('rank', '?')} "
        f"(exit code {fields.get('exitcode', '?')}): {last}\n" + "\n".join(record)
    )


def _entries(record: list[str]) -> list[list[str]]:
    """The `[n]:` entries of torchrun's failure record (its other failures and its root cause), root cause
    last."""
    entries: list[list[str]] = []
    for line in record:
        if line.startswith("[") and line.rstrip().endswith("]:"):
            entries.append([])
        elif entries and not line.startswith("-----") and not line.startswith("Root Cause"):
            entries[-1].append(line)
    return entries


def _culprit(failures: list[dict[str, str]]) -> dict[str, str]:
    """torchrun's root cause (the record's last entry), unless torchrun stopped it itself (SIGTERM): under
    load it can stop a peer before it sees the rank that died, and then the rank killed by another signal (the
    OOM killer's SIGKILL, a SIGSEGV) is the cause. A root cause of its own (a timeout, an error) stands, even
    where torchrun then had to SIGKILL a peer that ignored its SIGTERM (a stopped or hung rank)."""
    if not failures:
        return {}
    root = failures[-1]
    if "(SIGTERM)" not in root.get("exitcode", ""):
        return root
    killed = [
        f for f in failures if f.get("exitcode", "").startswith("-") and "(SIGTERM)" not in f["exitcode"]
    ]
    return killed[0] if killed else root


def _failure_fields(entry: list[str]) -> dict[str, str]:
    """`name : value` lines of one failure entry; the traceback runs on to the end of the entry."""
    fields: dict[str, str] = {}
    for index, line in enumerate(entry):
        name, colon, value = line.strip().partition(":")
        if not colon or name.strip() not in ("rank", "exitcode", "traceback"):
            continue
        fields[name.strip()] = value.strip()
        if name.strip() == "traceback":
            fields["traceback"] = "\n".join([value, *entry[index + 1 :]])
            break
    return fields
