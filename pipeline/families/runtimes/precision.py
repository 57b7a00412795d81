"""Which precision answers for a served model (`decision serve --precision`, and `predict`, `evaluate` and the
MLflow model): fp32, bf16 autocast, or the export's int8 encoder (`runtimes.quantize`).

`int8` and `auto` read the export's int8 report (`int8.json`). `auto` (the default) serves int8 only where the
report passes its bounds (argmax agreement, accuracy and ECE against fp32, measured on held-out rows), the CPU
has VNNI-class instructions, ONNX Runtime runs the graph, and it answers a few probe requests faster than fp32
(`backends.race`); else fp32, and says why. `int8` asked for is refused (`Int8Refused`, with the report's
figures) where the report is missing or fails; a graph the runtime cannot load falls back to fp32 with one
warning line. An int8 model answers with the calibrator and certificates fitted on its own answers, never
fp32's.

    model, choice = served_precision(load_decision_model(folder), "auto", folder)
    log.info("precision %s: %s", choice.name, choice.reason)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from pipeline.config import SERVING_PRECISIONS
from pipeline.device import precision_name
from pipeline.families.base import DecisionModel, ModelLayoutError
from pipeline.families.runtimes.backends import race
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE, OnnxEncoder, onnxruntime_missing
from pipeline.families.runtimes.quantize import INT8_REPORT, Int8Export, int8_host_problem, read_int8

log = logging.getLogger(__name__)


class Int8Refused(ValueError):
    """`--precision int8` asked for a model whose int8 encoder may not serve (no report, or one that fails)."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a model answers at, why, and the int8 report behind the choice (when there is one)."""

    name: str
    reason: str
    int8: Int8Export | None = None
    fell_back: bool = False  # int8 was asked for and could not run: the log warns

    def facts(self) -> dict[str, Any]:
        """What `/v1/models` and `/healthz` say of it."""
        return {
            "precision": self.name,
            "precision_reason": self.reason,
            "int8": self.int8.summary() if self.int8 is not None else None,
        }


def served_precision(
    model: DecisionModel, wanted: str, folder: str | Path
) -> tuple[DecisionModel, PrecisionChoice]:
    """`model` (loaded at fp32, or under `--precision bf16` autocast) at the precision `wanted` asks for, and
    the choice with its reason (module docstring)."""
    if wanted not in SERVING_PRECISIONS:
        raise ValueError(f"--precision {wanted}: not one of {', '.join(SERVING_PRECISIONS)}")
    if wanted in ("fp32", "bf16"):
        return model, PrecisionChoice(precision_name(model.dtype), f"asked for (--precision {wanted})")
    int8 = read_int8(folder)
    problem = _int8_problem(model, int8, folder, forced=wanted == "int8")
    if problem is not None:
        if wanted == "int8":
            raise Int8Refused(f"--precision int8: {problem}")
        return model, PrecisionChoice("fp32", f"auto: fp32, as {problem}", int8)
    try:
        encoder = OnnxEncoder(int8.graph)
    except (RuntimeError, ValueError, OSError) as error:  # onnxruntime's own errors on loading a graph
        why = f"ONNX Runtime could not load {int8.graph}: {type(error).__name__}: {error}"
        log.warning("int8 falls back to fp32: %s", why)
        return model, PrecisionChoice("fp32", f"{wanted}: fell back to fp32: {why}", int8, fell_back=True)
    quantized = int8_model(model, int8, encoder)
    if wanted == "int8":
        return quantized, PrecisionChoice("int8", f"asked for: int8 report {int8.report['why']}", int8)
    fastest, timing = _race_against_fp32(quantized, Path(folder))
    if not fastest:
        why = (
            f"its int8 encoder passes its report but answered the probe requests slower than fp32 ({timing})"
        )
        return model, PrecisionChoice("fp32", f"auto: fp32, as {why}", int8)
    reason = f"auto: int8 report {int8.report['why']}; the fastest on the probe requests ({timing})"
    return quantized, PrecisionChoice("int8", reason, int8)


def _race_against_fp32(quantized: DecisionModel, folder: Path) -> tuple[bool, str]:
    """Whether int8 answered the probe requests faster than fp32 (torch's own pass, and the export's fp32
    graph on ONNX Runtime where it has one), and the times. On a 2-core machine the block-wise int8 pass ran
    1.5x-1.8x the fp32 one alone, and 0.86x-1.34x a served request (docs/results.md, int8): timed, not
    assumed."""
    encoders = {"int8": quantized.encoder, "fp32 torch": None}
    if (folder / ONNX_FILE).is_file():
        encoders["fp32 onnxruntime"] = OnnxEncoder(folder / ONNX_FILE)
    times = race(quantized, encoders)
    ranked = sorted(times.items(), key=lambda item: item[1])
    return ranked[0][0] == "int8", ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in ranked)


def int8_model(model: DecisionModel, int8: Int8Export, encoder) -> DecisionModel:
    """`model` answering through the int8 encoder, with the calibrator and certificates fitted on it."""
    loaded = replace(model.loaded, calibrator=int8.calibrator)
    automation = replace(model.automation, certificates=int8.certificates)
    return replace(model, loaded=loaded, encoder=encoder, automation=automation)


def int8_refusal(folder: str | Path, device: torch.device) -> str | None:
    """Why `--precision int8` would be refused for the export in `folder` on `device` (read without loading
    the model), or None."""
    try:
        int8 = read_int8(folder)
    except ModelLayoutError as error:
        return str(error)
    return _report_problem(int8, folder) or _runtime_problem(device, None)


def _int8_problem(
    model: DecisionModel, int8: Int8Export | None, folder: str | Path, forced: bool
) -> str | None:
    """Why the model's int8 encoder may not serve here, or None."""
    device = next(model.loaded.model.parameters()).device
    problem = _report_problem(int8, folder) or _runtime_problem(device, model.dtype)
    if problem is None and not forced:
        return int8_host_problem()
    return problem


def _report_problem(int8: Int8Export | None, folder: str | Path) -> str | None:
    if int8 is None:
        return (
            f"{folder} has no int8 report ({INT8_REPORT}): make one with `decision quantize --model {folder}`"
        )
    if not int8.report.get("quantized"):
        return f"the export's int8 encoder was not made: {int8.report.get('why')}"
    if not int8.passes:
        return f"its int8 report is {int8.report.get('why')}"
    return None


def _runtime_problem(device: torch.device, dtype: torch.dtype | None) -> str | None:
    if device.type != "cpu" or dtype is not None:
        return (
            f"int8 runs on the CPU without autocast, and this model is on {device} at {precision_name(dtype)}"
        )
    return onnxruntime_missing()
