"""The flywheel end to end on real services: train and promote a champion, serve it over HTTP with the
inference log on, send 300 requests with the real typesafe client, label 200 of them through POST
/v1/feedback, harvest them into a new pinned data revision, retrain, and follow the lineage from the new
version back to the decision ids. A scheduled run with no new rows skips, saying why; the retrain automation
fires on the harvest's event."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pipeline.cli.main import main
from pipeline.data import synthetic
from pipeline.flywheel.log import LogConfig
from pipeline.flywheel.table import open_store
from pipeline.serving.keys import KeyStore, hash_key
from pipeline.stages.result import RunResult
from tests.api.conftest import live_server
from tests.flows.conftest import ROOT, write_tiny_params
from tests.flows.processes import record_launches
from tests.tiny import pin_inputs

pytestmark = pytest.mark.slow
typesafe_sdk = pytest.importorskip("typesafe_sdk")
KEYS = KeyStore({hash_key("alice-key"): "alice"})


def git_dvc_project(folder):
    for command in (
        ["git", "init", "-q"],
        ["git", "config", "user.email", "t@t"],
        ["git", "config", "user.name", "t"],
        [sys.executable, "-m", "dvc", "init", "-q"],
    ):
        subprocess.run(command, cwd=folder, check=True, capture_output=True)


@pytest.fixture()
def project(tmp_path, tiny_base, monkeypatch):
    """A git + DVC project whose data set is a folder of Parquet shards, pinned by `dvc add`."""
    git_dvc_project(tmp_path)
    data = tmp_path / "data" / "tickets"
    data.mkdir(parents=True)
    synthetic.write_rows(synthetic.generate_rows(160, seed=11), data / "part-0000.parquet")
    subprocess.run(
        [sys.executable, "-m", "dvc", "add", "-q", "data/tickets"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    (base,) = pin_inputs(tmp_path, tiny_base)  # the base in dvc.lock; the data set by its data/tickets.dvc
    params = write_tiny_params(
        tmp_path,
        data,
        base,
        pin=False,
        flywheel={"inference": str(tmp_path / "inference"), "retrain_after_rows": 150},
    )
    monkeypatch.chdir(tmp_path)
    return params


def ask_typesafe(url: str, rows: list[dict]) -> list[str]:
    """One request per row through the real client; the decision ids from its raw responses."""
    from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

    ids = []
    with TypeSafeClient(api_key="alice-key", base_url=url) as client:
        for row in rows:
            q = row["questions"]
            result = client.system_one(
                state=row["state"],
                questions={
                    "tone": Choice(instructions=q["tone"]["instructions"], criteria=q["tone"]["criteria"]),
                    "intensity": Score(
                        instructions=q["intensity"]["instructions"], criteria=q["intensity"]["criteria"]
                    ),
                    "is_negative": Noul(instructions=q["is_negative"]["instructions"]),
                },
            )
            assert result.choices["tone"].choice in q["tone"]["criteria"]  # the client parsed the answer
            ids.append(result.raw_http_response.json()["x_decision_id"])
    return ids


def test_served_decisions_labelled_harvested_and_retrained_with_lineage(
    prefect_harness, mlflow_store, project, tmp_path
):
    from flows.harvest import harvest_flow
    from flows.retrain import retrain
    from pipeline.mlops.promotion import CHAMPION, current
    from pipeline.mlops.registry import client
    from pipeline.serving.catalog import Catalog
    from pipeline.serving.server import ServerConfig, create_app

    first = retrain(str(project), lock=str(tmp_path / "dvc.lock"))
    assert first.release.promoted and current("tiny-model", CHAMPION) == "1"
    unchanged = retrain(str(project), lock=str(tmp_path / "dvc.lock"), only_new_data=True)
    assert (
        unchanged.skip_reason.startswith("skipped: no new rows in") and "version 1" in unchanged.skip_reason
    )

    traffic = synthetic.generate_rows(300, seed=99)
    log = LogConfig(str(tmp_path / "inference"), flush_s=0.5)
    app = create_app(Catalog("models:/tiny-model@champion", poll_s=0.5), KEYS, ServerConfig(), log_config=log)
    with live_server(app, timeout_s=120) as url:
        ids = ask_typesafe(url, traffic)
        labels = [{"decision_id": i, "gold": row["gold"]} for i, row in zip(ids[:200], traffic[:200])]
        for start in range(0, 200, 50):  # four requests of 50 items
            stored = httpx.post(
                f"{url}/v1/feedback",
                json=labels[start : start + 50],
                headers={"Authorization": "Bearer alice-key"},
                timeout=60,
            )
            assert stored.status_code == 200 and stored.json() == {"stored": 150, "decisions": 50}, (
                stored.text
            )
    assert len(set(ids)) == 300 and open_store(tmp_path / "inference").decisions().num_rows == 300

    harvested = harvest_flow(str(project))
    assert harvested["rows"] == 200 and harvested["labels"] == 600 and harvested["ready"]
    assert harvested["models"] == ["tiny-model/1"] and harvested["revision"] != harvested["previous_revision"]
    assert harvest_flow(str(project))["rows"] == 0  # nothing new the second time

    second = retrain(str(project), lock=str(tmp_path / "dvc.lock"), only_new_data=True)
    assert isinstance(second, RunResult) and second.release.version == "2"
    assert second.tracked.revision.changed and second.tracked.revision.previous_version == "1"
    assert second.release.gate.reasons  # promoted or held, with its reasons
    print(
        f"\nflywheel: {len(ids)} answered, 200 labelled; {harvested['rows']} rows harvested, revision "
        f"{harvested['previous_revision'][:8]} -> {harvested['revision'][:8]}; version 2 "
        f"{'promoted' if second.release.promoted else 'held'}: {'; '.join(second.release.gate.reasons)}"
    )
    version = client().get_model_version("tiny-model", "2")
    assert version.tags["gate"] in ("promote", "hold") and version.tags["gate_reasons"]

    # Lineage: the version's data revision is the harvest's, whose MLflow run lists the decision ids it took.
    assert version.tags["data_md5"] == harvested["revision"]
    run = client().get_run(harvested["mlflow_run_id"])
    assert run.data.params["revision"] == harvested["revision"] and run.data.metrics["rows"] == 200
    listed = client().download_artifacts(run.info.run_id, "harvest/decision_ids.txt", str(tmp_path))
    assert set(Path(listed).read_text().split()) == set(ids[:200])


def test_the_automation_runs_the_retrain_deployment_when_a_harvest_is_ready(prefect_api, tmp_path):
    """A real server with its trigger service: a ready harvest, then drift of the run's model, each create a
    retrain flow run of the deployment; drift of another model creates none; a broken certificate of the run's
    model creates one whose `reason` names the event and its reason."""
    script = f"""
