"""What travels with a training run beside its data and config, grouped so it is passed once, not threaded by
hand through every layer: who listens to the run (`RunHooks`) and what steers it (`RunControls`).

    hooks = RunHooks(report=logger.info, on_log=live.step, on_eval=live.heldout)
    controls = RunControls(cancel=token, checkpoints=Checkpointer(run.checkpoint, config))
    train_stage(run_dir, base, config, "auto", hooks, controls)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.cpu.load import ThreadGovernor
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.compile import CompileConfig
from pipeline.training.ranks import Ranks


class CancelToken:
    """A flag the training loop checks at each step boundary; signals can set it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @contextmanager
    def on_signals(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[CancelToken]:
        """Within the block, the first SIGINT/SIGTERM cancels at the next step; the handlers are restored
        after."""
        previous = {s: signal.getsignal(s) for s in signals}
        for sig in signals:
            signal.signal(sig, lambda number, _frame: self.cancel(f"signal {signal.Signals(number).name}"))
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass(frozen=True)
class RunHooks:
    """Who listens to a run, as it happens; nothing in training reads what they do.

    `report` gets progress lines (the budget, scoring, a line every 10 steps or 30 s); `on_log` each logging
    step (step, loss, lr, s/step); `on_eval(step, metrics)` the held-out figures of the base (step 0), a third
    and two thirds of the way, and of the fine-tune (the flow sends both to the live MLflow run).
    """

    report: Callable[[str], None] | None = None
    on_log: Callable[[dict[str, float]], None] | None = None
    on_eval: Callable[[int, dict[str, float]], None] | None = None
    mlflow_run_id: str | None = None
    """The MLflow run they write to: data-parallel ranks get it as `MLFLOW_RUN_ID`."""

    def say(self, line: str) -> None:
        if self.report is not None:
            self.report(line)

    def logged(self, entry: dict[str, float]) -> None:
        if self.on_log is not None:
            self.on_log(entry)

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        if self.on_eval is not None:
            self.on_eval(step, metrics)


@dataclass(frozen=True)
class RunControls:
    """What steers a run: a progress bar on the terminal, a cancel token (checked at each step; a signal can
    set it), checkpoints to save and resume from, this process's data-parallel ranks, how layers compile, and
    whether a cancelled run is saved."""

    progress: bool = False
    cancel: CancelToken | None = None
    checkpoints: Checkpointer | None = None
    ranks: Ranks | None = None
    """Given only on a rank of a data-parallel run (`stages.train_ranks`)."""
    compile: CompileConfig | None = None
    """None: `CompileConfig()`, with `DECISION_COMPILE` deciding on or off."""
    save_on_cancel: bool = False
    """`decision train --save-on-cancel`: a cancelled run still saves what it trained."""
    threads: ThreadGovernor | None = None
    """Followed before each step: fewer torch threads while other processes keep some of the cores busy."""
    prune: Callable[[int, float], bool] | None = None
    """A sweep's pruner (`sweep.study.pruning_callback`): asked at each validation check with (step, loss);
    True stops the run there. The run then scores the validation split at each check even without early
    stopping."""

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.cancelled
