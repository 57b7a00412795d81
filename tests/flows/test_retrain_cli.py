"""`python -m flows.retrain` and `decision retrain` pass --allow-unpinned through to the flow."""

import contextlib

import pytest

import flows.retrain
from pipeline.cli.main import main
from tests.flows.processes import record_launches


def test_the_flow_command_passes_allow_unpinned_to_the_flow(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(flows.retrain, "retrain", lambda *args, **kwargs: calls.append(kwargs) or {})
    monkeypatch.setattr(
        flows.retrain, "checked_before_a_run", lambda *args: None
    )  # pins: whatever this clone has
    monkeypatch.setattr(
        flows.retrain, "stoppable_run", contextlib.nullcontext
    )  # no flow runs: no API to start
    assert flows.retrain.main(["--json"]) == 0 and flows.retrain.main(["--allow-unpinned", "--json"]) == 0
    assert [call["allow_unpinned"] for call in calls] == [False, True]


def test_decision_retrain_launches_the_flow_with_allow_unpinned(monkeypatch):
    launched = record_launches(monkeypatch)
    assert main(["retrain", "--run-config", "tiny"]) == 0 and main(["retrain", "--allow-unpinned"]) == 0
    assert "--allow-unpinned" not in launched[0] and launched[1][-1] == "--allow-unpinned"
    assert launched[1][1:3] == ["-m", "flows.retrain"]


def test_a_run_config_that_does_not_exist_is_one_line_and_exit_2_before_a_flow_run(monkeypatch, capsys):
    monkeypatch.setattr(flows.retrain, "retrain", lambda *args, **kwargs: pytest.fail("a flow run started"))
    assert flows.retrain.main(["--run-config", "no-such-run"]) == 2
    assert (
        capsys.readouterr().err.strip() == "error: run config 'no-such-run': no file configs/no-such-run.yaml"
    )
