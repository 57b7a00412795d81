"""Which runtime runs a served model's encoder (`decision serve --backend`): torch, ONNX Runtime or OpenVINO.

A runtime is tried where it is installed, the model's family can hand its encoder over (an encoder backbone,
on the CPU), and the exported graph answers a few built-in probe requests as torch does. `auto` (the default)
then times each runtime that passed, and torch, on the probes and serves the fastest. The heads, calibration
and answer shaping stay in torch either way.

    choice = choose_backend(model, "auto", cache / "encoder.onnx", shipped=export / "encoder.onnx")
    model.encoder = choice.encoder                      # None: the model's own torch modules
    log.info("backend: %s (%s)", choice.name, choice.reason)

The graph is the one the export carries (`decision export` writes it) or, for a folder without one, exported
into the server's cache at start. A missing runtime, a failed export or a failed parity check falls back to
torch at start, with its reason; a request never meets an error from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.families.base import BadQuestion, DecisionModel, EncoderRun
from pipeline.families.runtimes.onnx_encoder import OnnxEncoder, export_encoder, onnxruntime_missing
from pipeline.families.runtimes.openvino_encoder import OpenVinoEncoder, openvino_missing

BACKENDS = ("auto", "torch", "onnxruntime", "openvino")
LARGEST_DP = (
    1e-4  # parity with torch at fp32: the largest |Δp| over the probe answers, and every argmax equal
)
# At bf16 (`--precision bf16`) a runtime is held to torch's own bf16 pass: no further from the fp32 answers
# than twice torch's bf16 distance (at least this), and no more argmax changes.
LARGEST_DP_BF16_FLOOR = 1e-3
RACE_ROUNDS = 5  # `auto` times each candidate this many times on the probes, interleaved, and keeps its best
# Answers go out rounded to 4 decimals (`answers.DECIMALS`): one step of the last decimal, as a float
# difference.
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
    (
        "The delivery was late but the support team was kind, and the refund came within a week of my "
        "complaint.",
        {"tone": _TONE, "urgency": _SCORE, "kind": _NOUL},
    ),
    (
        "Terrible. " * 12,
        {
            "urgency": _SCORE,
            "kind": _NOUL,
            "tone": _TONE,
            "late": {"type": "noul", "instructions": "The order was late."},
            "pick": {"type": "choice", "instructions": "Pick one", "criteria": ["yes", "no"]},
        },
    ),
)


@dataclass(frozen=True)
class Runtime:
    """A runtime that can run an exported encoder graph: why it cannot serve at a precision, and its
    encoder."""

    name: str
    missing: Callable[[torch.dtype | None], str | None]
    encoder: Callable[[Path, torch.dtype | None], EncoderRun]


def _onnxruntime_missing(dtype: torch.dtype | None) -> str | None:
    if dtype is not None:
        return "it serves fp32 only, and --precision bf16 asks for bf16"
    return onnxruntime_missing()


RUNTIMES = {  # `auto` tries them in this order (the faster here first, so a tie goes to it)
    "openvino": Runtime("openvino", openvino_missing, OpenVinoEncoder),
    "onnxruntime": Runtime("onnxruntime", _onnxruntime_missing, lambda path, dtype: OnnxEncoder(path)),
}


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
    # Per changed argmax, the reference's gap between its top two options.
    flip_margins: tuple[float, ...] = ()

    def within(self, bound: ParityBound) -> bool:
        """No further than `bound`'s largest |Δp| (give or take the answers' rounding), and no argmax changed
        where the reference's top two options are further apart than `bound.tie`."""
        near_ties = all(m <= bound.tie for m in self.flip_margins) if bound.tie else not self.flip_margins
        return self.largest_dp <= bound.largest_dp + _ROUNDING and near_ties

    @property
    def holds(self) -> bool:
        return self.within(FP32_PARITY)

    def describe(self) -> str:
        return f"largest |Δp| {self.largest_dp:.1e}, argmax agreement {self.argmax_agreement:.0%}"


@dataclass(frozen=True)
class ParityBound:
    """What a runtime must hold: the largest |Δp|, and the reference's top-two gap under which an argmax may
    change (0: none may)."""

    largest_dp: float
    tie: float = 0.0

    def describe(self) -> str:
        ties = (
            f", argmax changes only on near-ties (top two within {self.tie:.0e})"
            if self.tie
            else ", every argmax"
        )
        return f"at most {self.largest_dp:.0e}{ties}"


FP32_PARITY = ParityBound(LARGEST_DP)


@dataclass(frozen=True)
class _Tried:
    """One runtime's try: its encoder when it passed, else why not (`failed`: installed and tried, not merely
    unavailable), with its parity facts."""

    name: str
    encoder: EncoderRun | None
    note: str
    failed: bool = False


