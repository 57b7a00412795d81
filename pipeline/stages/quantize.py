"""The quantize stage: the export's encoder at int8 (`runtimes.quantize`), measured against fp32 on rows the
model never trained on, and refitted so that what it serves stays calibrated (any family whose encoder a runtime
can take).

The quantization schemes (`runtimes.quantize.SCHEMES`) are tried from the fastest, and the first whose answers
to the fitting rows (the run's validation split) agree with fp32's often enough (`quantize.min_agreement`) is
kept, else the closest. The fp32 model's kind of calibrator is fitted on the int8 model's logits of the
fitting rows, and its certificates (`scoring.certify`) certified on their cross-fitted answers, as the
calibrate stage does for fp32. On the checking rows, each calibrated by its own calibrator, int8 is compared
with fp32 (`scoring.precision`): argmax agreement, accuracy, ECE and certified coverage, per question and
overall. `int8.json`, written last, holds the figures, the verdict against the `quantize:` bounds, the
calibrator and the certificates; a server serves the int8 encoder under `--precision auto` only where the
verdict passes (`runtimes.precision`).

    decision quantize --model runs/<key>/export          # the run folder's split beside it
    decision quantize --model models/vader --data rows.jsonl   # rows split into fitting and checking halves

A family that keeps its backbone in torch, an export without `encoder.onnx`, or a graph the runtime cannot
quantize or run gets a report that says why (`quantized: false`), with one warning line, and serves at fp32.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import CertifyConfig, QuantizeConfig
from pipeline.data.contract import Record
from pipeline.data.split import SplitData
from pipeline.families import load_decision_model
from pipeline.families.base import DecisionModel
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE, OnnxEncoder
from pipeline.families.runtimes.quantize import (
    INT8_GRAPH,
    SCHEMES,
    QuantizationFailed,
    Scheme,
    file_sha256,
    int8_host_problem,
    quantize_graph,
    write_int8,
)
from pipeline.rundir import RunFolder
from pipeline.scoring.calibrators import choose_calibrator
from pipeline.scoring.certify import AutomationReport, Certificate, automation_report, certify
from pipeline.scoring.decisions import ScoredDecision
from pipeline.scoring.precision import compare_precisions, verdict
from pipeline.stages.evaluate import served_logits

log = logging.getLogger(__name__)
METHOD = (
    "ONNX Runtime dynamic quantization: MatMul weights int8 per output channel, activations uint8 per batch; "
    "embeddings, layer norms and the head in fp32"
)


@dataclass(frozen=True)
class QuantizeResult:
    """What the stage wrote and measured (`int8.json` holds the whole report)."""

    export_dir: str
    quantized: bool
    passes: bool
    why: str
    overall: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def tags(self) -> dict[str, str]:
        """The registered version's tags: whether its int8 encoder may serve, and its measured figures."""
        figures = {
            f"int8_{k}": f"{self.overall[k]:.4f}"
            for k in ("argmax_agreement", "accuracy_change", "ece_change")
            if k in self.overall
        }
        return {"int8": "passes" if self.passes else ("fails" if self.quantized else "none"), **figures}


@dataclass(frozen=True)
class Rows:
    """The rows int8 is fitted on and checked on, and how to say which they are."""

    fit: list[Record]
    check: list[Record]
    fit_name: str = "the validation split"
    check_name: str = "the held-out split"


def quantize_export(
    export_dir: str | Path,
    rows: Rows,
    config: QuantizeConfig = QuantizeConfig(),
    certify_config: CertifyConfig = CertifyConfig(),
    say: Callable[[str], None] | None = None,
) -> QuantizeResult:
    """`export_dir/encoder.int8.onnx` and its report `int8.json` (module docstring); nothing with
    `config.int8` off."""
    folder, say = Path(export_dir), say or (lambda line: None)
    if not config.int8:
        return QuantizeResult(str(folder), False, False, "quantize.int8 is off", {})
    graph = folder / ONNX_FILE
    if not graph.is_file():
        return _not_quantized(
            folder, f"no {ONNX_FILE}: the family keeps its backbone in torch, or onnx is missing"
        )
    if not rows.check:
        return _not_quantized(folder, "no rows to measure it on (no held-out split)", failed=False)
    started = time.perf_counter()
    model = load_decision_model(folder)
    fit = rows.fit or rows.check  # no validation split: fitted on the checking rows (the report says so)
    say(f"int8: answering {_count(rows)} at fp32 and int8, trying {', '.join(s.name for s in SCHEMES)}")
    try:
        chosen = choose_scheme(folder, model, fit, config)
    except QuantizationFailed as error:
        return _not_quantized(folder, f"ONNX Runtime could not quantize {graph}: {error}")
    except (RuntimeError, ValueError, OSError) as error:  # onnxruntime's own errors on loading the graph
        return _not_quantized(
            folder, f"ONNX Runtime could not run {INT8_GRAPH}: {type(error).__name__}: {error}"
        )
    report = measure(model, chosen, rows, config, certify_config)
    report |= {
        "graph": INT8_GRAPH,
        "graph_sha256": file_sha256(folder / INT8_GRAPH),
        "scheme": chosen.scheme.name,
        "schemes_tried": chosen.tried,
        "seconds": time.perf_counter() - started,
    }
    write_int8(folder, report)
    (say if report["passes"] else log.warning)(f"int8 ({chosen.scheme.name}): {report['why']}")
    return QuantizeResult(str(folder), True, report["passes"], report["why"], report["overall"])


