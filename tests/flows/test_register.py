"""Registration is exactly once per idempotency key: a version is created with its tags in one call, so a
failure after it exists can never leave it without the key a retry looks it up by."""

import pytest


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "decision_config.json").write_text("{}")
    return folder


def test_a_version_carries_its_key_from_creation_and_a_retry_finds_it(store, monkeypatch):
    from mlflow import MlflowClient

    from pipeline.mlops.registry import client, register_export

    def fail(*args, **kwargs):
        raise RuntimeError("the process died after creating the version")

    # A separate tagging call after creation is where a crash used to leave an untagged version behind.
    monkeypatch.setattr(MlflowClient, "set_model_version_tag", fail)
    tags = {"idempotency_key": "k1", "data_md5": "abc"}
    version = register_export(store, "decision-model", tags=tags)
    # Every tag from creation on, and the family (this folder is none a family reads: "unknown").
    assert client().get_model_version("decision-model", version).tags == {**tags, "family": "unknown"}
    assert register_export(store, "decision-model", tags=tags) == version
    assert len(client().search_model_versions("name='decision-model'")) == 1
    other = register_export(store, "decision-model", tags={"idempotency_key": "k2"})
    assert other != version and len(client().search_model_versions("name='decision-model'")) == 2


def test_decision_register_tags_the_version_and_its_run_with_what_the_manifest_says_was_pinned(
    store, tiny_base, tmp_path
):
    import json
    import shutil

    from pipeline.cli.main import main
    from pipeline.mlops.registry import client

    export = shutil.copytree(tiny_base, tmp_path / "tiny-export")
    inputs = {"data": {"path": "mine.jsonl", "pinned": False}, "base": {"path": "base", "pinned": True}}
    (export / "manifest.json").write_text(json.dumps({"inputs": inputs}))
    assert main(["register", "--export", str(export), "--name", "decision-model"]) == 0
    version = client().get_model_version("decision-model", "1")
    run = client().get_run(version.run_id)
    for tags in (version.tags, run.data.tags):
        assert tags["data_pinned"] == "false" and tags["base_pinned"] == "true"


def test_serving_an_alias_no_version_holds_is_refused_saying_how_to_make_one(store, tmp_path, capsys):
    # It ran on, answering nothing and logging "keeping nothing" every poll (a run whose gate held its
    # version).
    from pipeline.cli.main import main
    from pipeline.mlops.registry import ensure_experiment, register_export

    args = ["serve", "--model", "models:/tickets@champion", "--port", "1"]
    # Outside the project folder there is no store: said so, and none is made (MLflow would make an empty
    # one).
    assert main(args) == 2
    assert f"no MLflow store at {tmp_path / 'mlflow.db'}" in capsys.readouterr().err
    assert not (tmp_path / "mlflow.db").exists()
    ensure_experiment()
    assert main(args) == 2
    assert "no model tickets is registered in this store" in capsys.readouterr().err
    register_export(store, "tickets", tags={"idempotency_key": "k1"})
    assert main(args) == 2
    assert "decision promote 1 --name tickets [--force] makes it the champion" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["calibrator.json", "weights"])
def test_decision_register_refuses_an_export_that_does_not_load_and_makes_no_version(
    damage, store, tiny_base, tmp_path, capsys
):
    # A folder with its marker but no calibrator or weights was registered (exit 0), and failed later
    # in every server that fetched it.
    from pathlib import Path

    from pipeline.cli.main import main
    from pipeline.families.laya.export import export_model
    from pipeline.families.laya_layout import load_model
    from pipeline.mlops.registry import client
    from pipeline.scoring.calibrators import Calibrator

    calibrator = Calibrator(temperatures=(1.2, 1.0, 0.9))
    export = Path(
        export_model(load_model(tiny_base), tmp_path / "laya-export", calibrator, {"source_digest": "x"}).out
    )
    assert main(["register", "--export", str(export), "--name", "whole"]) == 0
    assert main(["register", "--export", str(export), "--name", "whole"]) == 0  # the same bytes: one version
    assert "whole version 1 (already registered: the same export)" in capsys.readouterr().out
    assert len(client().search_model_versions("name='whole'")) == 1
    removed = next(export.rglob("*.safetensors")) if damage == "weights" else export / damage
    removed.unlink()
    assert main(["register", "--export", str(export), "--name", "damaged"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"decision register: {export}"), err
    assert not client().search_model_versions("name='damaged'")
