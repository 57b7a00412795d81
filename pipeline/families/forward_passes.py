"""Pieces of a forward pass that every family's scoring and serving share: autocast and length grouping."""

from __future__ import annotations

from contextlib import nullcontext

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
