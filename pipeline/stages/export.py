"""The export stage: a fine-tune becomes one servable, self-describing folder, crash-safe (any family).

decision export --adapter runs/lora --out runs/export
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import TrainConfig
from pipeline.data.pins import current_md5
from pipeline.families import load_decision_model, pick_family, resolve_training
from pipeline.families.base import ExportResult
from pipeline.families.exporting import read_manifest
from pipeline.lineage import export_manifest
from pipeline.rundir import RunFolder
from pipeline.scoring.calibrators import Calibrator


def export_folder(source: str | Path, out: str | Path) -> ExportResult:
    """`decision export`: a fine-tune folder (LoRA adapters, a full model, an export) to a merged export at `out`."""
    source, out = Path(source), Path(out)
    family = pick_family(source)
    if source.resolve() == out.resolve() and family.is_export(out):
        return ExportResult(str(out), False, read_manifest(out))  # already a merged model in place
    model = load_decision_model(source)
    manifest = {**read_manifest(source), "source": str(source), "source_digest": current_md5(source)}
    return family.export(model.loaded, out, family.calibrator(model.loaded), manifest)


def export_stage(run_dir: str | Path, out: str | Path, data: str | Path, base: str | Path,
                 config: TrainConfig) -> ExportResult:  # fmt: skip
    """The flow's export stage: the run's fine-tune with the calibrator its calibrate stage chose, merged."""
    run = RunFolder(run_dir)
    _, config = resolve_training(base, config)  # the manifest records the family and method trained
    summary = json.loads(run.train_summary.read_text())
    calibration = json.loads(run.calibration.read_text())
    calibrator = Calibrator.from_json(json.loads(run.calibrator.read_text()))
    model = load_decision_model(run.finetune)
    manifest = export_manifest(data, base, config, model.family.name, summary, calibrator.temperatures,
                               calibration["heldout"], mapped_options(run))  # fmt: skip
    return model.family.export(model.loaded, out, calibrator, manifest)


def mapped_options(run: RunFolder) -> dict[str, list[str]] | None:
    """Per question, the options a run trained with when its data was a table read through a mapping (the label
    counts its validation report keeps, in the model's order); None for decision rows or no report."""
    if not run.validation.is_file():
        return None
    labels = json.loads(run.validation.read_text()).get("labels")
    return {qid: list(counts) for qid, counts in labels.items()} if labels else None
