"""`decision retrain` hands its options to the flow by name (--allow-unpinned among them), checks the run's
inputs before a flow run starts, and the flow's own process runs the flow on what it was handed."""

import contextlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

import flows.launched
from pipeline.cli.main import main
from tests.flows.processes import record_launches, skip_input_checks

ROOT = Path(__file__).resolve().parents[2]


def test_the_flows_process_runs_the_flow_on_its_request_and_writes_its_result(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(flows.launched, "stoppable_run", contextlib.nullcontext)  # no API to start
    request, result = tmp_path / "request.json", tmp_path / "result.json"
    request.write_text(json.dumps({"run_config": "tiny", "allow_unpinned": True}))
    flow = lambda **parameters: calls.append(parameters) or {"accuracy": float("nan")}  # noqa: E731
    assert flows.launched.run_launched(flow, "retrain", (), "", [str(request), str(result)]) == 0
    assert calls == [{"run_config": "tiny", "allow_unpinned": True}]
    assert json.loads(result.read_text()) == {"accuracy": None}  # strict JSON: NaN is null
    assert flows.launched.run_launched(flow, "retrain", (), "", []) == 2  # typed by hand: it says where to go
    assert "started by `decision retrain`" in capsys.readouterr().err


def test_decision_retrain_launches_the_flow_with_allow_unpinned(monkeypatch):
    skip_input_checks(monkeypatch)
    launched = record_launches(monkeypatch)
    assert main(["retrain", "--run-config", "tiny"]) == 0 and main(["retrain", "--allow-unpinned"]) == 0
    assert [launch.parameters["allow_unpinned"] for launch in launched] == [False, True]
    assert {launch.module for launch in launched} == {"flows.retrain"}


def test_a_run_config_that_does_not_exist_is_one_line_and_exit_2_before_a_flow_run(monkeypatch, capsys):
    launched = record_launches(monkeypatch)
    assert main(["retrain", "--run-config", "no-such-run"]) == 2 and not launched
    assert (
        capsys.readouterr().err.strip()
        == "decision retrain: run config 'no-such-run': no file configs/no-such-run.yaml"
    )


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("data: DIR/missing.jsonl", "missing.jsonl: no such file or folder"),
        ("data: DIR/empty.jsonl", "empty.jsonl: no rows"),
        ("base: DIR/nope", "nope: no such folder"),
    ],
)
def test_inputs_that_are_not_there_are_one_line_before_a_flow_run_even_unpinned(
    setting, said, synthetic_train_file, tiny_base, tmp_path, capsys, monkeypatch
):
    # With --allow-unpinned nothing opened them first: the flow run failed with Prefect's traceback, exit 1.
    launched = record_launches(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "configs").mkdir()  # beside the params file, where run configs are found
    shutil.copyfile(ROOT / "params.yaml", tmp_path / "params.yaml")
    key, value = setting.replace("DIR", str(tmp_path)).split(": ")
    inputs = {"data": str(synthetic_train_file), "base": str(tiny_base)} | {key: value}
    (tmp_path / "configs" / "mine.yaml").write_text(yaml.safe_dump({"retrain": inputs}))
    assert main(["retrain", "--run-config", "mine", "--allow-unpinned"]) == 2 and not launched
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("decision retrain: ") and said in line, line
