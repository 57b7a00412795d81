"""`python -m flows.retrain` and `decision retrain` pass --allow-unpinned through to the flow."""

import contextlib
import shutil
from pathlib import Path

import pytest
import yaml

import flows.retrain
from pipeline.cli.main import main
from tests.flows.processes import record_launches

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize(
    ("setting", "said"),
    [("data: DIR/missing.jsonl", "missing.jsonl: no such file or folder"),
     ("data: DIR/empty.jsonl", "empty.jsonl: no rows"),
     ("base: DIR/nope", "nope: no such folder")],
)  # fmt: skip
def test_inputs_that_are_not_there_are_one_line_before_a_flow_run_even_unpinned(setting, said, synthetic_train_file,
                                                                                 tiny_base, tmp_path, capsys,
                                                                                 monkeypatch):  # fmt: skip
    # With --allow-unpinned nothing opened them first: the flow run failed with Prefect's traceback, exit 1.
    monkeypatch.setattr(flows.retrain, "retrain", lambda *args, **kwargs: pytest.fail("a flow run started"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "configs").mkdir()  # beside the params file, where run configs are found
    shutil.copyfile(ROOT / "params.yaml", tmp_path / "params.yaml")
    key, value = setting.replace("DIR", str(tmp_path)).split(": ")
    inputs = {"data": str(synthetic_train_file), "base": str(tiny_base)} | {key: value}
    (tmp_path / "configs" / "mine.yaml").write_text(yaml.safe_dump({"retrain": inputs}))
    assert flows.retrain.main(["--run-config", "mine", "--allow-unpinned"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and said in line, line
