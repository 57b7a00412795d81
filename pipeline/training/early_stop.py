"""Early stopping on the validation split: the run scores the loss of the rows carved from its training rows
(`data.split.carve_validation`) at `train.validation_checks` points of its budget, stops once it has not
fallen for `train.early_stopping` checks, and ends with the weights of its best check.

The loss is the training objective itself (`BatchTask.summed_loss`, in eval mode, without gradients) over the
validation examples as the loop reads them, so a frozen backbone's cached features serve here too. Nothing
here reads a held-out row.

    stopper = EarlyStopping(validation_examples, config, task)
    train(model, examples, config, device, task, stopper=stopper)   # "stopped early at step N: best step M"
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.config import TrainConfig
from pipeline.families.base import BatchTask


@functools.cache  # asked at every training step: computed once per budget
def check_steps(total: int, checks: int) -> frozenset[int]:
    """`checks` steps spread evenly over a budget of `total` steps, the last one included."""
    count = min(checks, total)
    return frozenset(round(total * (i + 1) / count) for i in range(count))


@dataclass
class EarlyStopping:
    """The validation checks of one run and the best weights so far (kept on the CPU)."""

    examples: Sequence[Any]
    config: TrainConfig
    task: BatchTask
    report: Callable[[str], None] | None = None
    """Gets a line per check."""
    prune: Callable[[int, float], bool] | None = None
    """A sweep's pruner (`RunControls.prune`): True after a check stops the run there."""
    checks: list[tuple[int, float]] = field(default_factory=list)
    """Every check so far: (step, mean validation loss per decision)."""
    best_step: int = 0
    best_loss: float = math.inf
    best_parameters: dict[str, torch.Tensor] | None = None
    pruned_at: int | None = None
    """The step a sweep's pruner stopped the run at."""

    @property
    def patience(self) -> int | None:
        return self.config.early_stopping

    def stops(
        self,
        step: int,
        total: int,
        model: torch.nn.Module,
        trainable: dict[str, torch.nn.Parameter],
        batch_of: Callable[[list[Any]], dict[str, torch.Tensor]],
        dtype,
    ) -> bool:
        """At a check's step, score the validation loss (keeping the weights when it is the best so far); True
        when the run should stop there: `patience` checks in a row without a lower loss."""
        if step not in check_steps(total, self.config.validation_checks):
            return False
        loss = validation_loss(model, self.examples, self.task, batch_of, dtype, self.config.eval_batch_size)
        self.checks.append((step, loss))
        if loss < self.best_loss:
            self.best_step, self.best_loss = step, loss
            if self.patience is not None:  # kept only where they may be put back
                self.best_parameters = {
                    name: p.detach().to("cpu", copy=True) for name, p in trainable.items()
                }
        if self.report is not None:
            self.report(
                f"validation loss {loss:.4f} at step {step} of {total} "
                f"(best {self.best_loss:.4f} at step {self.best_step})"
            )
        if self.prune is not None and self.prune(step, loss):
            self.pruned_at = step
            return True
        waited = sum(1 for s, _ in self.checks if s > self.best_step)
        return self.patience is not None and waited >= self.patience

    def stopped(self, step: int, total: int) -> str:
        """The line a run says when it stops early."""
        if self.pruned_at is not None:
            return (
                f"pruned at step {step} of {total}: the sweep's pruner found validation loss "
                f"{self.checks[-1][1]:.4f} worse than the earlier trials' at this point"
            )
        return (
            f"stopped early at step {step} of {total}: the validation loss has not fallen for "
            f"{self.patience} checks (best {self.best_loss:.4f} at step {self.best_step}, whose weights the "
            "model keeps)"
        )

    def restore_best(self, trainable: dict[str, torch.nn.Parameter], step: int) -> bool:
        """Put the best check's weights back when early stopping is on and training ended past it; whether it
        did. (Without early stopping the checks only watch, for a pruner: the run ends with its last
        weights.)"""
        if self.patience is None or self.best_parameters is None or self.best_step == step:
            return False
        with torch.no_grad():
            for name, p in trainable.items():
                p.copy_(self.best_parameters[name].to(p.device))
        return True

    def summary(self, step: int) -> dict[str, Any]:
        """What the run records: its checks, the best step and loss, and the step training ended at."""
        return {
            "checks": [list(c) for c in self.checks],
            "best_step": self.best_step,
            "best_loss": self.best_loss if self.checks else None,
            "ended_at": step,
            "patience": self.patience,
            "pruned_at": self.pruned_at,
        }

    def to_state(self) -> dict[str, Any]:
        """What a training checkpoint carries of it, so a resumed run stops where the whole run would."""
        return {
            "checks": list(self.checks),
            "best_step": self.best_step,
            "best_loss": self.best_loss,
            "best_parameters": self.best_parameters,
        }

    def load_state(self, state: dict[str, Any] | None) -> None:
        if state:
            self.checks, self.best_step = [tuple(c) for c in state["checks"]], state["best_step"]
            self.best_loss, self.best_parameters = state["best_loss"], state["best_parameters"]


def validation_loss(
    model: torch.nn.Module,
    examples: Sequence[Any],
    task: BatchTask,
    batch_of: Callable[[list[Any]], dict[str, torch.Tensor]],
    dtype,
    batch_size: int,
) -> float:
    """The mean training loss per decision over `examples`, in eval mode without gradients (train mode
    after)."""
    model.eval()
    total, decisions = 0.0, 0
    ordered = sorted(examples, key=len)  # batches of like lengths: less padding
    with torch.no_grad():
        for start in range(0, len(ordered), batch_size):
            chunk = ordered[start : start + batch_size]
            total += float(task.summed_loss(model, batch_of(chunk), dtype))
            decisions += sum(task.decisions(e) for e in chunk)
    model.train()
    return total / max(1, decisions)
