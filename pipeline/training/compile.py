"""Compile a decision model's encoder layers in place for a training run, and put them back after.

The trainer decides, then wraps its loop (padding each batch to a bucket while compiled):

    enabled, reason = decide_compile(device, forward_passes, config)
    with no_cudnn_sdpa(), compiled_encoder(model, config, enabled, reason, warmup, loss_fn, pad_id) as report:
        for batch in batches:
            batch = pad_to_bucket(batch, pad_id, config) if report.enabled else batch
            ...

Design (why each piece is there):

* `nn.Module.compile` per encoder layer, not `torch.compile(module)`: the wrapper module would add
  `_orig_mod.` to every parameter name, and checkpoints, LoRA merges and optimizers key on names.
* Static shapes in `bucket`-token steps up to `max_static_len`; longer batches run one graph with a
  dynamic sequence length. The batch dimension is always dynamic, because the collate flattens a
  variable number of items per decision into rows.
* Every layer compiles the same code object, so all their graphs share one dynamo cache. Layer 0's
  input may not require grad (frozen embeddings under LoRA) while the others' do, which doubles the
  graphs per shape; dynamo's default limit of 8 would silently send the run back to eager after four
  buckets. The limit is raised for the run and restored after.
* A warm-up forward and backward per example batch compiles every graph before step one, with the
  RNG forked and the parameters' `.grad` put back, so a compiled run and an eager run see the same
  random stream and the same first step.
* A failure to compile or warm up is logged once and the run goes on eagerly: compiling is an
  optimisation, never a reason to lose a run. After the warm-up, dynamo's `suppress_errors` is on for
  the same reason (a late compile error runs that call eagerly).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from pipeline.families.planned_layers import physical_layers

ENV_VAR = "DECISION_COMPILE"
_log = logging.getLogger(__name__)

# Graph variants one static shape can need: layer 0's input with and without requires_grad, times
# training and evaluation (grad mode and `model.training` are guarded on), times a batch of one
# (dynamo specialises a dynamic size of 1).
_GRAPHS_PER_SHAPE = 8
# Room for the dynamic-length graphs.
_LIMIT_MARGIN = 16

Batch = dict[str, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass(frozen=True)
class CompileConfig:
    """How the encoder layers are compiled and which sequence lengths get static graphs."""

    bucket: int = 64
    """Static shapes step in this many tokens: a batch is padded up to the next multiple."""
    max_static_len: int = 1024
    """Longest padded length with a static graph; longer batches share one dynamic-length graph."""
    min_forward_passes: int = 4000
    """Auto rule: compile CUDA runs with at least this many forward passes (compiling costs minutes)."""
    mode: str | None = None
    """`torch.compile` mode (None: the backend's default), e.g. "max-autotune-no-cudagraphs"."""
    backend: str = "inductor"
    """`torch.compile` backend; tests use "eager" or "aot_eager": the same dynamo graphs and guards, far
    faster."""

    def __post_init__(self) -> None:
        if self.bucket < 1:
            raise ValueError(f"CompileConfig.bucket: must be >= 1, got {self.bucket}")
        if self.max_static_len < self.bucket or self.max_static_len % self.bucket:
            raise ValueError(
                f"CompileConfig.max_static_len: must be a positive multiple of bucket ({self.bucket}), "
                f"got {self.max_static_len}"
            )
        if self.min_forward_passes < 0:
            raise ValueError(f"CompileConfig.min_forward_passes: must be >= 0, got {self.min_forward_passes}")


@dataclass
class CompileReport:
    """What `compiled_encoder` did; the dynamo counts are filled after the warm-up and again on exit."""

    enabled: bool
    reason: str
    fallback_error: str | None = None
    """`Type: message` of the error that sent the run back to eager; None when it did not."""
    graphs_compiled: int = 0
    """Graphs dynamo compiled since the context was entered (warm-up and run)."""
    recompiles_after_warmup: int = 0
    """Frames dynamo compiled (or tried to) after the warm-up; 0 when the warm-up covered the run."""
    recompile_limit_hits: int = 0
    """Times dynamo gave up on a frame at a recompile limit and ran it eagerly."""
    warmup_seconds: float = 0.0


def decide_compile(
    device: torch.device, forward_passes: int, config: CompileConfig, env: Mapping[str, str] = os.environ
) -> tuple[bool, str]:
    """Whether to compile and why: `DECISION_COMPILE=0|1` forces it; otherwise CUDA runs long enough.

    An empty `DECISION_COMPILE` counts as unset; any other value is a ValueError naming the variable.
    """
    forced = env.get(ENV_VAR, "")
    if forced == "1":
        return True, f"forced on by {ENV_VAR}=1"
    if forced == "0":
        return False, f"forced off by {ENV_VAR}=0"
    if forced:
        raise ValueError(f"{ENV_VAR} must be 0 or 1 (or unset for the auto rule), got {forced!r}")
    if device.type != "cuda":
        # Measured slower than eager on CPU at this model size, compile time included.
        return False, f"off on {device.type.upper()}"
    if forward_passes >= config.min_forward_passes:
        return True, f"auto: CUDA and {forward_passes:,} forward passes"
    return False, f"auto: off, CUDA but {forward_passes:,} forward passes (< {config.min_forward_passes:,})"


def bucket_length(length: int, config: CompileConfig) -> int:
    """The padded length for `length` tokens: the next bucket multiple, or `length` beyond the static
    limit."""
    if length < 1:
        raise ValueError(f"bucket_length: length must be >= 1, got {length}")
    if length > config.max_static_len:
        return length
    return math.ceil(length / config.bucket) * config.bucket


def pad_to_bucket(batch: Batch, pad_id: int, config: CompileConfig) -> Batch:
    """A new batch whose tokens are padded to `bucket_length`; the input is left untouched.

    Padding tokens get `pad_id` and attention 0: they are masked keys and no marker points at them,
    so every logit and the loss are unchanged. A batch with no padding at all gets one bucket more
    (past the static limit, one token more): HF's SDPA path drops an all-ones mask, and a layer called
    without a mask is a second graph for the same shape, which the warm-up would not cover.
    """
    for key in ("position_ids", "option_ids"):
        if key in batch:
            raise ValueError(f"pad_to_bucket: batch has {key!r} (parallel layout), which is not bucketed")
    length = batch["input_ids"].shape[1]
    extra = _padded_length(batch, config) - length
    if extra == 0:
        return dict(batch)
    pad = torch.nn.functional.pad
    return {
        **batch,
        "input_ids": pad(batch["input_ids"], (0, extra), value=pad_id),
        "attention_mask": pad(batch["attention_mask"], (0, extra), value=0),
    }


def _padded_length(batch: Batch, config: CompileConfig) -> int:
    length = batch["input_ids"].shape[1]
    target = bucket_length(length, config)
    if target == length and bool(batch["attention_mask"].all()):
        return bucket_length(length + 1, config)
    return target


def pick_warmup_batches(batches: Iterable[Batch], config: CompileConfig) -> list[Batch]:
    """The first batch of each bucket length the run will see, plus the first beyond the static limit."""
    picked: dict[int, Batch] = {}
    for batch in batches:
        padded = _padded_length(batch, config)
        # One long batch is enough: every longer length reuses its dynamic graph.
        key = padded if padded <= config.max_static_len else -1
        picked.setdefault(key, batch)
    return list(picked.values())


def encoder_layers(encoder: nn.Module) -> nn.ModuleList:
    """The encoder's repeated blocks: BERT's `encoder.layer`, else its largest ModuleList of one block
    type."""
    inner = getattr(encoder, "encoder", None)
    if isinstance(getattr(inner, "layer", None), nn.ModuleList):
        # Each physical layer once, even under a layer plan: a layer visited twice is one compiled module.
        return physical_layers(encoder)
    candidates = [
        module
        for module in encoder.modules()
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1
    ]
    if not candidates:
        raise ValueError(f"encoder_layers: no ModuleList of blocks in {type(encoder).__name__}")
    return max(candidates, key=lambda m: sum(p.numel() for p in m.parameters()))


@contextmanager
def no_cudnn_sdpa() -> Iterator[None]:
    """Keep the cuDNN SDPA backend out of the decision forward on CUDA; a no-op without CUDA."""
    if not torch.cuda.is_available():
        yield
        return
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


@contextmanager
def compiled_encoder(
    model: nn.Module,
    config: CompileConfig,
    enabled: bool,
    reason: str,
    warmup_batches: list[Batch],
    loss_fn: LossFn,
    pad_id: int = 0,
    backbone: nn.Module | None = None,
) -> Iterator[CompileReport]:
    """Compile the layers of `backbone` (default `model.encoder`) in place, warm them up, yield a report;
    always eager again on exit.

    `loss_fn(model, batch)` must be the loop's own forward and loss (same autocast, same mode), so the
    warm-up compiles the graphs the loop will ask for (`pick_warmup_batches` chooses one per bucket).
    Warm-up batches are padded here with `pad_id`. Pad evaluation batches too: an unpadded length is a
    new graph, and evaluation (no grad, eval mode) compiles its own graphs on first use, counted in
    `recompiles_after_warmup`. A failure to compile or warm up is logged once and yields
    `enabled=False` with `fallback_error` set, layers eager. On exit the layers are eager and dynamo's
    limits are restored; the compiled graphs stay in dynamo's cache until `torch._dynamo.reset()`.
    """
    report = CompileReport(enabled=enabled, reason=reason)
    if not enabled:
        yield report
        return
    layers = encoder_layers(backbone if backbone is not None else model.encoder)
    start = _dynamo_counts()
    with ExitStack() as stack:
        stack.enter_context(_raised_recompile_limit(config))
        stack.enter_context(_non_reentrant_checkpointing(layers))
        stack.callback(_restore_eager, layers)
        began = time.perf_counter()
        error = _compile_and_warm_up(
            model, layers, config, [pad_to_bucket(b, pad_id, config) for b in warmup_batches], loss_fn
        )
        report.warmup_seconds = time.perf_counter() - began
        if error is None:
            stack.enter_context(_dynamo_config(suppress_errors=True))
        else:
            report.enabled, report.fallback_error = False, error
            _log.warning("compiling the encoder layers failed (%s); training eagerly", error)
            stack.close()  # the fallback run is exactly the uncompiled one
        warm = _dynamo_counts()
        _fill_counts(report, start, warm, warm)
        try:
            yield report
        finally:
            _fill_counts(report, start, warm, _dynamo_counts())


def _compile_and_warm_up(
    model: nn.Module, layers: nn.ModuleList, config: CompileConfig, batches: list[Batch], loss_fn: LossFn
) -> str | None:
    """Compile every layer and run the warm-up; the error as `Type: message`, or None."""
    # Errors must surface here, where falling back is still clean, even if the user asked dynamo to suppress.
    with _dynamo_config(suppress_errors=False):
        try:
            for layer in layers:
                _compile_layer(layer, config)
            _warm_up(model, batches, loss_fn)
        # Deliberately broad: any failure of an optimisation (inductor, a C++ toolchain, an
        # unsupported op, OOM in the largest bucket) must leave a trainable eager model, not a crash.
        except Exception as error:
            return f"{type(error).__name__}: {error}"
    return None


def _compile_layer(layer: nn.Module, config: CompileConfig) -> None:
    """`layer.compile` (keeps parameter names), then mark the dimensions that may vary as dynamic."""
    kwargs: dict[str, Any] = {"backend": config.backend, "dynamic": False}
    if config.mode is not None:
        kwargs["mode"] = config.mode
    layer.compile(**kwargs)
    layer._compiled_call_impl = partial(_call_marked, layer._compiled_call_impl, config.max_static_len)


def _call_marked(compiled: Callable[..., Any], max_static_len: int, *args: Any, **kwargs: Any) -> Any:
    """Call the compiled layer with the batch dim, and a sequence dim past the static limit, dynamic.

    Marking has to happen on the layer's own inputs, which the (eager) embeddings create each call.
    `maybe_mark_dynamic` lets dynamo specialise where it must (a batch of one) instead of raising.
    """
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if not tensors or tensors[0].dim() < 2:
        return compiled(*args, **kwargs)
    hidden, length = tensors[0], tensors[0].shape[1]
    for tensor in tensors:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
        if length <= max_static_len:
            continue
        # hidden is [B, L, D]: only its dim 1 is the sequence, even if D happens to equal L.
        dims = [1] if tensor is hidden else [d for d in range(1, tensor.dim()) if tensor.shape[d] == length]
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return compiled(*args, **kwargs)


def _warm_up(model: nn.Module, batches: list[Batch], loss_fn: LossFn) -> None:
    """Forward and backward every batch without moving the RNG or any parameter's `.grad`."""
    params = list(model.parameters())
    device = params[0].device
    saved = [p.grad for p in params]
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device.type == "cuda"
        else []
    )
    try:
        for p in params:
            p.grad = None  # so backward allocates fresh tensors instead of adding into the saved ones
        with torch.random.fork_rng(devices=devices):
            for batch in batches:
                loss_fn(model, {k: v.to(device) for k, v in batch.items()}).backward()
    finally:
        for p, grad in zip(params, saved):
            p.grad = grad


