"""The export's encoder at int8: ONNX Runtime's block-wise int8 quantization of the fp32 graph (`encoder.onnx`),
and the files that say whether it may serve (`decision quantize`, `stages.quantize`).

Each linear layer's weights are stored as int8 in blocks of `block_size` input channels, one scale per block;
at run time each row's activations are quantized to int8 in the same blocks, and the products run on the CPU's
int8 instructions (VNNI) in ONNX Runtime's `MatMulNBits` (accuracy level 4). Per-row scales keep a request's
answer independent of its batch-mates, as at fp32; ONNX Runtime's per-tensor dynamic quantization, faster here,
scales a whole batch at once and moved answers by up to 0.06 with the company a request kept (docs/results.md,
int8), so it is not offered. Embeddings, layer norms, softmax and the decision head stay fp32.

    quantize_graph(export / "encoder.onnx", export / "encoder.int8.onnx", SCHEMES[0])
    int8 = read_int8(export)            # None: never quantized; else its graph, report, calibrator
    if int8 is not None and int8.passes:
        ...

Larger blocks run faster and move answers further: `stages.quantize` tries `SCHEMES` from the fastest and keeps
the first within the bounds on the fitting rows. The report (`int8.json`, written last, naming the graph's hash)
is what a server trusts: a graph without it, or one whose hash differs, is not served at int8.
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
QUANTIZER_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


@dataclass(frozen=True)
class Scheme:
    """One way to quantize: int8 weights and activations in blocks of `block_size` input channels."""

    block_size: int

    @property
    def name(self) -> str:
        return f"int8 blocks of {self.block_size}"


SCHEMES = (Scheme(128), Scheme(64), Scheme(32))
"""Tried in this order (the fastest first): measured on MiniLM here, 1.8x / 1.6x / 1.4x fp32's encoder pass,
argmax agreement with fp32 99.15% / 99.25% / 99.40% on VADER's held-out rows."""


class QuantizationFailed(RuntimeError):
    """The runtime could not quantize the graph (an operator it does not take, a graph it cannot read)."""


def quantize_graph(graph: Path, out: Path, scheme: Scheme = SCHEMES[0]) -> Path:
    """`graph` (fp32 ONNX) with its matrix products at int8 by `scheme`, at `out`, staged beside it and renamed
    into place; QuantizationFailed with the runtime's reason."""
    try:
        onnx = importlib.import_module("onnx")
        nbits = importlib.import_module("onnxruntime.quantization.matmul_nbits_quantizer")
    except ImportError as error:
        raise QuantizationFailed(
            f"the int8 quantizer cannot be imported ({error}): pip install 'decision-pipeline[onnx]'"
        ) from None
    handle, staged = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    os.close(handle)
    settings = {"block_size": scheme.block_size, "is_symmetric": True, "accuracy_level": 4, "bits": 8}
    try:
        with _quiet(QUANTIZER_LOGGER):
            quantizer = nbits.MatMulNBitsQuantizer(
                onnx.load(str(graph)), **settings, algo_config=nbits.DefaultWeightOnlyQuantConfig(**settings)
            )
            quantizer.process()
            quantizer.model.save_model_to_file(staged, use_external_data_format=False)
        os.replace(staged, out)
    except (RuntimeError, ValueError, TypeError, KeyError, OSError) as error:  # the quantizer's own errors
        raise QuantizationFailed(f"{type(error).__name__}: {error}") from None
    finally:
        Path(staged).unlink(missing_ok=True)
    return out


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The quantizer logs a line per node it skips: kept out of a run's log."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


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