import asyncio, sys, time
from prefect.client.orchestration import get_client
from prefect.events import emit_event
from flows.flywheel_automations import retrain_on_new_data
from flows.retrain import retrain

deployment_id = retrain.to_deployment(name="retrain").apply()
retrain_on_new_data("{tmp_path / "params.yaml"}")
time.sleep(3)  # the trigger service loads new automations on its own cycle
emit_event("decision.harvest.ready", resource={{"prefect.resource.id": "decision.dataset.data/tickets"}},
           payload={{"rows": 200}})
def retrain_runs(count):
    deadline = time.monotonic() + 90
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            started = [r for r in client.read_flow_runs() if r.deployment_id == deployment_id]
            if len(started) >= count:
                return started
            time.sleep(1)
    sys.exit(f"fewer than {{count}} retrain runs within 90 s")

print("PARAMETERS", retrain_runs(1)[0].parameters)
emit_event("decision.drift.detected", resource={{"prefect.resource.id": "decision-model.tickets"}},
           payload={{"share": 0.6}})
retrain_runs(2)
emit_event("decision.drift.detected", resource={{"prefect.resource.id": "decision-model.other"}})
time.sleep(10)
print("RUNS", len(retrain_runs(2)))  # another model's drift starts nothing
emit_event("decision.certificate.broken", resource={{"prefect.resource.id": "decision-model.tickets"}},
           payload={{"reason": "tone broken: 6 wrong of 40 automated with feedback (0.150)"}})
