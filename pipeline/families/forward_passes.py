"""Pieces of a forward pass that every family's scoring and serving share: autocast, length grouping, and
mean-pooled state vectors."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import torch


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """Autocast for the backbone, or nothing for fp32."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (less padding), longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def bounded_batches(lengths: list[int], batch_size: int, max_padding: float | None) -> list[list[int]]:
    """`length_batches`, with a pass also cut where the next sequence would make padding more than
    `max_padding` of the tokens the pass computes (None: cut by size alone): more, smaller passes for less
    padding.

    Serving does not use it: measured side by side (`benchmarks/bench_forward.py --bounds 0.05 0.1 0.2`), the
    runtimes' passes of 16 pad 12.2% of their tokens and passes cut at 5% pad 4.3%, yet run no faster (ONNX
    Runtime 26.9 against 26.7 req/s, OpenVINO 31.9 against 30.6): the smaller passes cost what the padding
    saved."""
    if max_padding is None:
        return length_batches(lengths, batch_size)
    passes: list[list[int]] = []
    real = 0
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        current = passes[-1] if passes else []
        widest = lengths[current[0]] if current else 0
        grown = 1 - (real + lengths[index]) / max(1, widest * (len(current) + 1))
        if not current or len(current) == batch_size or grown > max_padding:
            passes.append([index])
            real = lengths[index]
        else:
            current.append(index)
            real += lengths[index]
    return passes


def forward_batch_size(device: torch.device) -> int:
    """Sequences per serving pass: on the CPU, passes of more than ~16 sequences run slower per sequence
    (measured: 8 five-question requests took 63 ms each in passes of 8-16, 82 ms in one pass of 40)."""
    return 16 if device.type == "cpu" else 128


STATE_VECTOR_TOKENS = 128
"""The state tokens a state vector reads (`DecisionFamily.state_vectors`): what a state is about shows in its
opening, and the novelty gate's pass stays short beside the answer's."""


@torch.inference_mode()
def mean_pooled(
    hidden: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    sequences: list[list[int]],
    pad_id: int,
    device: torch.device,
    dtype: torch.dtype | None = None,
) -> np.ndarray:
    """[sequences, width] float32: each token sequence's hidden states (`hidden(input_ids, attention_mask)`)
    averaged over its tokens, in passes of similar lengths (padding masked, so a vector does not depend on its
    batch)."""
    vectors: dict[int, np.ndarray] = {}
    filled = [i for i, s in enumerate(sequences) if s]  # an empty sequence reads nothing: a zero vector
    for batch in length_batches([len(sequences[i]) for i in filled], forward_batch_size(device)):
        indices = [filled[b] for b in batch]
        width = max(len(sequences[i]) for i in indices)
        ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(indices), width), dtype=torch.long)
        for row, index in enumerate(indices):
            ids[row, : len(sequences[index])] = torch.tensor(sequences[index])
            mask[row, : len(sequences[index])] = 1
        ids, mask = ids.to(device), mask.to(device)
        with autocast_context(device, dtype):
            states = hidden(ids, mask).to(device).float()
        pooled = (states * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True)
        vectors |= {index: pooled[row].cpu().numpy() for row, index in enumerate(indices)}
    width = next(iter(vectors.values())).shape[0] if vectors else 0
    zero = np.zeros(width, dtype=np.float32)
    return (
        np.stack([vectors.get(i, zero) for i in range(len(sequences))])
        .astype(np.float32)
        .reshape(len(sequences), width)
    )
