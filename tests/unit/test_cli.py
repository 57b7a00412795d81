"""`decision validate`: its exit codes and its JSON output."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli.main import main
from pipeline.data import synthetic
from tests.flows.processes import record_launches, skip_input_checks


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
def test_a_missing_file_or_a_bad_slice_is_one_line_and_exits_two(tmp_path, capsys, args):
    synthetic.write_rows(synthetic.generate_rows(10), tmp_path / "rows.jsonl")
    assert main(["validate", str(tmp_path / args[0]), *args[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("decision validate:")


def test_a_reversed_slice_says_so(tmp_path, capsys):
    synthetic.write_rows(synthetic.generate_rows(10), tmp_path / "rows.jsonl")
    assert main(["validate", str(tmp_path / "rows.jsonl"), "--slice", "5:2"]) == 2
    assert "--slice 5:2: needs 0 <= START < END" in capsys.readouterr().err


def test_console_script_help():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli.main", "validate", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "--slice" in result.stdout


def test_json_output_is_strict_json_with_missing_metrics_as_null():
    import json
    import math

    from pipeline.strict_json import to_json

    text = to_json({"kl_soft": math.nan, "per_type": [{"ece": math.inf, "accuracy": 0.5}], "rows": 3})
    assert json.loads(text) == {"kl_soft": None, "per_type": [{"ece": None, "accuracy": 0.5}], "rows": 3}


def test_decision_monitor_runs_the_flow_module_with_its_options(monkeypatch):
    import pipeline.flywheel.table
    import pipeline.stages.monitor

    monkeypatch.setattr(pipeline.stages.monitor, "resolve_version", lambda model: ("tickets", "3"))
    monkeypatch.setattr(pipeline.flywheel.table, "missing_log", lambda where: None)
    launched = record_launches(monkeypatch, exit_code=3)
    assert main(["monitor", "--model", "tickets@champion", "--window-hours", "6", "--json", "-q"]) == 3
    [launch] = launched
    assert launch.module == "flows.monitor"
    assert launch.parameters == {
        "model": "tickets@champion",
        "inference": None,
        "window_hours": 6.0,
        "window_end": None,
        "reference": None,
        "params_file": "params.yaml",
        "run_config": None,
    }
    assert launch.env["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "WARNING"  # --quiet


def test_the_monitor_watches_the_runs_champion_unless_told_another_model(tmp_path, monkeypatch, capsys):
    import pipeline.stages.monitor as module

    (tmp_path / "params.yaml").write_text("retrain:\n  model_name: decision-model\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "fly.yaml").write_text("retrain:\n  model_name: fly\n")
    monkeypatch.chdir(tmp_path)
    asked = []

    def resolve_version(model):
        asked.append(model)
        raise module.MonitorError(f"{model}: not registered here")  # one line, exit 2, as a real lookup says

    monkeypatch.setattr(module, "resolve_version", resolve_version)
    for flags in (["--run-config", "fly"], [], ["--run-config", "fly", "--model", "other/3"]):
        assert main(["monitor", *flags]) == 2
    assert asked == ["fly@champion", "decision-model@champion", "other/3"]


def test_commands_that_load_the_mlflow_model_say_nothing_about_type_hints():
    # MLflow warns at the pyfunc's class definition when `predict` has no hints, past any warnings filter; a
    # user of `decision predict` or `decision register` would see it in yellow on every call.
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import pipeline.mlops.pyfunc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "type hints" not in done.stderr, done.stderr


def test_an_empty_file_is_refused_as_such_not_as_an_empty_slice(tmp_path, capsys):
    for name in ("empty.jsonl", "empty.csv"):
        (tmp_path / name).write_text("")
        assert main(["validate", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert name in err and "slice" not in err


@pytest.fixture
def user_files(tmp_path):
    """What a user keeps that no model may be written over: a data file and a folder of notes."""
    (tmp_path / "rows.jsonl").write_text("{}\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--data", "d", "--base", "b"],
        ["finetune", "--data", "d", "--base", "b"],
        ["export", "--adapter", "a"],
        ["snapshot", "--from", "s"],
    ],
)
@pytest.mark.parametrize(
    ("out", "said"),
    [
        ("rows.jsonl", "a file"),
        ("notes", "a folder of other files (todo.txt)"),
        ("rows.jsonl/x", "is a file, so no folder can be made"),
    ],
)
def test_a_model_is_never_written_over_a_user_s_file_or_folder(user_files, capsys, command, out, said):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--out", str(user_files / out)])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert (user_files / "rows.jsonl").read_text() == "{}\n" and (user_files / "notes/todo.txt").is_file()


def test_a_model_folder_or_an_empty_one_may_be_written_again(tmp_path):
    from pathlib import Path

    from pipeline.families.base_folders import out_problem

    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "manifest.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    assert [out_problem(tmp_path / n) for n in ("export", "empty", "new/deeper")] == [None, None, None]
    assert out_problem(Path("/proc/no-such/x")) is not None  # no folder can be made there, not even by root


def test_predict_refuses_an_out_that_is_its_data_or_a_folder_before_loading_a_model(user_files, capsys):
    rows = str(user_files / "rows.jsonl")
    for out, said in ((rows, "the data being read"), (str(user_files / "notes"), "a folder")):
        assert main(["predict", "--model", "no-such-model", "--data", rows, "--out", out]) == 2
        assert said in capsys.readouterr().err
    assert (user_files / "rows.jsonl").read_text() == "{}\n"


def test_register_refuses_a_folder_that_is_no_export_and_a_name_mlflow_cannot_take(user_files, capsys):
    # A name with a space was registered, then needed quoting in every models:/ URI; `decision init` refused
    # it.
    for args, said in (
        (["--export", str(user_files / "notes")], "not a complete export"),
        (["--name", "a/b", "--export", str(user_files)], "no spaces, '/', ':' or '@'"),
        (["--name", "has space", "--export", str(user_files)], "no spaces, '/', ':' or '@'"),
        (["--name", "a@b", "--export", str(user_files)], "no spaces, '/', ':' or '@'"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["register", *args])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_finetune_on_data_with_no_usable_decision_is_refused_naming_it_and_leaves_no_run_folder(
    tiny_base, tmp_path, capsys
):
    good = synthetic.write_rows(synthetic.generate_rows(40), tmp_path / "good.jsonl")
    unusable = synthetic.write_rows(
        [row for row, _, _ in synthetic.broken_rows()][:4], tmp_path / "bad.jsonl"
    )
    for data, held in ((unusable, None), (good, unusable)):
        args = ["finetune", "--data", str(data), "--base", str(tiny_base), "--out", str(tmp_path / "out")]
        assert main([*args, *(["--eval-data", str(held)] if held else []), "--max-steps", "1"]) == 2
        assert f"{unusable}: no usable decision" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.run").exists()


@pytest.mark.parametrize("device", ["bogus", "cuda:7", "mps"])
def test_a_device_this_process_cannot_use_is_refused_before_a_model_loads(tmp_path, capsys, device):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--model", "no-such-model", "--data", "d.jsonl", "--device", device])
    assert exit_.value.code == 2 and f"argument --device: {device!r}" in capsys.readouterr().err


def test_evaluate_on_data_with_no_usable_decision_exits_two_naming_it(tiny_base, tmp_path, capsys):
    unusable = synthetic.write_rows(
        [row for row, _, _ in synthetic.broken_rows()][:4], tmp_path / "bad.jsonl"
    )
    assert main(["evaluate", "--model", str(tiny_base), "--data", str(unusable)]) == 2
    assert f"{unusable}: no usable decision" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--port", "70000", "a port number from 1 to 65535"),
        ("--max-queue", "0", "a whole number of at least 1"),
        ("--max-body-mb", "0", "a whole number of at least 1"),
        ("--max-batch", "0", "a whole number of at least 1"),
        ("--max-wait-ms", "-1", "milliseconds from 0"),
        ("--poll-seconds", "nan", "a positive number of seconds"),
        ("--log-flush-seconds", "0", "a positive number of seconds"),
        ("--shadow-share", "1.5", "a share above 0 and at most 1"),
        ("--log-sample", "0", "a share above 0 and at most 1"),
        ("--workers", "0", "a whole number of at least 1"),
        ("--threads", "0", "a whole number of at least 1"),
    ],
)
def test_a_server_setting_no_server_could_run_with_is_refused_at_start(capsys, flag, value, expected):
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--model", "models/none", flag, value])
    assert (
        refused.value.code == 2
        and f"argument {flag}: '{value}': expected {expected}" in capsys.readouterr().err
    )


def test_a_missing_shadow_or_finetunes_folder_or_a_taken_port_is_refused_before_a_model_loads(
    tmp_path, capsys
):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        refusals = {
            "--shadow": (["--shadow", str(tmp_path / "nope")], "no such folder"),
            "--finetunes": (["--finetunes", str(tmp_path / "nope")], "no such folder"),
            "--port": (["--port", port], f"127.0.0.1:{port}: another process listens there"),
        }
        for flag, (flags, said) in refusals.items():
            assert main(["serve", "--model", str(tmp_path), "--no-inference-log", *flags]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and said in err[0], (flag, err)


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--data", "d", "--base", "b", "--out", "o"],
        ["finetune", "--data", "d", "--base", "b", "--out", "o"],
        ["review", "--model", "m", "--out", "queue.jsonl"],
        ["smoke", "--url", "http://127.0.0.1:9", "--data", "d"],
        ["feedback", "import", "labels.jsonl"],
    ],
)
def test_a_bad_params_file_is_one_line_naming_it_and_its_key_exit_two(tmp_path, capsys, monkeypatch, command):
    from pathlib import Path

    params = tmp_path / "params.yaml"
    params.write_text(Path("params.yaml").read_text().replace("\n  epochs: ", "\n  epochs: -3 #", 1))
    monkeypatch.chdir(tmp_path)  # review's queue, a model's folder: nothing may be written there
    assert main([*command, "--params", str(params)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"decision {command[0]}: {params}: train.epochs: must be >= 1, got -3"]
    assert list(tmp_path.iterdir()) == [params]


def test_a_training_flag_out_of_range_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--data", "d", "--base", "b", "--out", "o", "--epochs", "0"])
    assert exit_.value.code == 2 and "argument --epochs: '0'" in capsys.readouterr().err


def test_scores_or_mapped_rows_are_never_written_into_the_folder_of_shards_being_read(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "shards").mkdir()
    pq.write_table(
        pa.table({"text": ["late", "fine"], "team": ["a", "b"]}), tmp_path / "shards" / "0.parquet"
    )
    inside = str(tmp_path / "shards" / "out.parquet")
    flags = ["--data", str(tmp_path / "shards"), "--state-column", "text", "--label-column", "team"]
    assert main(["predict", "--model", "no-such-model", *flags, "--out", inside]) == 2
    assert "inside the folder being read" in capsys.readouterr().err
    assert main(["map", *flags, "--write", inside]) == 2
    assert "inside the folder being read" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["0.parquet"]


@pytest.mark.parametrize("columns", [None, "80"])
def test_the_comparison_table_never_cuts_a_number_short(columns, monkeypatch, capsys):
    from types import SimpleNamespace

    from pipeline.cli.compare import print_comparison

    if columns:
        monkeypatch.setenv("COLUMNS", columns)  # a narrow terminal
    else:
        monkeypatch.delenv("COLUMNS", raising=False)  # a log or a pipe: wide enough for the whole table
    question = SimpleNamespace(
        question="all",
        decisions=239,
        accuracy_a=0.6234,
        accuracy_b=0.6820,
        accuracy_gain=0.0586,
        accuracy_gain_low=0.0123,
        accuracy_gain_high=0.1046,
        nll_a=0.7730,
        nll_b=0.7012,
        nll_gain=0.0718,
        nll_gain_low=0.0301,
        nll_gain_high=0.1190,
        verdict="B more accurate and better calibrated",
    )
    print_comparison(
        SimpleNamespace(
            confidence=0.95,
            a="runs/fly/1/export",
            b="models:/fly@champion",
            rows=60,
            data="data/fly",
            records=60,
            questions=[question],
            served_as=("fly-joint-1a2b3c4d", "fly/2"),
            automation=None,  # neither model certified
        )
    )
    printed = capsys.readouterr().out
    joined = " ".join(printed.split())
    assert (
        "…" not in printed
        and "+0.0586 [+0.0123, +0.1046]" in joined
        and "+0.0718 [+0.0301, +0.1190]" in joined
    )
    assert ("accuracy 0.6234 -> 0.6820" in joined) == (columns == "80")  # narrow: a line per question
    assert "A = runs/fly/1/export, B = models:/fly@champion (fly/2)" in joined  # the version the alias names


def test_the_flywheel_automation_without_a_server_is_one_line_and_exit_2(monkeypatch, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.flywheel_automations as module

    with temporary_settings(updates={PREFECT_API_URL: None}):  # a temporary server would end with the process
        assert module.main(["--run-config", "tiny"]) == 2
    [said] = capsys.readouterr().err.strip().splitlines()
    assert said.startswith(
        "flywheel automation: an automation lives on a Prefect server, and PREFECT_API_URL names"
    )
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # nothing listens on port 9
        assert module.main(["--run-config", "tiny"]) == 2
    [said] = capsys.readouterr().err.strip().splitlines()
    assert said.startswith(
        "flywheel automation: the Prefect server at http://127.0.0.1:9/api does not answer"
    )


def test_decision_retrain_passes_only_new_data_to_the_flow(monkeypatch):
    skip_input_checks(monkeypatch)
    launched = record_launches(monkeypatch)
    assert main(["retrain", "--run-config", "tiny", "--only-new-data"]) == 0 and main(["retrain"]) == 0
    assert [launch.parameters["only_new_data"] for launch in launched] == [True, False]


def _commands(parser, path=()):
    """Every (command path, parser) under `parser`, feedback's `import` included."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield (*path, name), command
                yield from _commands(command, (*path, name))


