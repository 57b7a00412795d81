"""What every row of the GPU check works with: the device, models and rows of data built where the check runs
(random weights: nothing downloaded or carried), and the `Outcome` a row returns.

Three sizes: `tiny` (the test suite's tiny models; the CPU dry run), `small` (a GPU run): a Laya-layout base
with the MiniLM encoder's shapes (6 layers, width 384, 12 heads, feed-forward 1536; a 152-token vocabulary)
and a Qwen3 causal LM of similar size, on short states, and `long`: `small` on states of about 100 tokens. The
real MiniLM base does not travel: its fp16 weights alone are 43 MiB (22.7 M parameters), more than the whole
check may carry (40 MiB), and the timings depend on its shapes, not its values.

Records are `pipeline.data.synthetic`'s clean rows read with the contract's own parsers
(`tests.tiny.synthetic_records`): no file, no validation pass.

    sizes = SIZES["tiny"]
    bases = write_bases(folder, sizes)
    records = synthetic_records(sizes.rows, seed=0, state_chars=sizes.state_chars)
    setup = Setup(torch.device("cpu"), sizes, bases, records, "eager", folder)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from pipeline.data.contract import Record
from tests.tiny import write_tiny_base, write_tiny_causal_lm


@dataclass(frozen=True)
class Sizes:
    """How big the check's models, data and runs are."""

    laya: dict[str, Any]
    """`tests.tiny.write_tiny_base` arguments (layers, hidden, heads, intermediate, max_len)."""
    causal_lm: dict[str, Any]
    """`tests.tiny.write_tiny_causal_lm` arguments (hidden, layers, and config sizes)."""
    rows: int
    """Synthetic rows (three decisions each: choice, score, noul)."""
    state_chars: int
    """Characters of each row's state: short enough that every sequence falls in one compile bucket."""
    steps: int
    """Optimizer steps per training run."""
    micro_batch: int
    grad_accum: int
    lora_r: int = 8


SIZES = {
    "tiny": Sizes(
        laya={"layers": 2},
        causal_lm={"hidden": 64, "layers": 2},
        rows=32,
        state_chars=16,
        steps=4,
        micro_batch=8,
        grad_accum=1,
    ),
    "small": Sizes(
        laya={"layers": 6, "hidden": 384, "heads": 12, "intermediate": 1536, "max_len": 128},
        causal_lm={
            "hidden": 512,
            "layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "intermediate_size": 1536,
        },
        rows=256,
        state_chars=16,
        steps=20,
        micro_batch=32,
        grad_accum=2,
        lora_r=16,
    ),
}
# `small` at the lengths real rows have (states of ~100 tokens, every sequence near the window of 128) and the
# stage's micro-batch of 64: whether bf16 and compiling pay where the work is not dwarfed by per-step
# overheads.
SIZES["long"] = replace(SIZES["small"], state_chars=100, micro_batch=64, grad_accum=1)


@dataclass(frozen=True)
class Bases:
    """Where the check's base models were written."""

    laya: Path
    """A Laya-layout base (the laya family; the joint family can start from it too)."""
    causal_lm: Path
    """A Qwen3 causal LM with a byte-level BPE tokenizer (the joint family, LoRA and QLoRA)."""


def write_bases(folder: Path, sizes: Sizes, seed: int = 0) -> Bases:
    """Both random bases under `folder` (seeded: the same sizes and seed give the same weights)."""
    return Bases(
        write_tiny_base(folder / "laya", seed=seed, **sizes.laya),
        write_tiny_causal_lm(folder / "causal_lm", seed=seed, **sizes.causal_lm),
    )


@dataclass(frozen=True)
class Setup:
    """What the rows share: the device, the sizes, the bases, the records and a scratch folder."""

    device: torch.device
    sizes: Sizes
    bases: Bases
    records: list[Record]
    backend: str
    """`torch.compile` backend of the compiled runs: inductor on CUDA; the dry run's "eager" captures the same
    graphs with the same guards (dynamo) and runs them eagerly: generating code on a CPU would take
    minutes."""
    work: Path


@dataclass
class Outcome:
    """A row's result: pass, fail or skipped, why (the problems found, or what was measured), and its
    numbers."""

    status: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def judged(problems: list[str], summary: str, numbers: dict[str, Any]) -> Outcome:
    """Pass with `summary`, or fail naming every problem found (and the summary after them)."""
    if problems:
        return Outcome("fail", "; ".join(problems) + f" ({summary})", numbers)
    return Outcome("pass", summary, numbers)
