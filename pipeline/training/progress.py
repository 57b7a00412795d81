"""What the training loop reports as it goes: a progress bar on the terminal, a callback per logging step, and
a progress line (step, loss, s/step, ETA) at least every `LINE_EVERY_STEPS` steps or `LINE_EVERY_S` seconds
for whoever listens (the flow passes its run logger, so the lines reach the Prefect log and the terminal).

    log = StepLog(total_steps, config, on_log, progress=True, report=print)
    if log.due(step): log.write(result, mean_loss, lr, elapsed) else: log.tick(result, elapsed)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipeline.config import TrainConfig

LINE_EVERY_STEPS, LINE_EVERY_S = 10, 30.0


def eta_text(seconds: float) -> str:
    """A duration as people read it: 45s, 6m05s, 1h02m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class StepLog:
    """Logging steps every `train.log_every` steps and at the last one; a tqdm bar when `progress`; progress
    lines to `report` every 10 steps or 30 s, whichever comes first."""

    def __init__(
        self,
        total: int,
        config: TrainConfig,
        on_log: Callable[[dict[str, float]], None] | None,
        progress: bool,
        report: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from tqdm.auto import tqdm

        self.total, self.every, self.on_log, self.report, self.clock = (
            total,
            config.log_every,
            on_log,
            report,
            clock,
        )
        self.method, self.loss, self.last_line, self.last_step = config.method, None, clock(), 0
        self.first_step = 0  # the step this process started from (a resumed run's is its checkpoint's)
        self.bar = tqdm(total=total, unit="step", desc=f"train {config.method}", disable=not progress)

    def resume(self, step: int) -> None:
        """The run carries on from `step`: the bar starts there and s/step counts only this process's
        steps."""
        self.first_step = self.last_step = step
        self.bar.update(step)

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total

    def tick(self, result: Any, elapsed: float) -> None:
        """A step without a loss read-back."""
        self.bar.update(1)
        self._line(result, elapsed)

    def write(self, result: Any, mean_loss: float, lr: float, elapsed: float) -> None:
        """One logging step: the bar's postfix, the callback (step, loss, lr, s/step) and maybe a line."""
        self.bar.update(1)
        self.loss = mean_loss
        self.bar.set_postfix(loss=f"{mean_loss:.4f}", s_step=f"{result.step_seconds[-1]:.2f}")
        if self.on_log is not None:
            self.on_log(
                {"step": result.steps, "loss": mean_loss, "lr": lr, "s_per_step": result.step_seconds[-1]}
            )
        self._line(result, elapsed)

    def _line(self, result: Any, elapsed: float) -> None:
        now = self.clock()
        due = result.steps - self.last_step >= LINE_EVERY_STEPS or now - self.last_line >= LINE_EVERY_S
        if self.report is None or not (due or result.steps == self.total):
            return
        self.last_line, self.last_step = now, result.steps
        per_step = elapsed / max(1, result.steps - self.first_step)
        loss = "n/a" if self.loss is None else f"{self.loss:.4f}"
        self.report(
            f"train {self.method}: step {result.steps}/{self.total}, loss {loss}, {per_step:.2f} s/step, "
            f"ETA {eta_text(per_step * (self.total - result.steps))}"
        )

    def close(self) -> None:
        self.bar.close()
