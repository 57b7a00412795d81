"""A DVC remote with real DVC and git: push the pinned outputs from one clone, and a fresh clone with no built
data pulls them, so `dvc repro` skips the stage that would have built them (a local directory remote, as a
team's S3 bucket behaves). A tiny DVC project of its own in tmp_path, never the project's data; ~15 s.

    python -m pytest tests/data/test_remote.py -q
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.data.remote import RemoteError, default_remote, mask_url, pull_pinned, push_pinned

ROOT = Path(__file__).resolve().parents[2]
# A stage that costs something (here: it counts its runs in a file outside every clone) and a `cache: false`
# report beside it, as `dataset`/`snapshot` and `validate` are in the project's dvc.yaml.
BUILD = """import pathlib, sys
out = pathlib.Path("built"); out.mkdir(exist_ok=True)
for i in range(3):
    (out / f"part{i}.txt").write_text(f"part {i}\\n" * 100)
with open("../runs.log", "a") as log:
    log.write(sys.argv[1] + "\\n")
"""
PIPELINE = """stages:
  build:
    cmd: python build.py build
    deps: [build.py]
    outs: [built]
  report:
    cmd: python -c "import pathlib; pathlib.Path('report.json').write_text('{}')"
    deps: [built]
    metrics:
      - report.json:
          cache: false
"""
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _dvc(args: list[str], cwd: Path) -> str:
    return _run([sys.executable, "-m", "dvc", *args], cwd).stdout


def _pull(clone: Path) -> dict:
    """`python -m pipeline.data.remote pull`, the command `make run` starts with, in `clone`."""
    return json.loads(_run([sys.executable, "-m", "pipeline.data.remote", "pull"], clone).stdout)


def _runs(tmp_path: Path) -> list[str]:
    log = tmp_path / "runs.log"
    return log.read_text().split() if log.exists() else []


@pytest.fixture
def origin(tmp_path) -> Path:
    """A git+DVC project whose data is built and pinned in dvc.lock, with a default remote committed in
    `.dvc/config` (not yet pushed to)."""
    repo = tmp_path / "origin"
    repo.mkdir()
    _run(["git", "init", "-q"], repo)
    _dvc(["init", "-q"], repo)
    (repo / "build.py").write_text(BUILD)
    (repo / "dvc.yaml").write_text(PIPELINE)
    _dvc(["repro", "-q"], repo)
    _dvc(["remote", "add", "-d", "team", str(tmp_path / "remote")], repo)
    _run(["git", "add", "-A"], repo)
    _run([*GIT, "commit", "-qm", "pinned data, team remote"], repo)
    return repo


def _clone(origin: Path, name: str) -> Path:
    clone = origin.parent / name
    _run(["git", "clone", "-q", str(origin), str(clone)], origin.parent)
    assert not (clone / "built").exists()  # git carries the pins and the remote, never the data
    return clone


def test_a_fresh_clone_pulls_what_was_pushed_and_repro_does_not_rebuild_it(origin, tmp_path):
    pushed = push_pinned(origin)
    assert (pushed.remote, pushed.present, pushed.transferred) == ("team", ["built"], 4)  # 3 files + the .dir
    clone = _clone(origin, "clone")

    report = _pull(clone)

    assert (report["present"], report["missing"], report["transferred"]) == (["built"], [], 4)
    assert sorted(p.name for p in (clone / "built").iterdir()) == ["part0.txt", "part1.txt", "part2.txt"]
    assert (clone / "built/part2.txt").read_bytes() == (origin / "built/part2.txt").read_bytes()
    _dvc(["repro"], clone)  # the cached report stage reruns (cache: false), the build stage must not
    assert _runs(tmp_path) == ["build"], "dvc repro rebuilt an output the remote had"
    assert "up to date" in _dvc(["status"], clone)


def test_a_remote_without_the_data_leaves_it_to_repro(origin, tmp_path):
    clone = _clone(origin, "clone")  # nothing was pushed

    report = _pull(clone)

    assert (report["remote"], report["present"], report["missing"]) == ("team", [], ["built"])
    _dvc(["repro"], clone)
    assert _runs(tmp_path) == ["build", "build"]  # built here, as with no remote
    assert (clone / "built/part0.txt").is_file()


def test_without_a_default_remote_pull_does_nothing_and_push_refuses(origin):
    _dvc(["remote", "default", "--unset"], origin)
    assert default_remote(origin) is None

    report = pull_pinned(origin)

    assert report.remote is None and report.transferred == 0
    assert "dvc remote add -d" in report.message
    with pytest.raises(RemoteError, match="no default DVC remote"):
        push_pinned(origin)


def test_push_refuses_outputs_that_are_not_built(origin):
    clone = _clone(origin, "clone")
    with pytest.raises(
        RemoteError, match=r"not here, so not pushed: built; build what dvc.yaml builds with `dvc repro`"
    ):
        push_pinned(clone)


def test_an_added_input_in_a_subfolder_is_pushed_and_pulled(origin):
    # Its output path is relative to its .dvc file: looked up from the root, `own.jsonl` was "not built here"
    # and nothing was pushed at all.
    (origin / "data" / "own").mkdir(parents=True)
    (origin / "data/own/own.jsonl").write_text('{"state": "late"}\n')
    _dvc(["add", "-q", "data/own/own.jsonl"], origin)
    _run(["git", "add", "-A"], origin)
    _run([*GIT, "commit", "-qm", "own data"], origin)
    pushed = push_pinned(origin)
    assert pushed.present == ["built", "data/own/own.jsonl"]
    clone = _clone(origin, "clone")
    report = _pull(clone)
    assert (report["present"], report["missing"]) == (["built", "data/own/own.jsonl"], [])
    assert (clone / "data/own/own.jsonl").read_text() == '{"state": "late"}\n'


def test_a_remote_whose_plugin_is_missing_fails_naming_it_with_the_password_masked(origin):
    if importlib.util.find_spec("dvc_s3") is not None:
        pytest.skip("dvc-s3 is installed here: the plugin-missing error cannot happen")
    _dvc(["remote", "add", "--local", "-d", "bucket", "s3://KEY:s3cr3t@my-bucket/path"], origin)
    assert default_remote(origin) == ("bucket", "s3://KEY:***@my-bucket/path")

    with pytest.raises(RemoteError) as raised:
        pull_pinned(origin)

    message = str(raised.value)
    assert "remote 'bucket' (s3://KEY:***@my-bucket/path)" in message and "dvc-s3" in message
    assert "s3cr3t" not in message


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("s3://bucket/path", "s3://bucket/path"),
        ("/mnt/shared/dvc", "/mnt/shared/dvc"),
        ("https://user:pw@host.example:8443/dvc", "https://user:***@host.example:8443/dvc"),
    ],
)
def test_mask_url_hides_only_the_password(url, masked):
    assert mask_url(url) == masked


def test_make_run_pulls_before_it_reproduces(project_root):
    makefile = (project_root / "Makefile").read_text()
    recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("pipeline.data.remote pull") < recipe.index("dvc repro")