reasons = [r.parameters.get("reason") for r in retrain_runs(3)]
print("REASONS", reasons)
"""
    (tmp_path / "params.yaml").write_text("retrain:\n  data: data/tickets\n  model_name: tickets\n")
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=prefect_api,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    parameters = done.stdout.split("PARAMETERS", 1)[1].split("RUNS")[0]
    assert "'only_new_data': True" in parameters
    assert done.stdout.split("RUNS", 1)[1].split("REASONS")[0].strip() == "2"
    reasons = done.stdout.split("REASONS", 1)[1]
    assert "'started by decision.certificate.broken: tone broken: 6 wrong of 40 automated" in reasons
    assert "'started by decision.harvest.ready'" in reasons  # an event without a reason: its name


def test_decision_harvest_runs_the_flow_in_its_own_process(prefect_api, tmp_path):
    """`decision harvest` as a user runs it: the flow `harvest` through a real Prefect API, JSON out; a data
    set that is one file is exit 2 with what to do."""
    import json

    from tests.data.test_harvest import label, log_decisions

    folder = tmp_path / "tickets"
    folder.mkdir()
    synthetic.write_rows(synthetic.generate_rows(20, seed=3), folder / "part-0.jsonl")
    store = open_store(tmp_path / "inference")
    label(store, log_decisions(store, 5))
    # The run's model made them: harvest takes the labelled decisions of retrain.model_name only.
    (tmp_path / "params.yaml").write_text(
        "flywheel:\n  retrain_after_rows: 5\nretrain:\n  model_name: tickets\n"
    )
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "harvest",
        "--params",
        str(tmp_path / "params.yaml"),
        "--dataset",
        str(folder),
        "--inference",
        str(tmp_path / "inference"),
        "--json",
        "-q",
    ]
    done = subprocess.run(command, env=prefect_api, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 5 and summary["ready"] and summary["mlflow_run_id"]
    single = [*command[:7], str(folder / "part-0.jsonl"), *command[8:]]
    refused = subprocess.run(
        single, env=prefect_api, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2 and "move it into a folder" in refused.stderr


@pytest.mark.parametrize(
    ("name", "entrypoint"), [("harvest", "flows.harvest:harvest_flow"), ("monitor", "flows.monitor:monitor")]
)
def test_the_shipped_flywheel_deployments_are_scheduled_but_off(name, entrypoint):
    import importlib

    import yaml

    shipped = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployment = next(d for d in shipped["deployments"] if d["name"] == name)
    module, _, attribute = entrypoint.partition(":")
    flow = getattr(importlib.import_module(module), attribute)
    assert deployment["entrypoint"] == f"{module.replace('.', '/')}.py:{attribute}" and flow.name == name
    assert [s["active"] for s in deployment["schedules"]] == [False]
    assert set(deployment["parameters"]) <= set(flow.parameters.properties)


def test_harvest_into_a_data_set_that_does_not_exist_is_one_line_before_a_flow_run(
    prefect_harness, tmp_path, capsys, monkeypatch
):
    launched = record_launches(monkeypatch)
    missing = tmp_path / "no" / "rows"
    assert main(["harvest", "--dataset", str(missing), "--inference", str(tmp_path / "inference")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"decision harvest: {missing}: no such folder; harvested rows go into an existing folder of "
        "Parquet or JSONL shards (the run config's retrain.data, or --dataset)"
    ]
    assert not launched
    assert list(tmp_path.iterdir()) == []
