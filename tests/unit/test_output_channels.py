"""`--json` changes stdout only: a long command's progress stays on stderr, and `--quiet` is what silences it.

Each command runs on the tiny model for two steps; stdout must be exactly one JSON object either way.
"""

import json
import sys

import pytest

from pipeline.cli.main import main
from tests.flows.processes import record_launches, skip_input_checks


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(
        "train:\n  micro_batch: 4\n  grad_accum: 2\n  lora_r: 4\n  precision: fp32\n"
        "validate:\n  holdout_max_decisions: 60\n  holdout_fraction: 0.3\n"
    )
    return path


def _one_json_object(out: str) -> dict:
    assert out.count("\n") == 1 and out.endswith("\n"), out[:500]
    value = json.loads(out)
    assert isinstance(value, dict)
    return value


def _progress_lines(err: str) -> list[str]:
    """stderr less the warnings and notes a two-step fine-tune may print (they are not progress, and --quiet
    keeps them)."""
    return [line for line in err.splitlines() if line.strip() and not line.startswith(("warning:", "note:"))]


@pytest.fixture
def two_steps(tiny_base, synthetic_train_file, params, tmp_path):
    """The arguments of `decision COMMAND ... --json` that train the tiny model for two steps."""
    return lambda command: [
        command,
        "--data",
        str(synthetic_train_file),
        "--base",
        str(tiny_base),
        "--out",
        str(tmp_path / "out"),
        "--max-steps",
        "2",
        "--params",
        str(params),
        "--json",
    ]


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_json_keeps_the_training_progress_on_stderr(command, two_steps, capsys):
    assert main(two_steps(command)) == 0
    out, err = capsys.readouterr()
    assert _steps(command, _one_json_object(out)) == 2
    lines = _progress_lines(err)
    assert any(line.startswith("scored ") and "held-out decisions (base)" in line for line in lines), err
    assert any(line.startswith("train lora: step 2/2, loss ") for line in lines), err


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_quiet_silences_the_training_progress(command, two_steps, capsys):
    assert main([*two_steps(command), "-q"]) == 0
    out, err = capsys.readouterr()
    assert _steps(command, _one_json_object(out)) == 2
    assert _progress_lines(err) == []


def _steps(command: str, printed: dict) -> int:
    """The steps trained, as each command's --json says: train prints its training run, finetune the whole
    run."""
    return printed["steps"] if command == "train" else printed["train"]["steps"]


def test_on_a_terminal_the_bar_is_on_stderr_too(two_steps, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # capsys's stderr, standing in for a terminal
    assert main(two_steps("train")) == 0
    out, err = capsys.readouterr()
    assert _one_json_object(out)["steps"] == 2
    assert "train lora: 100%" in err and "2/2" in err  # tqdm's bar, beside the progress lines
    assert "train lora: step 2/2" in err


def test_evaluate_reports_on_stderr_unless_quiet(tiny_base, synthetic_train_file, capsys):
    args = ["evaluate", "--model", str(tiny_base), "--data", str(synthetic_train_file), "--slice", "0:20"]
    args.append("--json")
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert _one_json_object(out)["metrics"]["overall"]["decisions"] == 60
    assert [line.split(" ")[0] for line in _progress_lines(err)] == ["scoring", "scored"]
    assert main([*args, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert _one_json_object(out) and err == ""


def test_retrain_quiet_lowers_the_flows_console_log_to_warnings(monkeypatch):
    levels = ("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "MLFLOW_LOGGING_LEVEL")
    for name in levels:
        monkeypatch.delenv(name, raising=False)
    skip_input_checks(monkeypatch)
    launched = record_launches(monkeypatch)
    assert main(["retrain", "--json"]) == 0 and main(["retrain", "--json", "-q"]) == 0
    loud, quiet = launched
    assert loud.parameters == quiet.parameters  # the flow runs the same; only its console log is lowered
    assert [loud.env.get(name) for name in levels] == [None, None]
    assert [quiet.env[name] for name in levels] == ["WARNING", "WARNING"]


def test_keygen_json_changes_stdout_only(tmp_path, capsys):
    assert main(["keygen", "--owner", "alice", "--keys", str(tmp_path / "keys.json"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert _one_json_object(out)["owner"] == "alice"
    assert "stored only as a hash" in err
