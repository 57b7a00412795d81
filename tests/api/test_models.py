"""Model names and `/v1/models` (docs/serving.md): an export answers under its manifest's name, never its
folder's, and every listed model states the limits a request must keep."""

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipeline.data.contract import MAX_SCORE_LEVELS, MIN_SCORE_LEVELS
from pipeline.serving.catalog import export_name
from pipeline.serving.keys import KeyStore, hash_key
from tests.api.conftest import QUESTIONS, make_app
from tests.api.conftest import wait_ready as ready

LINEAGE = {
    "base": "data/snapshots/minilm",
    "family": "laya",
    "source_digest": "d" * 64,
    "calibrator": {"kind": "type_temperature", "sha256": "c" * 64},
    "exported_at": "2025-01-01T00:00:00Z",
}


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


@pytest.fixture(scope="module")
def keyed_client(served_folder, tmp_path_factory):
    finetunes = tmp_path_factory.mktemp("finetunes")
    shutil.copytree(served_folder, finetunes / "alice-tune")
    (finetunes / "alice-tune" / "manifest.json").write_text('{"owner": "alice"}')
    keys = KeyStore({hash_key("alice-key"): "alice"})
    with TestClient(make_app(served_folder, keys=keys, finetunes=finetunes, limits=_limits())) as client:
        yield ready(client)


def _limits():
    from pipeline.serving.body import BodyLimits

    return BodyLimits(max_body_bytes=1_000_000, max_compressed_bytes=500_000)


def test_every_model_states_its_limits(keyed_client):
    models = keyed_client.get("/v1/models", headers={"Authorization": "Bearer alice-key"}).json()["models"]
    assert {m["name"] for m in models} >= {"default", "jev-latest", "alice-tune"}
    for model in models:
        limits = model["limits"]
        assert limits["max_questions"] == 64
        assert limits["choice_options"] == {"min": 2, "max": 255}
        assert limits["score_levels"] == {"min": MIN_SCORE_LEVELS, "max": MAX_SCORE_LEVELS}
        assert limits["max_body_bytes"] == 1_000_000 and limits["max_compressed_body_bytes"] == 500_000
        assert limits["max_question_chars"] == 20_000 and limits["max_state_chars"] == 200_000
    serving = next(m for m in models if m["name"] == "default")["limits"]
    assert serving["max_len"] == 96  # the tiny model's (tests/tiny.py)
    tune = next(m for m in models if m["name"] == "alice-tune")
    assert tune["limits"]["max_len"] is None  # not loaded yet: known once first used
    body = {"model": "alice-tune", "state": "fine", "questions": QUESTIONS}
    assert keyed_client.post(
        "/v1/systemone", json=body, headers={"Authorization": "Bearer alice-key"}
    ).is_success
    models = keyed_client.get("/v1/models", headers={"Authorization": "Bearer alice-key"}).json()["models"]
    assert next(m for m in models if m["name"] == "alice-tune")["limits"]["max_len"] == 96


def test_the_stated_score_levels_are_the_ones_enforced(keyed_client):
    def ask(levels: int) -> int:
        question = {"type": "score", "criteria": [f"level {i}" for i in range(levels)]}
        return keyed_client.post(
            "/v1/systemone", json={"state": "s", "questions": {"q": question}}
        ).status_code

    assert ask(MIN_SCORE_LEVELS) == 200 and ask(MAX_SCORE_LEVELS) == 200
    assert ask(MAX_SCORE_LEVELS + 1) == 422 and ask(MIN_SCORE_LEVELS - 1) == 422