def test_every_option_of_every_command_says_what_it_does_and_its_default():
    # Options had no help at all (--json on five commands, promote's version, --params on five) or left their
    # default unsaid (serve's --max-wait-ms, --poll-seconds, --max-body-mb; smoke's --timeout).
    from pipeline.cli.main import build_parser

    unsaid, undefaulted = [], []
    for path, command in _commands(build_parser()):
        text = command.format_help()
        for action in command._actions:
            name = " ".join(path) + " " + (action.option_strings or [action.dest])[-1]
            if not action.help:
                unsaid.append(name)
            elif (
                action.option_strings
                and action.default not in (None, False, "==SUPPRESS==")
                and (f"{action.default}" not in text)
            ):
                undefaulted.append(name)
    assert unsaid == [] and undefaulted == []


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_device_auto_picks_the_cpu_here_for_scoring_commands_too(
    command, tiny_base, synthetic_train_file, tmp_path
):
    # `--device auto` passed the flag's check, then torch refused the name with a traceback.
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(synthetic_train_file.read_text().splitlines(keepends=True)[:10]))
    args = ["--model", str(tiny_base), "--data", str(rows), "--device", "auto", "-q"]
    out = ["--out", str(tmp_path / "scores.parquet")] if command == "predict" else ["--json"]
    assert main([command, *args, *out]) == 0