@dataclass(frozen=True)
class Chosen:
    """The int8 model of the scheme kept, its answers to the fitting rows, and every scheme's agreement there."""

    scheme: Scheme
    model: DecisionModel
    fit: tuple[list[ScoredDecision], list[np.ndarray]]
    tried: list[dict[str, Any]]


def choose_scheme(folder: Path, fp32: DecisionModel, fit: list[Record], config: QuantizeConfig) -> Chosen:
    """The first of `SCHEMES` (the fastest first) whose argmax agreement with fp32 on the fitting rows reaches
    `config.min_agreement`, else the last (the closest): its graph at `folder/encoder.int8.onnx`."""
    _, reference = served_logits(fp32, fit)
    tried = []
    for scheme in SCHEMES:
        graph = quantize_graph(folder / ONNX_FILE, folder / INT8_GRAPH, scheme)
        # Loaded again: its own caches (the joint family's field vectors), never filled by the fp32 passes.
        int8 = replace(load_decision_model(folder), encoder=OnnxEncoder(graph))
        decisions, logits = served_logits(int8, fit)
        agreement = float(
            np.mean([int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(reference, logits)])
        )
        tried.append({"scheme": scheme.name, "fit_argmax_agreement": agreement})
        if agreement >= config.min_agreement:
            break
    return Chosen(scheme, int8, (decisions, logits), tried)


def _count(rows: Rows) -> str:
    return f"{len(rows.fit):,} rows to fit on and {len(rows.check):,} to check on"


def _not_quantized(folder: Path, why: str, failed: bool = True) -> QuantizeResult:
    """The report of an encoder not quantized; one warning line where quantizing was tried and failed."""
    (log.warning if failed else log.info)("int8: not quantized, served at fp32: %s", why)
    write_int8(folder, {"quantized": False, "passes": False, "why": why, "graph": INT8_GRAPH})
    return QuantizeResult(str(folder), False, False, why, {})


def measure(
    fp32: DecisionModel, chosen: Chosen, rows: Rows, config: QuantizeConfig, certify_config: CertifyConfig
) -> dict[str, Any]:
    """The report: the int8 model's calibrator and certificates fitted on its answers to the fitting rows, and
    int8 against fp32 on `rows.check` (`scoring.precision`), with the verdict."""
    int8, fit = chosen.model, rows.fit or rows.check
    fit_decisions, fit_logits = chosen.fit
    # The fp32 model's kind of calibrator, refitted on int8's logits (on the gold labels, as the calibrate stage
    # fits): a kind with per-question biases where fp32 has none would move answers int8 did not move.
    shipped = fp32.family.calibrator(fp32.loaded)
    choice = choose_calibrator(fit_decisions, fit_logits, kinds=(shipped.kind,))
    certificates = certify(fit_decisions, choice.cross_fitted, certify_config)
    checked, reference_logits = served_logits(fp32, rows.check)
    _, candidate_logits = served_logits(int8, rows.check)
    reference = shipped.apply(checked, reference_logits)
    candidate = choice.calibrator.apply(checked, candidate_logits)
    figures = compare_precisions(checked, reference, candidate)
    fp32_automation = _automation(checked, reference, fp32.automation.certificates, certify_config)
    int8_automation = _automation(checked, candidate, certificates, certify_config)
    figures["overall"] |= {
        "certified_coverage_fp32": fp32_automation.overall.coverage if fp32_automation else None,
        "certified_coverage": int8_automation.overall.coverage if int8_automation else None,
    }
    passes, why = verdict(figures["overall"], config)
    options = {d.question.id: tuple(d.question.options) for r in [*fit, *rows.check] for d in r.decisions}
    held = int8_automation.by_question if int8_automation else {}
    certificates = {
        q: replace(c, options=options.get(q, ()), heldout=asdict(held[q]) if q in held else None)
        for q, c in certificates.items()
    }
    return {
        "quantized": True,
        "precision": "int8",
        "method": METHOD,
        "fitted_on": f"{rows.fit_name if rows.fit else rows.check_name}: {len(fit_decisions):,} decisions",
        "measured_on": f"{rows.check_name}: {len(checked):,} decisions",
        "bounds": asdict(config),
        "passes": passes,
        "why": why,
        "host": int8_host_problem() or "VNNI present: int8 matrix products run natively",
        **figures,
        "calibrator": choice.calibrator.to_json(),
        "certificates": {q: c.to_dict() for q, c in certificates.items()},
    }


def _automation(
    decisions: list[ScoredDecision],
    probabilities: list[np.ndarray],
    certificates: dict[str, Certificate],
    config: CertifyConfig,
) -> AutomationReport | None:
    """What `certificates` automate of these answers; None without certificates."""
    if not certificates:
        return None
    return automation_report(decisions, probabilities, certificates, config.score_error)


def run_rows(run_dir: str | Path) -> Rows:
    """A run folder's validation split to fit on and held-out split to check on; none without a saved split
    (the stage then says it has nothing to measure on)."""
    run = RunFolder(run_dir)
    if not run.split.is_file():
        return Rows([], [])
    split = SplitData.load(run.split).split
    return Rows(split.validation, split.heldout)


def halves(records: list[Record]) -> Rows:
    """`records` split in two by row (by group where rows have one, so a group stays on one side): the
    rows of `decision quantize --data`."""
    sides: tuple[list[Record], list[Record]] = ([], [])
    for index, record in enumerate(records):
        key = record.group if record.group is not None else str(index)
        sides[hashlib.blake2b(key.encode(), digest_size=2).digest()[0] % 2].append(record)
    return Rows(sides[0], sides[1], "half of the rows given", "the other half")