def choose_backend(
    model: DecisionModel, wanted: str, graph: Path, shipped: Path | None = None
) -> BackendChoice:
    """The backend for `model` (`wanted` is one of `BACKENDS`): torch when asked; else the runtime asked for,
    or under `auto` the fastest on the probes of torch and the runtimes that can serve and hold parity. The
    graph is `shipped` (the export's own) when it exists, else exported to `graph`. Torch with the reasons
    otherwise (`fell_back` when a runtime was asked for, or one `auto` tried failed its export or parity
    check)."""
    if wanted not in BACKENDS:
        raise ValueError(f"--backend {wanted}: not one of {', '.join(BACKENDS)}")
    if wanted == "torch":
        return BackendChoice("torch", "asked for (--backend torch)")
    graphs = _Graphs(model, graph, shipped)
    bound = _parity_bound(model)
    tried = [
        _try(model, RUNTIMES[name], graphs, bound) for name in (RUNTIMES if wanted == "auto" else [wanted])
    ]
    passed = [t for t in tried if t.encoder is not None]
    notes = "; ".join(t.note for t in tried if t.encoder is None)
    if not passed:
        return BackendChoice("torch", notes, fell_back=wanted != "auto" or any(t.failed for t in tried))
    if wanted != "auto":
        return BackendChoice(passed[0].name, f"asked for, and {passed[0].note}", passed[0].encoder)
    times = race(model, {"torch": None, **{t.name: t.encoder for t in passed}})
    fastest = min(times, key=times.get)
    timing = ", ".join(
        f"{name} {seconds * 1000:.1f} ms" for name, seconds in sorted(times.items(), key=lambda x: x[1])
    )
    facts = "; ".join(f"{t.name}: {t.note}" for t in passed) + (f"; {notes}" if notes else "")
    encoders = {t.name: t.encoder for t in passed}  # torch's is None: the model's own modules
    return BackendChoice(
        fastest, f"auto: the fastest on the probe requests ({timing}); {facts}", encoders.get(fastest)
    )


class _Graphs:
    """The graphs a runtime may take, in order: the export's own, then one exported to `graph` (once, on
    demand)."""

    def __init__(self, model: DecisionModel, graph: Path, shipped: Path | None) -> None:
        self.model, self.graph, self.shipped = model, graph, shipped
        self._exported: Path | None = None

    def paths(self):
        if self.shipped is not None and self.shipped.is_file():
            yield self.shipped
        if self._exported is None:
            self._exported = export_encoder(self.model.family.served_encoder(self.model.loaded), self.graph)
        yield self._exported


def _try(model: DecisionModel, runtime: Runtime, graphs: _Graphs, bound: ParityBound) -> _Tried:
    unavailable = runtime.missing(model.dtype) or _why_not_runtime(model)
    if unavailable is not None:
        return _Tried(runtime.name, None, f"{runtime.name} cannot serve this model here: {unavailable}")
    failures = []
    try:
        for path in graphs.paths():
            encoder = runtime.encoder(path, model.dtype)
            parity = measure_parity(_reference(model), replace(model, encoder=encoder))
            if parity.within(bound):
                facts = f"{parity.describe()} on {parity.questions} probe questions ({bound.describe()})"
                return _Tried(runtime.name, encoder, "; ".join([*failures, f"{facts}, graph {path}"]))
            failures.append(
                f"{runtime.name} failed the parity check against torch with {path}: "
                f"{parity.describe()} ({bound.describe()})"
            )
    except (RuntimeError, ValueError, TypeError, OSError) as error:  # the exporter's and the runtimes' errors
        failures.append(f"the {runtime.name} graph failed: {type(error).__name__}: {error}")
    return _Tried(runtime.name, None, "; ".join(failures), failed=True)


def _why_not_runtime(model: DecisionModel) -> str | None:
    device = next(model.loaded.model.parameters()).device
    if device.type != "cpu":
        return f"it serves on {device}, and these runtimes run on the CPU"
    if model.family.served_encoder(model.loaded) is None:
        return f"the {model.family.name} family keeps this backbone in torch (a causal LM)"
    return None


def _reference(model: DecisionModel) -> DecisionModel:
    """What a runtime's answers are compared with: torch at fp32 (the trained model's answers)."""
    return replace(model, dtype=None, encoder=None)


def _parity_bound(model: DecisionModel) -> ParityBound:
    """fp32: |Δp| <= 1e-4 and every argmax the same. bf16: no further from the fp32 answers than twice torch's
    own bf16 pass (at least 1e-3); an argmax may change only where the fp32 answer's top two options are within
    twice that (a move the bound allows), as torch's bf16 pass changes some on near-ties."""
    if model.dtype is None:
        return FP32_PARITY
    own = measure_parity(_reference(model), replace(model, encoder=None))
    largest = max(2 * own.largest_dp, LARGEST_DP_BF16_FLOOR)
    return ParityBound(largest, tie=2 * largest)


def race(model: DecisionModel, encoders: dict[str, EncoderRun | None], probes=PROBES) -> dict[str, float]:
    """Seconds per answer of the probes (three times over, as one batch) for each encoder (None: torch's own),
    the best of `RACE_ROUNDS`, interleaved so that a spell of load elsewhere falls on all of them alike."""
    requests = [parse_request(state, questions) for state, questions in probes] * 3
    runs = {name: replace(model, encoder=encoder) for name, encoder in encoders.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(RACE_ROUNDS):
        for name, run in runs.items():
            started = time.perf_counter()
            run.answer(requests)
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def check_parity(model: DecisionModel, encoder: EncoderRun, probes=PROBES) -> Parity:
    """Torch's answers against `encoder`'s on `probes` ((state, questions) pairs), answered together."""
    return measure_parity(model, replace(model, encoder=encoder), probes)


def measure_parity(reference: DecisionModel, candidate: DecisionModel, probes=PROBES) -> Parity:
    """`candidate`'s answers against `reference`'s on `probes` ((state, questions) pairs), answered
    together."""
    requests = [parse_request(state, questions) for state, questions in probes]
    expected = reference.answer(requests)
    got = candidate.answer(requests)
    gaps, agreed, flip_margins = [], [], []
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
            if not agreed[-1]:
                top_two = np.sort(p)[-2:]
                flip_margins.append(float(top_two[1] - top_two[0]))
    return Parity(max(gaps), float(np.mean(agreed)), len(gaps), tuple(flip_margins))