@pytest.mark.parametrize("command", ["train", "finetune"])
@pytest.mark.parametrize("out", [".", "export"])
def test_an_out_that_is_or_holds_the_base_is_refused_before_anything_runs(command, out, tmp_path, capsys):
    # finetune --out BASE replaced the pinned base with the export, and the next run refused its pin.
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "bert"}')
    target = (base / out).resolve()
    assert (
        main([command, "--data", str(tmp_path / "rows.jsonl"), "--base", str(base), "--out", str(target)])
        == 2
    )
    err = capsys.readouterr().err
    assert f"--out {target}: " in err and f"--base {base}, which writing the model would replace" in err
    assert sorted(p.name for p in base.iterdir()) == ["config.json"]


def test_repeat_best_is_zero_or_a_number_of_seeds(capsys):
    # -1 ran and overwrote the version's noise floor with "0 seeds: nan".
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--space", "sweeps/vader.yaml", "--repeat-best", "-1"])
    assert exit_.value.code == 2 and "0 (off) or a whole number of seeds" in capsys.readouterr().err


def test_export_never_writes_over_the_base_or_the_fine_tune_it_exports(tiny_base, tmp_path, capsys):
    # export --out BASE replaced the pinned base with the merged export, and --out ADAPTER deleted the
    # fine-tune.
    finetune, base = tmp_path / "finetune", Path(shutil.copytree(tiny_base, tmp_path / "base"))
    shutil.copytree(tiny_base, finetune)  # a Laya-layout model this project did not export (no manifest)
    before = {folder: sorted(p.name for p in folder.rglob("*")) for folder in (base, finetune)}
    for out in (base, finetune):
        assert main(["export", "--adapter", str(finetune), "--out", str(out)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"{out}: holds a base or a fine-tune, not an export" in line, line
    assert {folder: sorted(p.name for p in folder.rglob("*")) for folder in (base, finetune)} == before
    assert main(["export", "--adapter", str(finetune), "--out", str(tmp_path / "export")]) == 0
    assert (
        main(["export", "--adapter", str(finetune), "--out", str(tmp_path / "export")]) == 0
    )  # an export: again
    assert main(["export", "--adapter", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.parametrize(
    ("run_dir", "said"),
    [
        ("export", "inside --out, which the export replaces whole"),
        ("export/run", "inside --out"),
        ("/proc/run", "no folder can be made in /proc"),
    ],
)
def test_finetune_refuses_a_run_folder_the_export_would_replace_or_no_place_holds(
    run_dir, said, tmp_path, capsys
):
    # --run-dir == --out: the export's swap removed the calibration report and plots the summary pointed at.
    target = tmp_path / run_dir if not run_dir.startswith("/") else Path(run_dir)
    args = [
        "--data",
        str(tmp_path / "rows.jsonl"),
        "--base",
        str(tmp_path / "base"),
        "--out",
        str(tmp_path / "export"),
    ]
    assert main(["finetune", *args, "--run-dir", str(target)]) == 2
    assert f"--run-dir {target}: {said}" in capsys.readouterr().err
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--plots", "a-file", "a file; the plots go into a folder"),
        ("--plots", "/proc/plots", "no folder can be made"),
        ("--conformal", "0", "expected a miscoverage between 0 and 1"),
        ("--conformal", "nan", "expected a miscoverage"),
    ],
)
def test_evaluate_refuses_a_plots_place_or_a_miscoverage_before_scoring(flag, value, said, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    where = str(tmp_path / value) if value == "a-file" else value
    with pytest.raises(SystemExit) as refused:
        main(["evaluate", "--model", "m", "--data", "d", flag, where])
    assert refused.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("model", ["models:/decision-model/abc", "models:/", "nope", "a-file"])
def test_a_model_that_is_not_there_is_exit_2_for_evaluate_as_for_predict(
    model, synthetic_train_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(synthetic_train_file.read_text().splitlines(keepends=True)[:5]))
    assert main(["evaluate", "--model", model, "--data", str(rows)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"decision evaluate: {model}: "), line


def test_the_inference_log_must_be_a_folder_the_server_can_write_before_a_model_loads(tmp_path, capsys):
    # A read-only place served requests and dropped every decision at each flush: feedback and harvest got
    # none.
    (tmp_path / "a-file").write_text("")
    for where, said in (
        (tmp_path / "a-file", "a file; the inference log is a folder"),
        (Path("/proc/inference"), "no folder can be made in /proc"),
    ):
        assert main(["serve", "--model", str(tmp_path), "--inference-log", str(where)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"--inference-log {where}: {said}" in line, line


@pytest.mark.parametrize(
    ("write", "said"),
    [
        ("/proc/x/rows.jsonl", "no folder can be made in /proc"),
        ("a-file/rows.jsonl", "is a file"),
        (".", "a folder; give the file to write"),
    ],
)
def test_map_refuses_a_write_place_that_takes_no_file_before_reading_rows(write, said, tmp_path, capsys):
    table = tmp_path / "table.csv"
    table.write_text("text,label\nhello,pos\nbad day,neg\n")
    (tmp_path / "a-file").write_text("")
    target = write if write.startswith("/") else str(tmp_path / write)
    args = [
        "map",
        "--data",
        str(table),
        "--state-column",
        "text",
        "--label-column",
        "label",
        "--write",
        target,
    ]
    assert main(args) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert said in line, line


def test_a_monitor_window_past_the_calendar_is_refused_as_a_flag_and_as_a_setting(capsys):
    # --window-hours 1e30 passed the flag's check and overflowed timedelta in the flow.
    from pipeline.config import ConfigError, MonitorConfig

    with pytest.raises(SystemExit) as refused:
        main(["monitor", "--window-hours", "1e30"])
    assert (
        refused.value.code == 2
        and "expected a positive number of hours up to 876,000" in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match=r"monitor\.window_hours: must be > 0 and at most 876,000"):
        MonitorConfig(window_hours=1e30)
    assert MonitorConfig(window_hours=876_000).window_hours == 876_000


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_eval_data_that_is_the_training_data_is_refused(
    command, synthetic_train_file, tiny_base, tmp_path, capsys
):
    # It trained and reported "held-out" figures measured on its own training rows.
    same = ["--data", str(synthetic_train_file), "--eval-data", str(synthetic_train_file)]
    assert main(["finetune", *same, "--base", str(tiny_base), "--out", str(tmp_path / "out")]) == 2
    assert "the training data itself" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.run").exists()


@pytest.mark.parametrize("model", ["a/b/c", "tickets/x", "/3"])
def test_review_takes_a_name_or_name_and_version_number(model, capsys):
    # `a/b/c` was accepted and matched nothing.
    with pytest.raises(SystemExit) as refused:
        main(["review", "--model", model])
    assert (
        refused.value.code == 2 and "give NAME or NAME/VERSION (a version number)" in capsys.readouterr().err
    )
