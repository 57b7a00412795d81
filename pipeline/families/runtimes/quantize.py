"""The export's encoder at int8: ONNX Runtime's dynamic quantization of the fp32 graph (`encoder.onnx`), and the
files that say whether it may serve (`decision quantize`, `stages.quantize`).

Dynamic quantization stores each linear layer's weights as int8, one scale per output channel, and quantizes
the activations to uint8 per batch as they arrive, so it needs no calibration rows and no change to the graph's
inputs; on a CPU with VNNI the int8 matrix products run at several times fp32's rate. Embeddings, layer norms,
softmax and the decision head stay in fp32 (the head runs in torch, after the encoder).

    quantize_graph(export / "encoder.onnx", export / "encoder.int8.onnx")
    int8 = read_int8(export)            # None: never quantized; else its graph, report, calibrator
    if int8 is not None and int8.report["passes"]:
        ...

The report (`int8.json`, written last, naming the graph's hash) is what a server trusts: a graph without it, or
one whose hash differs, is not served at int8.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.families.base import ModelLayoutError
from pipeline.scoring.calibrators import Calibrator
from pipeline.scoring.certify import Certificate, read_certificates

INT8_GRAPH = "encoder.int8.onnx"
INT8_REPORT = "int8.json"
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
"""CPU flags (Linux's /proc/cpuinfo names) under which ONNX Runtime's int8 matrix products are fast; without
any, int8 runs no faster than fp32 on most CPUs."""


class QuantizationFailed(RuntimeError):
    """The runtime could not quantize the graph (an operator it does not take, a graph it cannot read)."""


def quantize_graph(graph: Path, out: Path) -> Path:
    """`graph` (fp32 ONNX) with its matrix products' weights quantized to int8 per output channel, at `out`,
    staged beside it and renamed into place; QuantizationFailed with the runtime's reason."""
    try:
        quantization = importlib.import_module("onnxruntime.quantization")
    except ImportError as error:
        raise QuantizationFailed(
            f"onnxruntime cannot be imported ({error}): pip install 'decision-pipeline[onnx]'"
        ) from None
    handle, staged = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    os.close(handle)
    try:
        with _quiet_root_warnings():
            quantization.quantize_dynamic(
                graph,
                staged,
                op_types_to_quantize=["MatMul"],  # the encoder's linear layers; embeddings' Gather stays fp32
                per_channel=True,
                weight_type=quantization.QuantType.QInt8,
                extra_options={
                    "MatMulConstBOnly": True
                },  # weights only: attention's two activations stay fp32
            )
        os.replace(staged, out)
    except (RuntimeError, ValueError, TypeError, KeyError, OSError) as error:  # the quantizer's own errors
        raise QuantizationFailed(f"{type(error).__name__}: {error}") from None
    finally:
        Path(staged).unlink(missing_ok=True)
    return out


@contextmanager
def _quiet_root_warnings() -> Iterator[None]:
    """The quantizer logs advice on the root logger ("consider pre-processing"): kept out of a run's log."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def int8_host_problem(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """Why int8 would not pay on this CPU (no VNNI-class instructions), or None where it has them; None also
    where the CPU cannot be read (not Linux): the report's figures then decide alone."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return None
    if any(flag in flags.split() for flag in VNNI_FLAGS):
        return None
    return f"this CPU has none of {', '.join(VNNI_FLAGS)}, so int8 runs no faster than fp32 here"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Int8Export:
    """An export's int8 encoder, its measured report, and the calibrator and certificates fitted on its own
    answers."""

    graph: Path
    report: dict[str, Any]
    calibrator: Calibrator
    certificates: dict[str, Certificate]

    @property
    def passes(self) -> bool:
        return bool(self.report.get("passes"))

    def summary(self) -> dict[str, Any]:
        """What `/v1/models` and `/healthz` say of it: its verdict and measured figures."""
        overall = self.report.get("overall", {})
        return {"passes": self.passes, "why": self.report.get("why", "")} | {
            key: overall[key]
            for key in ("argmax_agreement", "accuracy_change", "ece_change")
            if key in overall
        }


def write_int8(folder: Path, report: dict[str, Any]) -> Path:
    """The report at `folder/int8.json`, staged and renamed: written after the graph it names."""
    path = folder / INT8_REPORT
    handle, staged = tempfile.mkstemp(dir=folder, prefix=f".{INT8_REPORT}.", suffix=".part")
    with os.fdopen(handle, "w") as out:
        json.dump(report, out, indent=2)
    os.replace(staged, path)
    return path


def read_int8(folder: str | Path) -> Int8Export | None:
    """The folder's int8 encoder with its report; None where it has no report. A graph that is missing, or is
    not the one the report measured (a hand-edited file), reads as not quantized, saying so. ModelLayoutError
    for a report that is not one."""
    folder = Path(folder)
    path = folder / INT8_REPORT
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text())
        graph = folder / report["graph"]
        if report.get("quantized") and not (graph.is_file() and file_sha256(graph) == report["graph_sha256"]):
            changed = f"{graph} is missing or not the graph its report measured: run decision quantize again"
            report = report | {"quantized": False, "passes": False, "why": changed}
        calibrator = Calibrator.from_json(report["calibrator"]) if report.get("calibrator") else Calibrator()
        certificates = read_certificates(json.dumps(report.get("certificates") or {}).encode())
    except (ValueError, KeyError, TypeError) as error:
        raise ModelLayoutError(f"{path}: not an int8 report: {error}") from None
    return Int8Export(graph, report, calibrator, certificates)
