"""The pin check refuses bytes that differ from their DVC pin, naming the file and both hashes; hashes are
DVC's own (checked against what real `dvc repro` and `dvc add` write); the strict check refuses what nothing
pins."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from pipeline.data.pins import PinMismatch, Unpinned, check_pins, current_md5


def strictly_checked(paths: list[str], root) -> dict[str, str]:
    """The strict check of paths relative to `root`, as the retrain flow makes it: {path: md5}."""
    return check_pins({path: root / path for path in paths}, root / "dvc.lock", require=True).pins


@pytest.fixture
def pinned_copy(tmp_path):
    data = tmp_path / "data" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text('{"state": "s"}\n')
    folder = tmp_path / "data" / "model"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    lock = {
        "schema": "2.0",
        "stages": {
            "s": {
                "outs": [
                    {"path": "data/rows.jsonl", "md5": current_md5(data)},
                    {"path": "data/model", "md5": current_md5(folder)},
                ]
            }
        },
    }
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    return tmp_path


def test_untouched_files_pass(pinned_copy):
    assert set(strictly_checked(["data/rows.jsonl", "data/model"], root=pinned_copy)) == {
        "data/rows.jsonl",
        "data/model",
    }


def test_tampered_file_is_refused_with_both_hashes(pinned_copy):
    pinned = current_md5(pinned_copy / "data/rows.jsonl")
    (pinned_copy / "data/rows.jsonl").write_text('{"state": "tampered"}\n')
    with pytest.raises(PinMismatch) as error:
        strictly_checked(["data/rows.jsonl"], root=pinned_copy)
    message = str(error.value)
    assert "data/rows.jsonl" in message and pinned in message
    assert current_md5(pinned_copy / "data/rows.jsonl") in message


def test_tampered_folder_missing_and_unpinned_files_are_all_reported(pinned_copy):
    (pinned_copy / "data/model/extra.bin").write_bytes(b"x")
    (pinned_copy / "data/rows.jsonl").unlink()
    with pytest.raises(PinMismatch) as error:
        strictly_checked(["data/rows.jsonl", "data/model"], root=pinned_copy)
    message = str(error.value)
    assert "data/rows.jsonl: missing" in message
    assert "data/model: bytes differ" in message
    with pytest.raises(Unpinned, match=r"data/other\.csv: not pinned"):  # before anything is hashed
        strictly_checked(["data/rows.jsonl", "data/model", "data/other.csv"], root=pinned_copy)


@pytest.mark.data
def test_project_dataset_matches_its_pin_and_a_tampered_copy_does_not(project_root, tmp_path):
    assert strictly_checked(["data/processed/vader.jsonl"], root=project_root)
    (tmp_path / "data/processed").mkdir(parents=True)
    shutil.copy(project_root / "dvc.lock", tmp_path / "dvc.lock")
    copy = tmp_path / "data/processed/vader.jsonl"
    shutil.copy(project_root / "data/processed/vader.jsonl", copy)
    with copy.open("ab") as handle:
        handle.write(b"\n")
    with pytest.raises(PinMismatch, match=r"vader\.jsonl: bytes differ"):
        strictly_checked(["data/processed/vader.jsonl"], root=tmp_path)


def test_training_refuses_a_tampered_pinned_input_before_it_starts(pinned_copy, monkeypatch):
    from pipeline.config import TrainConfig
    from pipeline.data.split import TrainSource
    from pipeline.stages.train import train_on_data

    monkeypatch.chdir(pinned_copy)
    (pinned_copy / "data/rows.jsonl").write_text('{"state": "changed"}\n')
    with pytest.raises(PinMismatch, match=r"data/rows\.jsonl: bytes differ"):
        train_on_data(TrainSource("data/rows.jsonl"), "data/model", None, TrainConfig())


BUILD = """import pathlib
weights = pathlib.Path("out/model/sub")
weights.mkdir(parents=True)
(weights / "w.bin").write_bytes(bytes(range(256)) * 9)
(weights.parent / "a.json").write_text("{}")
pathlib.Path("out/rows.jsonl").write_text('{"state": "s"}\\n')
"""


def _dvc(repo, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"dvc {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory):
    """A repository pinned by real DVC: a stage writing a file and a nested folder (`dvc repro`), and a file
    of the user's own (`dvc add`)."""
    repo = tmp_path_factory.mktemp("dvc-repo")
    _dvc(repo, "init", "--no-scm", "-q")
    (repo / "build.py").write_text(BUILD)
    stage = {
        "cmd": f"{sys.executable} build.py",
        "deps": ["build.py"],
        "outs": ["out/model", "out/rows.jsonl"],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"build": stage}}))
    _dvc(repo, "repro", "-q")
    (repo / "own.csv").write_text("a,b\n1,2\n")
    _dvc(repo, "add", "-q", "own.csv")
    return repo


