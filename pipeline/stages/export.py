"""The export stage: a fine-tune becomes one servable, self-describing folder, crash-safe (any family).

decision export --adapter runs/lora --out runs/export

Where the family's encoder can run outside torch (an encoder backbone) and the onnx extra is installed, the
folder also gets `encoder.onnx`, the encoder pass as an ONNX graph with dynamic batch and token axes, which
`decision serve --backend auto|onnxruntime|openvino` runs (docs/serving.md, Backends); the weights stay the
source of truth and the server checks the graph against them at start.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.config import TrainConfig
from pipeline.data.leakage import state_fingerprints
from pipeline.data.pins import current_md5
from pipeline.data.split import SplitData
from pipeline.families import is_complete_export, load_decision_model, pick_family, resolve_training
from pipeline.families.base import BadBase, ExportResult
from pipeline.families.exporting import (
    CARRIED,
    CERTIFICATES,
    MANIFEST,
    NOVELTY,
    read_carried,
    read_manifest,
    with_carried,
    with_training_states,
)
from pipeline.families.runtimes.onnx_encoder import ONNX_FILE, export_encoder, onnxruntime_missing
from pipeline.lineage import MAPPING_OPTIONS, export_manifest, options_of
from pipeline.rundir import RunFolder
from pipeline.scoring.calibrators import Calibrator

log = logging.getLogger(__name__)


def export_folder(source: str | Path, out: str | Path) -> ExportResult:
    """`decision export`: a fine-tune folder (LoRA adapters, a full model, an export) to a merged export at
    `out`."""
    source, out = Path(source), Path(out)
    family = pick_family(source)
    if source.resolve() == out.resolve() and _written_export(out):
        return with_encoder_graph(
            ExportResult(str(out), False, read_manifest(out))
        )  # already merged in place
    if (problem := _replaced_model(out)) is not None:
        raise BadBase(problem)
    model = load_decision_model(source)
    manifest = {**read_manifest(source), "source": str(source), "source_digest": current_md5(source)}
    # `decision train` on a mapped table keeps the options in the fine-tune's training record.
    options = manifest.get(MAPPING_OPTIONS) or family.describe_training(source).get(MAPPING_OPTIONS)
    manifest |= {MAPPING_OPTIONS: options} if options else {}
    # The files the source carries (an export's: training states, certificates, the novelty gate), carried over.
    files: dict[str, bytes] = {}
    for entry in CARRIED:
        manifest, files = with_carried(manifest, files, entry, read_carried(source, entry))
    calibrator = family.calibrator(model.loaded)
    return with_encoder_graph(family.export(model.loaded, out, calibrator, manifest, files))


def _replaced_model(out: Path) -> str | None:
    """Why an export must not be written to `out`: it holds a model this project did not export (a base, a
    fine-tune, this one included, a Laya model from elsewhere), which the export would replace whole; an
    earlier export (its manifest written last) is replaced on purpose."""
    try:
        pick_family(out)
    except BadBase:  # no model there (or not a folder): the folder checks of the CLI say what they say
        return None
    if _written_export(out):
        return None
    return (
        f"{out}: holds a base or a fine-tune, not an export, and the export would replace it whole: give "
        "another --out"
    )


def _written_export(folder: Path) -> bool:
    """An export this project wrote: complete, with its manifest (a Laya-layout base is complete without
    one)."""
    return is_complete_export(folder) and (folder / MANIFEST).is_file()


def export_stage(
    run_dir: str | Path, out: str | Path, data: str | Path, base: str | Path, config: TrainConfig
) -> ExportResult:
    """The flow's export stage: the run's fine-tune with the calibrator its calibrate stage chose, merged."""
    run = RunFolder(run_dir)
    _, config = resolve_training(base, config)  # the manifest records the family and method trained
    summary = json.loads(run.train_summary.read_text())
    calibration = json.loads(run.calibration.read_text())
    calibrator = Calibrator.from_json(json.loads(run.calibrator.read_text()))
    model = load_decision_model(run.finetune)
    manifest = export_manifest(
        data,
        base,
        config,
        model.family.name,
        summary,
        calibrator.temperatures,
        calibration["heldout"],
        mapped_options(run),
    )
    manifest, files = with_training_states(manifest, training_states(run))
    certificates = run.certificates.read_bytes() if run.certificates.is_file() else None
    manifest, files = with_carried(manifest, files, CERTIFICATES, certificates)
    novelty = run.novelty.read_bytes() if run.novelty.is_file() else None
    manifest, files = with_carried(manifest, files, NOVELTY, novelty)
    return with_encoder_graph(model.family.export(model.loaded, out, calibrator, manifest, files))


def training_states(run: RunFolder) -> bytes | None:
    """The fingerprints of the run's training rows' states (`leakage.state_fingerprints`), which `decision
    evaluate` counts evaluation rows against; None without a saved split."""
    if not run.split.is_file():
        return None
    return state_fingerprints(r.state for r in SplitData.load(run.split).split.train).tobytes()


def with_encoder_graph(result: ExportResult) -> ExportResult:
    """`result`'s folder with its encoder as an ONNX graph beside the weights (`encoder.onnx`), made from the
    weights as written (as a server loads them); left as it is where the onnx extra is missing or the family
    keeps its backbone in torch (said in the log), or where a graph is already there for an unchanged
    export."""
    out = Path(result.out)
    graph = out / ONNX_FILE
    if graph.is_file() and not result.written:
        return result
    missing = onnxruntime_missing()
    if missing is not None:
        log.info("%s: no %s written: %s", out, ONNX_FILE, missing)
        return result
    model = load_decision_model(out)
    encoder = model.family.served_encoder(model.loaded)
    if encoder is None:
        log.info("%s: no %s: the %s family keeps this backbone in torch", out, ONNX_FILE, model.family.name)
        return result
    export_encoder(encoder, graph)  # staged beside it and renamed into place: never half a graph
    log.info("%s: encoder graph written (%s, %.0f MB)", out, ONNX_FILE, graph.stat().st_size / 1e6)
    return result


def mapped_options(run: RunFolder) -> dict[str, list[str]] | None:
    """Per question, the options a run trained with when its data was a table read through a mapping (the
    label counts its validation report keeps, in the model's order); None for decision rows or no report."""
    if not run.validation.is_file():
        return None
    return options_of(json.loads(run.validation.read_text()).get("labels"))
