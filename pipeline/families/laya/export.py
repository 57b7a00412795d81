"""The Laya family's merged export: a fine-tune becomes one self-describing Laya-layout folder, written
crash-safe.

LoRA is merged into a copy on the CPU (the training model keeps its adapters and its device memory does not
grow); every tensor is checked finite, then written in fp16 with the temperatures in `rl_agent_config.json`
and a `manifest.json` with lineage, `rl_agent_config.json` last (`pipeline.families.exporting` stages and
swaps).

    export_model(loaded, "models/tuned", (1.2, 1.0, 0.9), manifest)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pipeline.families.base import ExportResult
from pipeline.families.exporting import (
    MANIFEST,
    already_exported,
    calibrator_entry,
    check_finite,
    merged_copy,
    write_calibrator,
    write_files,
    write_marker_last,
    write_staged,
)
from pipeline.families.laya_layout import CONFIG_FILE, LoadedModel
from pipeline.families.planned_layers import current_plan, materialise_plan, plan_manifest
from pipeline.layer_plans import KEY as PLAN_KEY
from pipeline.scoring.calibrators import Calibrator, as_calibrator

# laya.Agent reads rl_agent_config.json only: a richer calibrator is folded to its type temperatures there.
FOLDED = (
    "laya.Agent applies only the per-type temperatures in rl_agent_config.json (the {kind} transform is not in "
    "its format)"
)
SAME = "laya.Agent applies the same per-type temperatures (rl_agent_config.json)"


def export_model(
    loaded: LoadedModel,
    out: str | Path,
    calibrator: Calibrator | tuple[float, ...] | list[float],
    manifest: dict[str, Any],
    files: dict[str, bytes] | None = None,
) -> ExportResult:
    """Merge, check and write `loaded` to `out` crash-safe, with `files` beside it (each named in `manifest`);
    a no-op when `out` already holds this export."""
    out = Path(out)
    calibrator = as_calibrator(calibrator)
    config = {**loaded.config, "temperature": [float(t) for t in calibrator.temperatures], "fine_tuned": True}
    # laya.Agent runs every layer its encoder config lists: a plan is written out as the native stack it runs.
    plan = current_plan(loaded.model.encoder)
    config.pop(PLAN_KEY, None)
    if plan is not None:
        config["layer_plan_materialised"] = plan_manifest(plan, "materialised")
    entry = calibrator_entry(
        calibrator, FOLDED.format(kind=calibrator.kind) if calibrator.questions else SAME
    )
    manifest = {
        **manifest,
        "calibrator": entry,
        "layer_plan": plan_manifest(plan, "materialised"),
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if already_exported(out, config, manifest, CONFIG_FILE, CONFIG_FILE, calibrator):
        return ExportResult(str(out), False, json.loads((out / MANIFEST).read_text()))
    model = merged_copy(loaded.model)
    materialise_plan(model.encoder)
    state = model.state_dict()
    check_finite(state)
    write_staged(
        out,
        lambda staging: _write_layout(
            model, state, loaded.tokenizer, config, manifest, calibrator, staging, files
        ),
    )
    return ExportResult(str(out), True, manifest)


def _write_layout(model, state, tokenizer, config, manifest, calibrator, folder: Path, files) -> None:
    from safetensors.torch import save_file

    write_calibrator(folder, calibrator)
    write_files(folder, files)
    save_file(
        {k: v.detach().half().contiguous() for k, v in state.items()}, str(folder / "model.safetensors")
    )
    model.encoder.config.save_pretrained(str(folder / "encoder"))
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    write_marker_last(folder, CONFIG_FILE, lambda partial: partial.write_text(json.dumps(config, indent=2)))
