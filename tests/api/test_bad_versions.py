"""Bad versions behind a followed alias: a truncated weight file, a missing calibrator, a version whose files
are gone. Each is a clear error naming what is wrong, the old model keeps serving, and a damaged folder never
loads."""

import logging
import shutil
import time
from pathlib import Path

import pytest

from pipeline.families import load_decision_model
from pipeline.families.base import ModelLayoutError
from pipeline.families.laya.export import export_model
from pipeline.families.laya_layout import load_model
from pipeline.scoring.calibrators import Calibrator

NAME = "decision-model"


def _export(base: Path, out: Path) -> Path:
    return Path(
        export_model(
            load_model(base), out, Calibrator(temperatures=(1.2, 1.0, 0.9)), {"source_digest": "x"}
        ).out
    )


def truncated(folder: Path) -> str:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors"


def calibrator_missing(folder: Path) -> str:
    (folder / "calibrator.json").unlink()
    return "calibrator.json"


def manifest_garbled(folder: Path) -> str:
    (folder / "manifest.json").write_text('{"calibrator": ')
    return "manifest.json"


@pytest.mark.parametrize("damage", [truncated, calibrator_missing, manifest_garbled])
def test_a_damaged_export_is_an_error_naming_the_file(tiny_base, tmp_path, damage):
    folder = _export(tiny_base, tmp_path / "export")
    name = damage(folder)
    with pytest.raises(ModelLayoutError, match=rf"{name}: "):
        load_decision_model(folder)


@pytest.fixture(scope="module")
def store(tiny_base, tmp_path_factory):
    """One store for the module's tests, with the good version registered once (a registration loads the
    model and answers with it, and a fresh store migrates its tables: seconds each): (its URI, that
    version)."""
    from pipeline.mlops.registry import register_export

    folder = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{folder}/mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        return uri, register_export(_export(tiny_base, folder / "good"), NAME)


@pytest.fixture
def registry(store, tmp_path, monkeypatch):
    """The module's store as the test's tracking store: (a folder of the test's own, the good version)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store[0])
    return tmp_path, store[1]


def _files_gone(version: str) -> None:
    """Delete the version's artifacts from the store, as a cleaned-up bucket would."""
    from pipeline.mlops.registry import client

    store = Path(client().get_model_version_download_uri(NAME, version).removeprefix("file://"))
    assert store.is_dir(), store
    shutil.rmtree(store)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "calibrator_missing", "files_gone"])
def test_a_bad_version_behind_the_alias_never_replaces_the_serving_one(registry, tiny_base, damage, caplog):
    from pipeline.mlops.registry import client, register_export
    from pipeline.serving.catalog import Catalog

    folder, good = registry
    client().set_registered_model_alias(NAME, "champion", good)
    bad_folder = _export(tiny_base, folder / "bad")
    if damage != "files_gone":
        {"truncated": truncated, "calibrator_missing": calibrator_missing}[damage](bad_folder)
    bad = register_export(bad_folder, NAME)
    if damage == "files_gone":
        _files_gone(bad)
    catalog = Catalog(f"models:/{NAME}@champion", poll_s=0.1)
    catalog.start()
    try:
        _wait_for(lambda: catalog.serving is not None)
        with caplog.at_level(logging.ERROR):
            client().set_registered_model_alias(NAME, "champion", bad)
            _wait_for(lambda: any(f"keeping {NAME}/{good}" in r.getMessage() for r in caplog.records))
        assert catalog.serving.name == f"{NAME}/{good}"
    finally:
        catalog.stop()
    message = next(r.getMessage() for r in caplog.records if f"keeping {NAME}/{good}" in r.getMessage())
    expected = {
        "truncated": "model.safetensors",
        "calibrator_missing": "calibrator.json",
        "files_gone": "files deleted",
    }
    assert expected[damage] in message, message


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