def test_hashes_are_the_ones_real_dvc_records_for_files_and_folders(dvc_repo):
    lock = yaml.safe_load((dvc_repo / "dvc.lock").read_text())
    recorded = {out["path"]: out["md5"] for out in lock["stages"]["build"]["outs"]}
    assert recorded["out/model"].endswith(".dir")
    assert {path: current_md5(dvc_repo / path) for path in recorded} == recorded
    added = yaml.safe_load((dvc_repo / "own.csv.dvc").read_text())["outs"][0]["md5"]
    assert current_md5(dvc_repo / "own.csv") == added
    paths = ["out/model", "out/rows.jsonl", "own.csv"]
    assert strictly_checked(paths, root=dvc_repo) == {**recorded, "own.csv": added}
    assert check_pins({p: dvc_repo / p for p in paths}, dvc_repo / "dvc.lock", require=True).pins


def test_a_folder_changed_under_a_real_dvc_pin_is_refused_as_dvc_status_sees_it(dvc_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(dvc_repo, repo)
    (repo / "out/model/sub/w.bin").write_bytes(b"retrained")
    assert "modified" in json.dumps(json.loads(_dvc(repo, "status", "--json")))  # DVC agrees it changed
    with pytest.raises(
        PinMismatch,
        match=r"out/model: bytes differ from dvc\.lock .*`dvc repro` brings back .*`dvc commit` pins",
    ):
        check_pins({"base": repo / "out/model", "data": repo / "own.csv"}, repo / "dvc.lock")
    # A `dvc add`ed file comes back from the cache, not from a stage (`dvc repro` was the advice).
    (repo / "own.csv").write_text("edited\n")
    with pytest.raises(
        PinMismatch, match=r"own.csv: .*`dvc checkout --force own.csv` brings back .*`dvc add own.csv` pins"
    ):
        check_pins({"data": repo / "own.csv"}, repo / "dvc.lock")


def test_the_strict_check_refuses_unpinned_inputs_naming_each_path_and_the_command_that_pins_it(dvc_repo):
    stray = dvc_repo / "stray.jsonl"
    stray.write_text("{}\n")
    lock = dvc_repo / "dvc.lock"
    with pytest.raises(Unpinned) as error:
        check_pins({"data": dvc_repo / "out/rows.jsonl", "eval_data": stray}, lock, require=True)
    message = str(error.value)
    assert f"{stray}: not pinned; pin it with `dvc add stray.jsonl`" in message
    assert "out/rows.jsonl" not in message and "--allow-unpinned" in message
    # The ad-hoc check lets the user's own file through, and says which input was pinned.
    assert check_pins({"data": dvc_repo / "out/rows.jsonl", "eval_data": stray}, lock).pins == {
        "out/rows.jsonl": current_md5(stray.parent / "out/rows.jsonl")
    }
    checked = check_pins({"data": stray, "base": dvc_repo / "out/model"}, lock)
    assert checked.inputs == {
        "data": {"path": str(stray), "pinned": False},
        "base": {"path": str(dvc_repo / "out/model"), "pinned": True},
    }
    assert checked.unpinned == [str(stray)]
    assert checked.tags() == {"data_pinned": "false", "base_pinned": "true"}


def test_without_dvc_lock_the_strict_check_names_the_lock_and_a_stage_output_gets_dvc_repro(
    dvc_repo, tmp_path
):
    repo = tmp_path / "repo"
    shutil.copytree(dvc_repo, repo)
    (repo / "dvc.lock").unlink()
    with pytest.raises(Unpinned) as error:
        check_pins(
            {"data": repo / "out/rows.jsonl", "base": repo / "own.csv"}, repo / "dvc.lock", require=True
        )
    message = str(error.value)
    assert "dvc.lock is missing" in message
    assert f"{repo / 'out/rows.jsonl'}: not pinned; pin it with `dvc repro build`" in message
    assert "own.csv" not in message  # still pinned by own.csv.dvc
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("{}\n")
    with pytest.raises(Unpinned, match=r"elsewhere\.jsonl: outside .*, where DVC cannot pin it"):
        check_pins({"data": elsewhere}, repo / "dvc.lock", require=True)
