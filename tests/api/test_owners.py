"""Owners through the registry: `decision register --owner` tags a version, and a server on the registered
model's champion serves that version by name (NAME/VERSION) to its owner's keys and to no one else's."""

import pytest
from fastapi.testclient import TestClient

from pipeline.serving.keys import KeyStore, hash_key
from tests.api.conftest import QUESTIONS, make_app, wait_ready

NAME = "decision-model"
KEYS = KeyStore({hash_key("alice-key"): "alice", hash_key("bob-key"): "bob"})


@pytest.fixture()
def registry(tmp_path, monkeypatch, served_folder):
    from pipeline.cli.main import main
    from pipeline.mlops.promotion import CHAMPION, set_alias
    from pipeline.mlops.registry import client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    assert main(["register", "--export", str(served_folder), "--name", NAME]) == 0
    set_alias(NAME, CHAMPION, "1", "test")
    assert main(["register", "--export", str(served_folder), "--name", NAME, "--owner", "alice"]) == 0
    assert client().get_model_version(NAME, "2").tags["owner"] == "alice"
    assert "owner" not in client().get_model_version(NAME, "1").tags


def test_a_registered_fine_tune_is_served_by_name_to_its_owner_only(registry):
    with TestClient(make_app(f"models:/{NAME}@champion", keys=KEYS)) as api:
        wait_ready(api)

        def names(key: str) -> set[str]:
            listing = api.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["models"]
            return {m["name"] for m in listing}

        def ask(key: str):
            body = {"model": f"{NAME}/2", "state": "the order was late", "questions": QUESTIONS}
            return api.post("/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"})

        assert f"{NAME}/2" in names("alice-key") and f"{NAME}/2" not in names("bob-key")
        # Each entry says its family, version, alias and calibration summary.
        listing = {
            m["name"]: m
            for m in api.get("/v1/models", headers={"Authorization": "Bearer alice-key"}).json()["models"]
        }
        serving = listing[f"{NAME}/1"]
        assert (serving["family"], serving["version"], serving["alias"]) == ("laya", "1", "champion")
        assert serving["calibration"]["calibrator"] == "type_temperature"
        assert listing["default"]["version"] == "1"
        assert (listing[f"{NAME}/2"]["family"], listing[f"{NAME}/2"]["version"]) == ("laya", "2")
        answered = ask("alice-key")
        assert answered.status_code == 200 and answered.json()["model"] == f"{NAME}/2"
        assert ask("bob-key").status_code == 404


def test_each_caller_waits_in_a_line_of_its_own_by_key_owner_or_else_by_address(served_folder, monkeypatch):
    app = make_app(served_folder, keys=KeyStore({hash_key("alice-key"): "alice"}))
    lines = []
    with TestClient(app) as client:
        wait_ready(client)
        batcher = app.state.batcher
        real = batcher.submit

        async def recorded(key, payload, n_items, caller=None):
            lines.append(caller)
            return await real(key, payload, n_items, caller)

        monkeypatch.setattr(batcher, "submit", recorded)
        body = {"state": "late again", "questions": QUESTIONS}
        assert (
            client.post("/v1/systemone", json=body, headers={"Authorization": "Bearer alice-key"}).status_code
            == 200
        )
        assert client.post("/v1/systemone", json=body).status_code == 200
    assert lines == ["owner:alice", "address:testclient"]
