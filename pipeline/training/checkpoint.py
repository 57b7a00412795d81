"""Training checkpoints: the state a killed run needs to carry on where it was, written so a kill never breaks
it.

A checkpoint holds what training changes and nothing it can rebuild: the parameters that require grad (the
head, LoRA adapters or the whole encoder, as the method trains), the optimizer and learning-rate schedule
states, the RNG states, and the loop's position and tallies (step, decisions, logged steps, the loss summed
since the last logging step). The data order is a pure function of the config (`loop.plan_windows`), so the
step is the position in it. The file is written beside itself and swapped in with `os.replace`, so a kill
mid-write leaves the previous checkpoint whole.

    saver = Checkpointer(RunFolder(run_dir).checkpoint, config)
    train(model, examples, config, device, task, checkpoints=saver)   # saves every N steps / M minutes
    train(model, examples, config, device, task, checkpoints=saver)   # after a kill: "resumed from step N"
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import TrainConfig

# How often to save is not what is trained, nor how many ranks share a window (a checkpoint holds the whole
# state), nor how many CPU threads compute it: changing any must not orphan a checkpoint.
NOT_FINGERPRINTED = (
    "checkpoint_every_steps",
    "checkpoint_every_minutes",
    "nproc",
    "dist_timeout_minutes",
    "threads",
)


@dataclass
class TrainState:
    """Everything the loop needs to continue a run from `step`."""

    step: int
    fingerprint: str
    parameters: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    tallies: dict[str, Any] = field(default_factory=dict)


def fingerprint(config: TrainConfig, n_examples: int, planned_steps: int) -> str:
    """What a checkpoint must match to be resumed: the training config, the example count and the budget.

    The data's bytes are not in it: the flow's run folder is named by the idempotency key (data, base, params
    and code), so a checkpoint found there was written for the same inputs; this guards the rest.
    """
    described = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in NOT_FINGERPRINTED}
    text = json.dumps([described, n_examples, planned_steps], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def rng_states() -> dict[str, Any]:
    """Python's, NumPy's and torch's generators (CUDA's too where there is one): dropout draws from them."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters training changes, by name (read before any compile wrapper renames them)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def load_parameters(parameters: dict[str, torch.nn.Parameter], saved: dict[str, torch.Tensor]) -> None:
    """Copy saved values into the model's trainable parameters; the two sets of names must be the same."""
    if set(saved) != set(parameters):
        missing, extra = sorted(set(parameters) - set(saved)), sorted(set(saved) - set(parameters))
        raise ValueError(
            f"checkpoint parameters do not fit the model: missing {missing[:5]}, extra {extra[:5]}"
        )
    with torch.no_grad():
        for name, value in saved.items():
            parameters[name].copy_(value)


class Checkpointer:
    """Where a run's training state goes and when: every `train.checkpoint_every_steps` steps or
    `train.checkpoint_every_minutes` minutes, whichever comes first, and at the last step."""

    def __init__(
        self, path: str | Path, config: TrainConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.every_steps, self.every_s = config.checkpoint_every_steps, config.checkpoint_every_minutes * 60
        self.clock = clock
        self.last_saved = clock()

    def beside(self, name: str) -> Checkpointer:
        """A checkpointer as this one, to a file of its own beside this one's (`checkpoint.NAME.pt`): one of a
        run's candidates (`DecisionFamily.candidates`)."""
        other = copy.copy(self)
        other.path = self.path.with_name(f"{self.path.stem}.{name}{self.path.suffix}")
        return other

    def due(self, step: int, total: int) -> bool:
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_s > 0 and self.clock() - self.last_saved >= self.every_s
        return by_steps or by_time or step == total

    def save(self, state: TrainState) -> None:
        """Write the state beside the checkpoint, flush it to disk, then swap it in (one rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f"{self.path.name}.partial")
        with partial.open("wb") as handle:
            torch.save(asdict(state), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, self.path)
        _sync_folder(self.path.parent)
        self.last_saved = self.clock()

    def load(self, expected: str) -> TrainState | None:
        """The saved state when there is one for this fingerprint, else None (nothing saved, or another
        run's)."""
        if not self.path.is_file():
            return None
        # weights_only=False: the file holds RNG states (tuples, NumPy arrays); it is this run folder's own.
        state = TrainState(**torch.load(self.path, map_location="cpu", weights_only=False))
        return state if state.fingerprint == expected else None


def _sync_folder(folder: Path) -> None:
    # The rename lives in the folder's entry: without this a power cut could still lose it (a kill cannot).
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
