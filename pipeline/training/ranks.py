"""Data-parallel ranks: which share of each window a process trains on, and the one all-reduce per step.

Every rank plans the same windows (`loop.plan_windows` is a pure function of the config) and trains on every
`world`-th item of each, starting at its `rank`. Its micro-batch losses are divided by the whole window's item
count, so the all-reduced (summed) gradient is exactly the window's mean-loss gradient of one process.

The gradients are all-reduced explicitly, one flat buffer per optimizer step, rather than by wrapping the
model in `DistributedDataParallel`: DDP reduces only through its wrapper's `forward`, and the Laya family's
loss calls the encoder, type embedding and scorer of the model directly
(`families.laya.forward.decision_logits`), while the compile wrapper (`training.compile`) swaps encoder layers
in place. With gradient accumulation DDP would reduce once per window too (`no_sync` on the other
micro-batches); here that one reduction also carries the window's summed loss and which parameters got a
gradient (a parameter no rank reached stays without one, so AdamW skips it as on one process).

    ranks = join_ranks(torch.device("cpu"), timeout_minutes=30)   # under torchrun: RANK, WORLD_SIZE, ...
    loss = ranks.reduce(params, local_loss)                        # after backward, before the optimizer step
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Ranks:
    """This process's place among the data-parallel ranks (world 1: training alone, nothing to reduce)."""

    rank: int = 0
    world: int = 1
    reduce_seconds: float = field(default=0.0, compare=False)
    """Seconds spent in the gradient all-reduce so far (the benchmark's all-reduce share of a step)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that scores held-out decisions, writes checkpoints and reports."""
        return self.rank == 0

    def shard(self, window: Sequence[int]) -> list[int]:
        """This rank's items of a window: every `world`-th, from `rank` (possibly none of a short window)."""
        return list(window[self.rank :: self.world])

    def broadcast(self, parameters: Sequence[torch.Tensor]) -> None:
        """Rank 0's values into every rank's parameters (a fresh head or adapter is initialised per
        process)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for parameter in parameters:
                dist.broadcast(parameter.data, src=0)

    def reduce(self, parameters: Sequence[torch.nn.Parameter], loss: torch.Tensor) -> torch.Tensor:
        """Sum the ranks' gradients into every rank's `.grad` and return the summed loss (one all-reduce)."""
        if self.world == 1:
            return loss
        started = time.perf_counter()
        reached = [p.grad is not None for p in parameters]
        flat = torch.cat(
            [_flat_grad(p) for p in parameters]
            + [
                torch.tensor(reached, dtype=torch.float32, device=loss.device),
                loss.detach().float().reshape(1),
            ]
        )
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for parameter, reached_somewhere in zip(parameters, flat[-1 - len(parameters) : -1].tolist()):
            size = parameter.numel()
            if reached_somewhere:
                parameter.grad = flat[offset : offset + size].view_as(parameter).to(parameter.dtype)
            offset += size
        self.reduce_seconds += time.perf_counter() - started
        return flat[-1].to(loss.dtype)


def _flat_grad(parameter: torch.nn.Parameter) -> torch.Tensor:
    grad = parameter.grad
    zeros = torch.zeros(parameter.numel(), dtype=torch.float32, device=parameter.device)
    return zeros if grad is None else grad.detach().float().reshape(-1)


def join_ranks(device: torch.device, timeout_minutes: float) -> Ranks:
    """Join the process group torchrun set up (`RANK`, `WORLD_SIZE`, `MASTER_ADDR` in the environment): NCCL
    on CUDA, gloo on the CPU, with a timeout so that a rank stuck in a collective fails instead of hanging."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = dt.timedelta(minutes=timeout_minutes)
    if device.type == "cuda":
        dist.init_process_group(backend, timeout=timeout, device_id=device)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return Ranks(dist.get_rank(), dist.get_world_size())


def leave_ranks() -> None:
    """Leave the process group (after the last collective)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: torch.device) -> torch.device:
    """The device of this rank: its own GPU (`LOCAL_RANK`) when training on CUDA, else the one given."""
    if device.type != "cuda":
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)
