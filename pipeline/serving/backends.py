"""Which runtime runs a served model's encoder (`decision serve --backend`): torch, or ONNX Runtime where it is
installed, the model's family can hand its encoder over, and the exported graph answers a few built-in probe
requests as torch does. The heads, calibration and answer shaping stay in torch either way.

    choice = choose_backend(model, "auto", cache / "encoder.onnx")
    model.encoder = choice.encoder                      # None: the model's own torch modules
    log.info("backend: %s (%s)", choice.name, choice.reason)

A missing runtime, a failed export or a failed parity check falls back to torch at start, with its reason; a
request never meets an error from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.families.base import BadQuestion, DecisionModel, EncoderRun
from pipeline.families.onnx_encoder import OnnxEncoder, export_encoder, onnxruntime_missing

BACKENDS = ("auto", "torch", "onnxruntime")
LARGEST_DP = (
    1e-4  # parity with torch at fp32: the largest |Δp| over the probe answers, and every argmax equal
)
# Answers go out rounded to 4 decimals (`answers.DECIMALS`): one step of the last decimal, as a float difference.
_ROUNDING = 1e-9

# Built-in probes: short and long states, every question type, one question alone and five together, so the
# parity check runs batches of different lengths through the exported graph's dynamic axes.
_TONE = {
    "type": "choice",
    "instructions": "Tone?",
    "criteria": {"negative": None, "neutral": None, "positive": None},
}
_SCORE = {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]}
_NOUL = {"type": "noul", "instructions": "The support team was kind."}
PROBES = (
    ("Great phone.", {"tone": _TONE}),
    ("The delivery was late but the support team was kind, and the refund came within a week of my complaint.",
     {"tone": _TONE, "urgency": _SCORE, "kind": _NOUL}),
    ("Terrible. " * 12, {"urgency": _SCORE, "kind": _NOUL, "tone": _TONE,
                         "late": {"type": "noul", "instructions": "The order was late."},
                         "pick": {"type": "choice", "instructions": "Pick one", "criteria": ["yes", "no"]}}),
)  # fmt: skip


@dataclass(frozen=True)
class BackendChoice:
    """The runtime a served model's encoder runs on, why, and its encoder pass (None: torch's own)."""

    name: str
    reason: str
    encoder: EncoderRun | None = None
    fell_back: bool = False  # asked for (or `auto` tried) a runtime that could not serve: the log warns


@dataclass(frozen=True)
class Parity:
    """How far another runtime's answers are from torch's on the same requests."""

    largest_dp: float
    argmax_agreement: float  # the share of questions whose most probable option is the same
    questions: int

    @property
    def holds(self) -> bool:
        return self.largest_dp <= LARGEST_DP + _ROUNDING and self.argmax_agreement == 1.0


def choose_backend(model: DecisionModel, wanted: str, onnx_path: Path) -> BackendChoice:
    """The backend for `model` (`wanted` is one of `BACKENDS`): torch when asked, else ONNX Runtime when it can
    serve and holds parity on the probes; torch with the reason otherwise (`fell_back` when the runtime was
    asked for, or when `auto` tried it and its export or parity check failed)."""
    if wanted not in BACKENDS:
        raise ValueError(f"--backend {wanted}: not one of {', '.join(BACKENDS)}")
    if wanted == "torch":
        return BackendChoice("torch", "asked for (--backend torch)")
    missing = onnxruntime_missing()
    if missing is not None:
        return BackendChoice("torch", f"ONNX Runtime cannot serve: {missing}", fell_back=wanted != "auto")
    why_not = _why_not_onnx(model)
    if why_not is not None:
        return BackendChoice(
            "torch", f"ONNX Runtime cannot serve this model: {why_not}", fell_back=wanted != "auto"
        )
    try:
        encoder = OnnxEncoder(export_encoder(model.family.served_encoder(model.loaded), onnx_path),
                              threads=torch.get_num_threads())  # fmt: skip
    except (RuntimeError, ValueError, TypeError, OSError) as error:  # the exporter's and the runtime's errors
        return BackendChoice(
            "torch", f"the ONNX export failed: {type(error).__name__}: {error}", fell_back=True
        )
    parity = check_parity(model, encoder)
    facts = (f"largest |Δp| {parity.largest_dp:.1e} (at most {LARGEST_DP:.0e}), argmax agreement "
             f"{parity.argmax_agreement:.0%} on {parity.questions} probe questions")  # fmt: skip
    if not parity.holds:
        return BackendChoice(
            "torch", f"ONNX Runtime failed the parity check against torch: {facts}", fell_back=True
        )
    how = "asked for" if wanted == "onnxruntime" else "auto: installed"
    return BackendChoice("onnxruntime", f"{how}, and {facts}", encoder)


def _why_not_onnx(model: DecisionModel) -> str | None:
    device = next(model.loaded.model.parameters()).device
    if device.type != "cpu":
        return f"it serves on {device}, and this backend runs on the CPU"
    if model.dtype is not None:
        return "it serves at bf16 (--precision bf16), and this backend serves fp32"
    if model.family.served_encoder(model.loaded) is None:
        return f"the {model.family.name} family keeps this backbone in torch (a causal LM)"
    return None


def check_parity(model: DecisionModel, encoder: EncoderRun, probes=PROBES) -> Parity:
    """Torch's answers against `encoder`'s on `probes` ((state, questions) pairs), answered together."""
    requests = [parse_request(state, questions) for state, questions in probes]
    expected = model.answer(requests)
    got = replace(model, encoder=encoder).answer(requests)
    gaps, agreed = [], []
    for want, have in zip(expected, got):
        if isinstance(want, BadQuestion) or isinstance(have, BadQuestion):
            raise ValueError(f"a probe request failed: {want if isinstance(want, BadQuestion) else have}")
        for qid, answer in want.answers.items():
            p, q = (
                np.asarray(answer_probabilities(answer)),
                np.asarray(answer_probabilities(have.answers[qid])),
            )
            gaps.append(float(np.abs(p - q).max()))
            agreed.append(int(p.argmax()) == int(q.argmax()))
    return Parity(max(gaps), float(np.mean(agreed)), len(gaps))
