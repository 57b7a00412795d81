"""A family's serving encoder compiled by OpenVINO for the CPU (the `openvino` extra), from the same ONNX
graph ONNX Runtime runs (`onnx_encoder.export_encoder`): OpenVINO reads ONNX itself, so one exported file
serves both.

    encoder = OpenVinoEncoder(Path("export/encoder.onnx"))                  # fp32, the parity default
    encoder = OpenVinoEncoder(Path("export/encoder.onnx"), torch.bfloat16)  # --precision bf16 only
    hidden = encoder(input_ids, attention_mask)

Both axes of the graph stay dynamic, so a batch pays for its own longest sequence only. The precision is always
set: on a CPU with native bf16, OpenVINO's own default is bf16, which would move answers by up to 1e-2.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from pipeline.families.runtimes.onnx_encoder import SessionsByThreads, feed_of

PRECISION_HINTS = {None: "f32", torch.bfloat16: "bf16"}


def openvino_missing(dtype: torch.dtype | None = None) -> str | None:
    """Why OpenVINO cannot serve here at `dtype` (one line naming what to do), or None when it can."""
    try:
        openvino = importlib.import_module("openvino")
    except ImportError as error:
        return f"openvino cannot be imported ({error}): pip install 'decision-pipeline[openvino]'"
    if dtype not in PRECISION_HINTS:
        return f"it serves {', '.join(PRECISION_HINTS.values())}, not {dtype}"
    if dtype is not None and "BF16" not in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return "this CPU has no native bf16 for OpenVINO"
    return None


class OpenVinoEncoder:
    """An exported encoder compiled by OpenVINO, called as the torch encoder pass is (tensors in, a CPU fp32
    tensor out), on as many threads as torch has on the calling thread (`SessionsByThreads`)."""

    name = "openvino"

    def __init__(self, path: Path, dtype: torch.dtype | None = None) -> None:
        import openvino  # the optional extra: imported only when a server asks for this backend

        self.path = path
        self.precision = PRECISION_HINTS[dtype]
        self._core = openvino.Core()
        self._graph = self._core.read_model(str(path))
        self.sessions = SessionsByThreads(self._compile)
        self.sessions.current()  # compiled now: a graph OpenVINO cannot take fails at start, not at a request

    def _compile(self, threads: int):
        return self._core.compile_model(
            self._graph,
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": self.precision,
                "PERFORMANCE_HINT": "LATENCY",  # one request at a time: the server's batcher already batches
                "NUM_STREAMS": 1,
                # Not pinned: the machine is shared (other processes, torch's head on the same cores), and a
                # pinned thread waits for its core when another process holds it.
                "ENABLE_CPU_PINNING": False,
            },
        )

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        compiled = self.sessions.current()
        # Outputs copied out (share_outputs=False): the compiled model reuses its output tensor on its next
        # call.
        return torch.from_numpy(compiled(feed_of(input_ids, attention_mask), share_outputs=False)[0])
