"""`decision snapshot --from`: any base becomes a pinned input. A folder that loads as some family's base is
copied whole into `--out` and pinned by real DVC (`dvc add`) inside a DVC repository; a folder that is no
base, one that does not load, or a Hub id while offline is refused in one line, exit code 2, and `--out` is
left as it was."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.main import main
from pipeline.data.pins import check_pins, current_md5
from pipeline.families import pick_family
from tests.tiny import write_tiny_encoder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path):
    """An empty DVC repository (no git)."""
    folder = tmp_path / "repo"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "init", "--no-scm", "-q"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return write_tiny_encoder(tmp_path_factory.mktemp("source") / "modernbert", "modernbert")


def snapshot(capsys, source, out, *flags) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["snapshot", "--from", str(source), "--out", str(out), *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def files(folder) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("kind", ["encoder", "laya"])
def test_a_base_is_copied_whole_and_pinned_by_dvc(kind, encoder, tiny_base, repo, capsys):
    source = encoder if kind == "encoder" else tiny_base
    out = repo / "data" / "snapshots" / "mine"
    code, printed, err = snapshot(capsys, source, out, "--json")
    assert code == 0, err
    pinned = json.loads(printed)
    assert files(out) == files(source)
    assert pinned["family"] == pick_family(source).name == ("joint" if kind == "encoder" else "laya")
    recorded = yaml.safe_load((repo / "data" / "snapshots" / "mine.dvc").read_text())["outs"][0]["md5"]
    assert pinned["md5"] == recorded == current_md5(out) and pinned["pinned_by"] == "data/snapshots/mine.dvc"
    # What `decision finetune --base` checks: the base is pinned, and matches its pin.
    assert check_pins({"base": out}, repo / "dvc.lock").pins == {"data/snapshots/mine": recorded}


def test_a_stage_output_is_left_to_dvc_repro(encoder, repo, capsys):
    stage = {
        "cmd": f"decision snapshot --from {encoder} --out data/snapshots/staged",
        "outs": ["data/snapshots/staged"],
    }
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"staged": stage}}))
    code, printed, _ = snapshot(capsys, encoder, repo / "data" / "snapshots" / "staged")
    assert code == 0 and "`dvc repro staged` pins it" in printed
    assert not (repo / "data" / "snapshots" / "staged.dvc").exists()


def test_the_output_of_a_stage_that_builds_it_otherwise_is_refused(encoder, repo, capsys):
    # `--out data/snapshots/minilm` replaced the stock base and said `dvc repro snapshot` pinned it: the stage
    # rebuilt MiniLM from its package, replacing the user's model.
    stage = {"cmd": "python -m build_the_stock_base", "outs": ["data/snapshots/stock"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"stock": stage}}))
    code, _, err = snapshot(capsys, encoder, repo / "data" / "snapshots" / "stock")
    assert code == 2 and "the output of dvc.yaml's stage stock (`python -m build_the_stock_base`)" in err
    assert "snapshot into another folder" in err and not (repo / "data" / "snapshots").exists()


def test_outside_a_dvc_repository_it_is_copied_and_said_unpinned(encoder, tmp_path, capsys):
    code, printed, _ = snapshot(capsys, encoder, tmp_path / "mine")
    assert code == 0 and files(tmp_path / "mine") == files(encoder)
    assert printed.splitlines() == [
        f"{tmp_path / 'mine'}: joint family, a plain encoder folder (ModernBertModel): the joint head on its "
        "last hidden states, each question apart",
        "outside a DVC repository: not pinned",
    ]


def truncated_weights(folder) -> str:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors: unreadable weights (SafetensorError"


def a_layer_missing(folder) -> str:
    # transformers filled the missing tensors at random, warned, and the snapshot was taken (exit 0).
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    kept = {k: v for k, v in load_file(str(weights)).items() if "layer.1." not in k}
    save_file(kept, str(weights), metadata={"format": "pt"})
    return "its weights lack 16 of the model's tensors (encoder.layer.1."


def no_config(folder) -> str:
    (folder / "config.json").unlink()
    return "not a model folder: no config.json"


@pytest.mark.parametrize("damage", [truncated_weights, a_layer_missing, no_config])
def test_a_folder_that_is_no_base_is_refused_and_out_is_left_as_it_was(damage, repo, capsys):
    source = write_tiny_encoder(repo.parent / "source", "bert")
    said = damage(source)
    out = repo / "data" / "snapshots" / "mine"
    out.mkdir(parents=True)
    (out / "config.json").write_text(
        '{"model_type": "bert"}'
    )  # the snapshot before (a model folder: replaceable)
    code, _, err = snapshot(capsys, source, out)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"decision snapshot: {source}") and said in line, line
    assert files(out) == {"config.json": b'{"model_type": "bert"}'}
    assert sorted(p.name for p in out.parent.iterdir()) == ["mine"]  # no staging folder left beside it
    assert not (out.parent / "mine.dvc").exists()


def test_a_laya_layout_base_with_truncated_weights_is_refused_in_one_line(tiny_base, repo, tmp_path, capsys):
    # It gave the loader's traceback (exit 1) after copying the whole folder.
    source = Path(shutil.copytree(tiny_base, tmp_path / "laya"))
    said = truncated_weights(source)
    out = repo / "data" / "snapshots" / "mine"
    code, _, err = snapshot(capsys, source, out)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"decision snapshot: {source}/") and said in line, line
    assert not out.exists() and not (out.parent / "mine.dvc").exists()


def test_a_hub_id_while_offline_is_refused_saying_what_to_do(repo, capsys, monkeypatch):
    monkeypatch.chdir(repo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = snapshot(capsys, "answerdotai/ModernBERT-base", "data/snapshots/modernbert")
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(
        "decision snapshot: answerdotai/ModernBERT-base: a Hugging Face Hub id, and the Hub is offline here"
    )
    assert "hf download answerdotai/ModernBERT-base --local-dir DIR" in line
    assert not (repo / "data").exists()


@pytest.fixture
def git_repo(tmp_path):
    """A git + DVC repository whose .gitignore hides the `.dvc` pin files of data/snapshots: `dvc add`
    refuses."""
    folder = tmp_path / "gitrepo"
    folder.mkdir()
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    (folder / ".gitignore").write_text("/data/snapshots/*.dvc\n")
    return folder


@pytest.mark.parametrize("before", [None, {"config.json": b'{"model_type": "bert"}'}])
def test_a_copy_dvc_refuses_to_pin_is_taken_back_out(before, encoder, git_repo, capsys):
    out = git_repo / "data" / "snapshots" / "mine"
    if before is not None:
        out.mkdir(parents=True)
        (out / "config.json").write_bytes(before["config.json"])
    code, _, err = snapshot(capsys, encoder, out)
    assert code == 1  # the input was good; what failed is the pin
    [line] = err.strip().splitlines()
    assert line.startswith("decision snapshot: dvc add data/snapshots/mine") and "ignored" in line, line
    if before is None:
        assert not out.exists()
    else:
        assert files(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ([] if before is None else ["mine"])


def test_ctrl_c_while_dvc_pins_leaves_neither_the_copy_nor_a_pin(encoder, repo, capsys, monkeypatch):
    # Interrupted inside `dvc add`, the folder went back but the .dvc file dvc had written stayed, pinning a
    # folder that was gone, and the command ended in a traceback.
    from pipeline.stages import snapshot as stage

    def interrupted(arguments, root):
        (root / f"{arguments[-1]}.dvc").write_text("outs:\n- md5: 0123.dir\n  path: mine\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(stage, "run_dvc", interrupted)
    out = repo / "data" / "snapshots" / "mine"
    code, _, err = snapshot(capsys, encoder, out)
    assert code == 130 and "interrupted" in err
    assert not out.exists() and not (out.parent / "mine.dvc").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == []


def test_an_out_inside_the_source_is_refused(encoder, tmp_path, capsys):
    # Each run copied the copy before it: snap/snap/..., a new md5 every time.
    import shutil

    source = shutil.copytree(encoder, tmp_path / "source")
    code, _, err = snapshot(capsys, source, source / "snap")
    assert code == 2 and f"{source / 'snap'}: inside {source}" in err and not (source / "snap").exists()


def test_a_snapshot_in_the_project_s_layout_is_one_dvc_pushes(encoder, tmp_path, capsys):
    # With the whole of data/snapshots/ ignored but its .dvc files, DVC took the folder as ignored and never
    # read the .dvc files in it: `dvc push` left every snapshotted base out, and a teammate could not pull it.
    import shutil

    from dvc.repo import Repo

    folder = tmp_path / "project"
    folder.mkdir()
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    shutil.copy(ROOT / ".gitignore", folder / ".gitignore")
    code, _, err = snapshot(capsys, encoder, folder / "data" / "snapshots" / "mine")
    assert code == 0, err
    with Repo(str(folder)) as repo:
        read = {Path(stage.path).relative_to(folder).as_posix() for stage in repo.index.stages}
    assert read == {"data/snapshots/mine.dvc"}
    ignored = subprocess.run(
        ["git", "check-ignore", "data/snapshots/mine/config.json", "data/snapshots/mine.dvc"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == ["data/snapshots/mine/config.json"]  # the bytes DVC's, the pin git's
