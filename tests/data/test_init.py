"""`decision init` (what `make run DATA=...` calls): a user's data, inside the project or outside it (copied
in), and base become pinned inputs (real DVC) of a run config the retrain flow loads; a rerun on changed data
says it is a new revision; a bad name, missing data or a base that is no model is one line, exit code 2, and
no config is written."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.main import main
from pipeline.config import load_params
from pipeline.data.pins import check_pins, current_md5
from pipeline.data.split import TrainSource, read_ledger, split_holdout
from pipeline.stages.init import BadInit, run_name
from tests.tiny import write_tiny_encoder

ROOT = Path(__file__).resolve().parents[2]
ROW = {
    "state": "late again",
    "questions": {"late": {"type": "noul", "instructions": "It was late."}},
    "gold": {"late": True},
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A DVC project (no git) with this repository's params.yaml, as the working directory."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(ROOT / "params.yaml", folder / "params.yaml")
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "init", "--no-scm", "-q"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(folder)
    return folder


def write_rows(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(ROW | {"state": f"late {i}"}) + "\n" for i in range(n)))
    return path


def init(capsys, *flags) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    code = main(["init", *flags, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_data_outside_the_project_is_copied_in_pinned_and_named_in_a_run_config(project, tmp_path, capsys):
    source = write_rows(tmp_path / "exports" / "Tickets.jsonl", 5)
    code, result, err = init(capsys, "--data", str(source))
    assert code == 0, err
    assert (result["name"], result["data"], result["copied"]) == ("tickets", "data/own/tickets.jsonl", True)
    assert (project / "data/own/tickets.jsonl").read_bytes() == source.read_bytes()
    assert check_pins(
        {"data": project / "data/own/tickets.jsonl"}, project / "dvc.lock", require=True
    ).pins == {"data/own/tickets.jsonl": result["data_md5"]}
    retrain = load_params(project / "params.yaml", "tickets").retrain
    assert (retrain.data, retrain.base, retrain.runs_dir, retrain.model_name) == (
        "data/own/tickets.jsonl",
        "data/snapshots/minilm",
        "runs/tickets",
        "tickets",
    )
    assert result["previous_data_md5"] is None and not result["data_changed"]


def test_a_rerun_on_changed_shards_is_a_new_revision_and_keeps_added_keys(project, capsys):
    shards = project / "data" / "shards"
    write_rows(shards / "part-0.jsonl", 3)
    write_rows(shards / "part-1.jsonl", 3)
    code, first, err = init(capsys, "--data", "data/shards", "--name", "support")
    assert code == 0, err
    assert first["copied"] is False and first["data_md5"] == current_md5(shards)
    config = project / "configs" / "support.yaml"
    edited = yaml.safe_load(config.read_text()) | {"train": {"max_steps": 7}}
    config.write_text(yaml.safe_dump(edited))
    code, same, _ = init(capsys, "--data", "data/shards", "--name", "support")
    assert (same["data_md5"], same["data_changed"]) == (first["data_md5"], False)
    write_rows(shards / "part-1.jsonl", 4)  # one shard changed
    code, changed, _ = init(capsys, "--data", "data/shards", "--name", "support")
    assert (
        changed["data_changed"] and changed["previous_data_md5"] == first["data_md5"] != changed["data_md5"]
    )
    assert load_params(project / "params.yaml", "support").train.max_steps == 7


def test_a_base_outside_the_project_is_snapshotted_and_pinned(project, tmp_path, capsys):
    write_rows(project / "data" / "mine.jsonl", 3)
    base = write_tiny_encoder(tmp_path / "models" / "BertTiny", "bert")
    code, result, err = init(capsys, "--data", "data/mine.jsonl", "--base", str(base))
    assert code == 0, err
    assert result["base"] == "data/snapshots/berttiny"
    assert result["base_md5"] == current_md5(project / "data/snapshots/berttiny")
    assert load_params(project / "params.yaml", "mine").retrain.base == "data/snapshots/berttiny"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--data", "data/none.jsonl"], "data/none.jsonl"),
        (["--data", "data/empty"], "data/empty"),
        (["--data", "data/mine.jsonl", "--mapping", "none.yaml"], "none.yaml: no such file"),
        (["--data", "data/mine.jsonl", "--name", "Bad Name"], "run name 'Bad Name': use 1-63 of"),
        (["--data", "data/mine.jsonl", "--base", "data/mine.jsonl"], "data/mine.jsonl"),
        # sources that read, and hold nothing to train on: refused with the reasons, nothing pinned
        (["--data", "data/blank.jsonl"], "data/blank.jsonl: no rows"),
        (["--data", "data/blank.csv"], "data/blank.csv: cannot be read as CSV"),
        (
            ["--data", "data/unknown.jsonl"],
            "no usable decision (2 decisions; skipped: unknown_question_type 2)",
        ),
        (["--data", "data/table.csv"], "not a decision table"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_no_config(project, capsys, flags, said):
    write_rows(project / "data" / "mine.jsonl", 3)
    (project / "data" / "empty").mkdir()
    (project / "data" / "blank.jsonl").write_text("")
    (project / "data" / "blank.csv").write_text("")
    (project / "data" / "table.csv").write_text("text,tone\nfine,positive\n")
    unknown = {**ROW, "questions": {"late": {"type": "guess", "instructions": "?"}}}
    (project / "data" / "unknown.jsonl").write_text((json.dumps(unknown) + "\n") * 2)
    code, _, err = init(capsys, *flags)
    assert code == 2 and said in err and err.count("\n") == 1, err
    assert not (project / "configs").exists() and not list((project / "data").glob("*.dvc"))


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("retrain:\n  model_name: decision-model-tiny\n  slice: '0:400'\n", "did not write it"),
        ("- a\n- b\n", "expected sections of keys"),
        ("retrain: [\n", "mine.yaml: not YAML"),
        ("retrain:\n  model_name: mine\ntrain:\n  bogus_key: 1\n", "bogus_key"),
    ],
)
def test_a_run_config_init_cannot_update_is_refused_before_anything_is_pinned(
    project, tmp_path, capsys, config, said
):
    source = write_rows(tmp_path / "exports" / "mine.jsonl", 3)
    (project / "configs").mkdir()
    (project / "configs" / "mine.yaml").write_text(config)
    code, _, err = init(capsys, "--data", str(source))
    assert code == 2 and said in err and err.count("\n") == 1, err
    assert (project / "configs" / "mine.yaml").read_text() == config
    assert sorted(path.name for path in (project / "configs").iterdir()) == ["mine.yaml"]
    assert not (project / "data").exists()


def test_an_initd_data_set_that_grows_past_the_cap_keeps_its_held_out_rows_held_out(project, capsys):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["validate"] |= {"holdout_max_decisions": 4, "holdout_fraction": 0.5}  # the cap binds at once
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    write_rows(project / "data" / "tickets" / "part-0.jsonl", 20)
    code, result, err = init(capsys, "--data", "data/tickets")
    assert code == 0, err
    ledger = project / "data" / "tickets.holdout-ledger.txt"  # beside the pinned folder, never inside it
    held = read_ledger(ledger)
    assert (result["ledger"], result["heldout"], len(held)) == ("data/tickets.holdout-ledger.txt", 4, 4)
    grown = "".join(json.dumps(ROW | {"state": f"late {i}"}) + "\n" for i in range(20, 400))
    (project / "data" / "tickets" / "part-1.jsonl").write_text(grown)
    config = load_params(project / "params.yaml", "tickets").validate
    split = TrainSource("data/tickets", split_config=config).validated().split  # what the retrain flow splits
    assert held <= {r.content_hash() for r in split.heldout}
    # Without the ledger the new rows, hashing lower, would have pushed those rows into training.
    stateless = split_holdout(split.every_record(), config)
    assert held - {r.content_hash() for r in stateless.heldout}


def test_the_run_name_comes_from_the_data_unless_given():
    assert run_name("data/shards/", None) == "shards"
    assert run_name("~/exports/Q3.tickets.csv", None) == "q3"
    assert run_name("x.csv", "my-run_2") == "my-run_2"
    for bad in ("a/b", "", "x.", "Tickets"):
        with pytest.raises(BadInit, match="pass NAME="):
            run_name("x.csv", bad)


def test_run_trains_the_run_just_set_up_and_its_name_comes_from_the_data(
    project, tmp_path, capsys, monkeypatch
):
    import pipeline.cli.init as init_command

    launched = []
    monkeypatch.setattr(init_command, "retrain", lambda args, parameters: launched.append(parameters) or 0)
    source = write_rows(tmp_path / "exports" / "Tickets.v2.jsonl", 3)
    assert main(["init", "--data", str(source), "--run"]) == 0
    assert launched == [{"run_config": "tickets"}]
    assert "training it: decision retrain --run-config tickets" in capsys.readouterr().out
    assert main(["init", "--data", str(source), "--name", "", "--run"]) == 2 and len(launched) == 1


def test_the_stock_base_is_built_after_the_name_and_data_are_checked(project, tmp_path, capsys, monkeypatch):
    # A snapshot stage standing in for dvc.yaml's (which copies MiniLM): `python` must be this interpreter's,
    # whatever PATH the user has, as under `make run`.
    build = "import pathlib; p = pathlib.Path('data/snapshots/minilm'); p.mkdir(parents=True); (p / 'w').write_text('x')"
    (project / "dvc.yaml").write_text(
        yaml.safe_dump(
            {"stages": {"snapshot": {"cmd": f'python -c "{build}"', "outs": ["data/snapshots/minilm"]}}}
        )
    )
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    source = write_rows(tmp_path / "rows.jsonl", 3)
    code, _, err = init(capsys, "--data", str(source), "--name", "Bad Name")
    assert code == 2 and "run name 'Bad Name'" in err and not (project / "data/snapshots/minilm").exists()
    code, result, err = init(capsys, "--data", str(source))
    assert code == 0, err
    assert (project / "data/snapshots/minilm/w").read_text() == "x"
    assert result["base"] == "data/snapshots/minilm" and result["base_md5"].endswith(".dir")


def test_init_names_the_files_to_commit(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "repo"
    folder.mkdir()
    shutil.copy(ROOT / "params.yaml", folder / "params.yaml")
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=folder, check=True, capture_output=True, timeout=120)
    monkeypatch.chdir(folder)
    source = write_rows(tmp_path / "Tickets.jsonl", 3)
    code, result, err = init(capsys, "--data", str(source))
    assert code == 0, err
    assert set(result["to_commit"]) == {
        "configs/tickets.yaml",
        "data/own/tickets.jsonl.dvc",
        "data/own/.gitignore",
        "data/own/tickets.jsonl.holdout-ledger.txt",  # the rows held out, by content hash: never trained on
    }
    assert "data/own/tickets.jsonl" not in result["to_commit"]  # the bytes are DVC's


def test_a_glob_outside_the_project_copies_only_the_files_it_matches(project, tmp_path, capsys):
    exports = tmp_path / "exports"
    write_rows(exports / "part-0.jsonl", 3)
    write_rows(exports / "sub" / "part-1.jsonl", 2)
    (exports / "private").mkdir()
    (exports / "private" / "notes.txt").write_text("not data")
    (exports / "unrelated.bin").write_bytes(b"\0" * 100)
    code, result, err = init(capsys, "--data", f"{exports}/**/part-*.jsonl", "--name", "parts")
    assert code == 0 and result["copied"], err
    copied = sorted(
        p.relative_to(project / "data/own/parts").as_posix()
        for p in (project / "data/own/parts").rglob("*")
        if p.is_file()
    )
    assert copied == ["part-0.jsonl", "sub/part-1.jsonl"]  # nothing else there is pinned
    assert load_params(project / "params.yaml", "parts").retrain.data == "data/own/parts/**/part-*.jsonl"


def test_a_mapped_run_becomes_harvestable_as_the_harvest_refusal_says(project, tmp_path, capsys):
    # Harvest refuses a run that maps a table; re-init on the mapped rows kept the table's mapping, so the run
    # then read its decision rows as that table.
    from pipeline.stages.harvest import HarvestRefused, check_target

    table = tmp_path / "tickets.csv"
    table.write_text(
        "text,team\n" + "".join(f"parcel {i} lost,shipping\ncharged twice {i},billing\n" for i in range(5))
    )
    code, _, err = init(
        capsys, "--data", str(table), "--name", "tix", "--state-column", "text", "--label-column", "team"
    )
    assert code == 0, err
    params = load_params(project / "params.yaml", "tix")
    with pytest.raises(HarvestRefused) as refused:
        check_target(params.retrain.data, params.validate)
    assert "decision map --run-config NAME --write data/own/NAME-rows/part-0.parquet" in str(refused.value)
    rows = "data/own/tix-rows/part-0.parquet"
    assert (
        main(["map", "--run-config", "tix", "--write", rows, "--preview", "0"]) == 0
    )  # the run's data and mapping
    code, result, err = init(capsys, "--data", "data/own/tix-rows", "--name", "tix")
    assert code == 0 and result["mapping_dropped"], err
    params = load_params(project / "params.yaml", "tix")
    assert (params.retrain.data, params.validate.mapping) == ("data/own/tix-rows", None)
    check_target(params.retrain.data, params.validate)  # harvestable now
    code, again, _ = init(capsys, "--data", "data/own/tix-rows", "--name", "tix")
    assert code == 0 and not again["mapping_dropped"]
