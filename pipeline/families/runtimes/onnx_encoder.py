"""A family's serving encoder as an ONNX graph run by ONNX Runtime (the `onnx` extra), fp32 on the CPU.

The graph is the encoder pass the family's serving code runs on padded batches: `(input_ids, attention_mask)`,
both int64 [batch, tokens], to the hidden states the head reads, fp32 [batch, tokens, width]. Both axes are
dynamic, so a batch pays for its own longest sequence only (no padding to a fixed length); padding is masked,
so a sequence's hidden states do not depend on its batch-mates.

    export_encoder(family.served_encoder(loaded), Path("cache/encoder.onnx"))
    encoder = OnnxEncoder(Path("cache/encoder.onnx"))
    hidden = encoder(input_ids, attention_mask)          # a torch.Tensor, as the torch encoder returns

A runtime's thread count is fixed when its session is built, while the server's thread governor moves torch's
count with the load on the machine (`pipeline.cpu.load`): `SessionsByThreads` keeps one session per count the
calling thread has asked for, so the runtime follows the governor as torch does.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import torch
from torch import nn

ONNX_FILE = "encoder.onnx"
OPSET = 17  # scaled_dot_product_attention and LayerNormalization export natively from opset 17 on
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "hidden"
SESSIONS_KEPT = 3  # sessions per runtime, by thread count: the governor moves between a few counts only

Session = TypeVar("Session")


def onnxruntime_missing() -> str | None:
    """Why ONNX Runtime cannot serve here (one line naming what to install), or None when it can."""
    for package in ("onnxruntime", "onnx"):  # the runtime, and the graph format torch's exporter writes
        try:
            importlib.import_module(package)
        except ImportError as error:
            return f"{package} cannot be imported ({error}): pip install 'decision-pipeline[onnx]'"
    return None


def export_encoder(encoder: nn.Module, path: Path) -> Path:
    """Write `encoder` (a module `(input_ids, attention_mask) -> hidden`) as an ONNX graph at `path`, staged
    beside it and renamed into place, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids, mask = _trace_inputs(encoder)
    axes = {name: {0: "batch", 1: "tokens"} for name in (*INPUTS, OUTPUT)}
    handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(handle)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The tracer's notes on Python values it keeps as constants (shape checks the mask makes moot) and
            # on advanced indexing (no negative indices here): expected, and noise in a server's start-up log.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="Exporting aten::index operator")
            torch.onnx.export(
                encoder.eval(),
                (ids, mask),
                staged,
                dynamo=False,
                input_names=list(INPUTS),
                output_names=[OUTPUT],
                dynamic_axes=axes,
                opset_version=OPSET,
            )
        os.replace(staged, path)
    finally:
        Path(staged).unlink(missing_ok=True)
    return path


def _trace_inputs(encoder: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences, one padded: traced with padding, the graph keeps the mask (an all-ones mask lets the
    encoder skip it, and the graph would then attend to padding)."""
    ids = torch.full((2, 8), 1, dtype=torch.long)
    ids[:, 0] = 2
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids.to(_device_of(encoder)), mask.to(_device_of(encoder))


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


class EncoderPass(nn.Module):
    """A model's encoder pass as a module of its own: `run(input_ids, attention_mask)` on the parameters of
    `owner` (registered, so the export holds them as the graph's weights)."""

    def __init__(self, owner: nn.Module, run) -> None:
        super().__init__()
        self.owner = owner
        self._run = run

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._run(input_ids, attention_mask)


class SessionsByThreads(Generic[Session]):
    """A runtime's sessions by thread count, built on first use by `build(threads)`: `current()` is the one
    for the calling thread's torch thread count (what the governor last set), the least recently used dropped
    beyond `SESSIONS_KEPT`."""

    def __init__(self, build: Callable[[int], Session]) -> None:
        self._build = build
        self._by_count: OrderedDict[int, Session] = OrderedDict()

    def current(self) -> Session:
        threads = torch.get_num_threads()
        if threads not in self._by_count:
            self._by_count[threads] = self._build(threads)
            while len(self._by_count) > SESSIONS_KEPT:
                self._by_count.popitem(last=False)
        self._by_count.move_to_end(threads)
        return self._by_count[threads]

    @property
    def counts(self) -> list[int]:
        """The thread counts with a session now, least recently used first."""
        return list(self._by_count)


def feed_of(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """The graph's inputs as the runtimes take them: int64 NumPy arrays on the CPU."""
    return {
        "input_ids": input_ids.cpu().long().numpy(),
        "attention_mask": attention_mask.cpu().long().numpy(),
    }


class OnnxEncoder:
    """An exported encoder run by ONNX Runtime, called as the torch encoder pass is (tensors in, a CPU fp32
    tensor out), on as many intra-op threads as torch has on the calling thread (`SessionsByThreads`)."""

    name = "onnxruntime"

    def __init__(self, path: Path) -> None:
        import onnxruntime  # the optional extra: imported only when a server asks for this backend

        self.path = path
        self._runtime = onnxruntime
        self.sessions = SessionsByThreads(self._session)
        self.sessions.current()  # built now: a graph the runtime cannot load fails at start, not at a request

    def _session(self, threads: int):
        options = self._runtime.SessionOptions()
        options.graph_optimization_level = self._runtime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        # No spinning between runs: the head runs in torch on the same cores right after each encoder pass,
        # and a runtime thread that spins waiting for work takes a core from it (and from other processes).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return self._runtime.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])

    @property
    def session(self):
        return self.sessions.current()

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run([OUTPUT], feed_of(input_ids, attention_mask))[0])
