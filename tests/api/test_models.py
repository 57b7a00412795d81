"""Model names (DESIGN.md 5): an export answers under its manifest's name, never its folder's."""

import json
import shutil
from pathlib import Path

from fastapi.testclient import TestClient

from pipeline.serving.catalog import export_name
from tests.api.conftest import QUESTIONS, make_app
from tests.api.conftest import wait_ready as ready

LINEAGE = {"base": "data/snapshots/minilm", "family": "laya", "source_digest": "d" * 64,
           "calibrator": {"kind": "type_temperature", "sha256": "c" * 64}, "exported_at": "2025-01-01T00:00:00Z"}  # fmt: skip


def export_like(served_folder, tmp_path, manifest, name="export"):
    """The tiny model copied to a folder called like a flow run's export, with `manifest` as its manifest."""
    folder = tmp_path / name
    shutil.copytree(served_folder, folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_an_export_is_named_by_its_manifest_not_its_folder(served_folder, tmp_path):
    named = export_like(served_folder, tmp_path, {**LINEAGE, "name": "decision-model", "version": 3}, "a")
    assert export_name(named) == "decision-model/3"
    assert export_name(export_like(served_folder, tmp_path, {"name": "sentiment"}, "b")) == "sentiment"

    derived = export_name(export_like(served_folder, tmp_path, LINEAGE, "c"))
    assert derived.startswith("minilm-laya-") and len(derived.rpartition("-")[2]) == 8
    reexported = export_like(served_folder, tmp_path, {**LINEAGE, "exported_at": "2025-02-02T00:00:00Z"}, "d")
    assert export_name(reexported) == derived  # the same trained model and calibration: the same name
    recalibrated = {**LINEAGE, "calibrator": {"kind": "vector_scaling", "sha256": "e" * 64}}
    assert export_name(export_like(served_folder, tmp_path, recalibrated, "e")) != derived
    assert export_name(export_like(served_folder, tmp_path, {"owner": "team"}, "f")).startswith("model-")
    assert export_name(served_folder) == served_folder.name  # no manifest: a base, not an export


def test_the_server_answers_and_lists_under_the_manifest_name(served_folder, tmp_path):
    from pipeline.stages.export import export_folder

    folder = Path(export_folder(served_folder, tmp_path / "export").out)  # `decision export`: a real manifest
    with TestClient(make_app(folder)) as client:
        ready(client)
        name = export_name(folder)
        answered = client.post("/v1/systemone", json={"state": "fine", "questions": QUESTIONS})
        by_name = client.post("/v1/systemone", json={"model": name, "state": "fine", "questions": QUESTIONS})
        listed = {m["name"] for m in client.get("/v1/models").json()["models"]}
        health = client.get("/healthz").json()
    assert answered.json()["model"] == by_name.json()["model"] == health["model"] == name != "export"
    assert name in listed and "export" not in listed