def _restore_eager(layers: nn.ModuleList) -> None:
    """Drop each layer's compiled call so `_compiled_call_impl` is the class default None again."""
    for layer in layers:
        layer.__dict__.pop("_compiled_call_impl", None)


@contextmanager
def _non_reentrant_checkpointing(layers: nn.ModuleList) -> Iterator[None]:
    """Switch checkpointed layers to non-reentrant checkpointing for the run; dynamo cannot trace
    reentrant."""
    swapped = []
    for layer in layers:
        func = getattr(layer, "_gradient_checkpointing_func", None)
        # HF stores `partial(checkpoint, **kwargs)`; anything else is the caller's own and left alone.
        if not (getattr(layer, "gradient_checkpointing", False) and isinstance(func, partial)):
            continue
        if func.keywords.get("use_reentrant") is not False:
            layer._gradient_checkpointing_func = partial(
                func.func, *func.args, **{**func.keywords, "use_reentrant": False}
            )
            swapped.append((layer, func))
    try:
        yield
    finally:
        for layer, func in swapped:
            layer._gradient_checkpointing_func = func


def _needed_recompile_limit(config: CompileConfig) -> int:
    return _GRAPHS_PER_SHAPE * (config.max_static_len // config.bucket) + _LIMIT_MARGIN


@contextmanager
def _raised_recompile_limit(config: CompileConfig) -> Iterator[None]:
    """Raise dynamo's per-code and accumulated recompile limits to fit the buckets; restore after."""
    dyn = torch._dynamo.config
    # torch >= 2.6 says recompile_limit; older releases only know cache_size_limit.
    name = "recompile_limit" if hasattr(dyn, "recompile_limit") else "cache_size_limit"
    total = (
        "accumulated_recompile_limit"
        if hasattr(dyn, "accumulated_recompile_limit")
        else "accumulated_cache_size_limit"
    )
    needed = _needed_recompile_limit(config)
    values = {name: max(getattr(dyn, name), needed)}
    if hasattr(dyn, total):
        values[total] = max(getattr(dyn, total), needed)
    with _dynamo_config(**values):
        yield


@contextmanager
def _dynamo_config(**values: Any) -> Iterator[None]:
    """Set `torch._dynamo.config` attributes and put the old values back."""
    dyn = torch._dynamo.config
    old = {name: getattr(dyn, name) for name in values}
    for name, value in values.items():
        setattr(dyn, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(dyn, name, value)


@dataclass(frozen=True)
class _Counts:
    graphs: int
    frames: int
    limit_hits: int


def _dynamo_counts() -> _Counts:
    """torch 2.13 keeps no recompile counter: frames["total"] counts every frame dynamo converted."""
    hits = sum(n for key, n in counters["unimplemented"].items() if "recompile limit" in key.lower())
    return _Counts(counters["stats"]["unique_graphs"], counters["frames"]["total"], hits)


def _fill_counts(report: CompileReport, start: _Counts, warm: _Counts, now: _Counts) -> None:
    report.graphs_compiled = now.graphs - start.graphs
    report.recompiles_after_warmup = now.frames - warm.frames
    report.recompile_limit_hits = now.limit_hits - start.limit_hits
