"""What the training loop reports as it goes: a progress bar on the terminal and a callback per logging step.

log = StepLog(total_steps, config, on_log, progress=True)
if log.due(step): log.write(result, mean_loss, lr, elapsed) else: log.tick()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.config import TrainConfig


class StepLog:
    """Logging steps every `train.log_every` steps and at the last one; a tqdm bar when `progress`."""

    def __init__(self, total: int, config: TrainConfig, on_log: Callable[[dict[str, float]], None] | None,
                 progress: bool) -> None:  # fmt: skip
        from tqdm.auto import tqdm

        self.total, self.every, self.on_log = total, config.log_every, on_log
        self.bar = tqdm(total=total, unit="step", desc=f"train {config.method}", disable=not progress)

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total

    def tick(self) -> None:
        self.bar.update(1)

    def write(self, result: Any, mean_loss: float, lr: float, elapsed: float) -> None:
        """One logging step: the bar's postfix and the callback (step, loss, lr, s/step)."""
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{mean_loss:.4f}", s_step=f"{result.step_seconds[-1]:.2f}")
        if self.on_log is not None:
            self.on_log(
                {"step": result.steps, "loss": mean_loss, "lr": lr, "s_per_step": result.step_seconds[-1]}
            )

    def close(self) -> None:
        self.bar.close()
