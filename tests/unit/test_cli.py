"""`decision validate`: its exit codes and its JSON output."""

import json
import subprocess
import sys

import pytest

from pipeline.cli.main import main
from pipeline.data import synthetic


def test_json_report_and_exit_zero(capsys, synthetic_file):
    assert main(["validate", str(synthetic_file), "--slice", "0:60", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 60 and report["kept"] + report["skipped_total"] == report["decisions"]
    assert all(set(example) == {"row", "question_id", "value"} for example in report["examples"].values())


def test_table_output_names_each_reason(capsys, synthetic_file):
    assert main(["validate", str(synthetic_file)]) == 0
    out = capsys.readouterr().out
    assert "invalid_json" in out and "kept" in out


def test_nothing_usable_exits_two(tmp_path, capsys):
    path = synthetic.write_rows([row for row, _, _ in synthetic.broken_rows()][:4], tmp_path / "bad.jsonl")
    assert main(["validate", str(path)]) == 2
    assert "no usable decision" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args", [["missing.jsonl"], ["rows.jsonl", "--slice", "500:600"], ["rows.jsonl", "--slice", "x"]]
)
def test_unreadable_input_or_bad_slice_exits_one(tmp_path, capsys, args):
    synthetic.write_rows(synthetic.generate_rows(10), tmp_path / "rows.jsonl")
    assert main(["validate", str(tmp_path / args[0]), *args[1:]]) == 1
    assert "decision validate:" in capsys.readouterr().err


def test_console_script_help():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli.main", "validate", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "--slice" in result.stdout


def test_json_output_is_strict_json_with_missing_metrics_as_null():
    import json
    import math

    from pipeline.cli.main import to_json

    text = to_json({"kl_soft": math.nan, "per_type": [{"ece": math.inf, "accuracy": 0.5}], "rows": 3})
    assert json.loads(text) == {"kl_soft": None, "per_type": [{"ece": None, "accuracy": 0.5}], "rows": 3}


def test_decision_monitor_runs_the_flow_module_with_its_options(monkeypatch):
    launched = []
    monkeypatch.setattr(subprocess, "call", lambda command, env: launched.append((command, env)) or 3)
    assert main(["monitor", "--model", "tickets@champion", "--window-hours", "6", "--json", "-q"]) == 3
    [(command, env)] = launched
    assert command == [sys.executable, "-m", "flows.monitor", "--model", "tickets@champion", "--params", "params.yaml",
                       "--window-hours", "6.0", "--json"]  # fmt: skip
    assert env["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "WARNING"  # --quiet


def test_commands_that_load_the_mlflow_model_say_nothing_about_type_hints():
    # MLflow warns at the pyfunc's class definition when `predict` has no hints, past any warnings filter; a user
    # of `decision predict` or `decision register` would see it in yellow on every call.
    done = subprocess.run([sys.executable, "-W", "default", "-c", "import pipeline.mlops.pyfunc"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "type hints" not in done.stderr, done.stderr
