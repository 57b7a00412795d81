"""`decision snapshot --from`: make any base a pinned input. A local folder (or a Hugging Face Hub id,
downloaded once where the Hub is reachable) is copied beside `--out`, checked to load as some family's base,
swapped in with one rename, and pinned with `dvc add` when `--out` lies inside a DVC repository (a dvc.yaml
stage's output is pinned by `dvc repro` instead). Nothing is fetched from the Hub at training time: training
reads the pinned copy.

    decision snapshot --from ~/models/deberta-v3-small --out data/snapshots/deberta-v3-small
    decision snapshot --from answerdotai/ModernBERT-base --out data/snapshots/modernbert     # where online
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.data.pins import dvc_root, pin_command, producing_stage
from pipeline.data.sources import env_flag_set
from pipeline.families import loading, pick_family
from pipeline.families.base import BadBase, ModelLayoutError
from pipeline.families.base_folders import looks_like_hub_id, weights_problem
from pipeline.families.exporting import fsync_tree, write_staged
from pipeline.masking import error_reason

# What a Hub download takes: configs, safetensors weights and tokenizer files (no pickled .bin weights, no
# ONNX, TensorFlow or Flax copies).
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model"]
SNAPSHOT_COMMANDS = (
    "decision snapshot",
    "pipeline.cli snapshot",
)  # a dvc.yaml stage that snapshots a base itself


class PinFailed(RuntimeError):
    """`dvc add` refused the snapshot (its output names the reason)."""


@dataclass(frozen=True)
class PinnedBase:
    """Where the base went, what it is, and its DVC pin."""

    source: str
    out: str
    family: str
    base: str
    """What the family makes of it, in words (`DecisionFamily.describe_base`)."""
    md5: str | None
    """DVC's md5 of the folder (its `.dir` hash); None where nothing pins it."""
    pinned_by: str | None
    """The `.dvc` file that pins it, `dvc repro STAGE` for a stage output, or None outside a DVC
    repository."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def snapshot_base(source: str, out: str | Path) -> PinnedBase:
    """Copy (or download) `source` to `out` whole, once it loads as a base, and pin it; BadBase, naming
    `source` and what to do, when it is no base or a Hub id cannot be fetched, PinFailed when `dvc add`
    refuses the copy; on either, `out` is left as it was."""
    out = Path(out)
    folder = Path(source).expanduser()
    if folder.exists():
        pick_family(folder)  # a folder no family starts from is refused before anything is copied
        if (damaged := weights_problem(folder)) is not None:  # so is a truncated weight file
            raise BadBase(damaged)
        inside = out.resolve().is_relative_to(folder.resolve()) and out.resolve() != folder.resolve()
        if inside:  # each run would copy the last copy too, one level deeper
            raise BadBase(
                f"{out}: inside {source}, which would then hold its own copy; snapshot to a folder "
                "outside it, e.g. data/snapshots/NAME"
            )
    elif not looks_like_hub_id(source):
        raise BadBase(f"{source}: no such folder, nor a Hugging Face Hub id (org/name)")
    elif _hub_offline():
        raise BadBase(
            f"{source}: a Hugging Face Hub id, and the Hub is offline here (HF_HUB_OFFLINE); run this "
            f"where it is reachable, or download it there (`hf download {source} --local-dir DIR`) and "
            "`decision snapshot --from DIR` here"
        )
    if (rebuilt := _rebuilt_by_a_stage(out)) is not None:
        raise BadBase(rebuilt)
    # A copy `dvc add` refused is taken back out (the folder is as it was): nothing unpinned is left to train
    # on.
    md5, pinned_by = write_staged(out, lambda staging: _fill(source, folder, staging), settle=pin_folder)
    family = pick_family(out)
    return PinnedBase(source, str(out), family.name, family.describe_base(out), md5, pinned_by)


def _rebuilt_by_a_stage(out: Path) -> str | None:
    """Why `out` must not take a snapshot: dvc.yaml makes it the output of a stage that builds it some other
    way (the stock MiniLM's), so `dvc repro` (and `make run`) would replace the copy; None otherwise. A stage
    that runs `decision snapshot` itself is the way to pin a snapshot by `dvc repro`."""
    root = dvc_root(out)
    if root is None:
        return None
    stage = producing_stage(out.resolve().relative_to(root).as_posix(), root)
    if stage is None or any(command in stage[1] for command in SNAPSHOT_COMMANDS):
        return None
    return (
        f"{out}: the output of dvc.yaml's stage {stage[0]} (`{stage[1]}`), which `dvc repro` and `make run` "
        f"rebuild from their own source, replacing this copy; snapshot into another folder, e.g. "
        f"{out.parent / (out.name + '-mine')}"
    )


def _fill(source: str, folder: Path, staging: Path) -> None:
    if folder.exists():
        # Hidden entries (.git, a download's .cache) are no part of the model; links are copied as the files.
        shutil.copytree(folder, staging, ignore=shutil.ignore_patterns(".*"), dirs_exist_ok=True)
    else:
        _download_from_hub(source, staging)
    try:
        family = pick_family(staging)
        with loading(source, BadBase, "a base"):
            family.load(
                staging
            )  # weights and tokenizer read whole: a truncated file fails here, not in training
    except ModelLayoutError as error:  # named by the source, not by the staging copy a loader's words name
        raise BadBase(str(error).replace(str(staging), str(source))) from error
    fsync_tree(staging)


def _hub_offline() -> bool:
    """Whether the Hub is off for this process (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, read now)."""
    from huggingface_hub import constants

    return constants.is_offline_mode() or env_flag_set("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _download_from_hub(hub_id: str, folder: Path) -> None:
    """The Hub repository's model files into `folder`; BadBase saying what to do where the Hub cannot be
    reached."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(hub_id, local_dir=str(folder), allow_patterns=HUB_FILES)
    except (OSError, ValueError) as error:  # unreachable, unknown, gated: huggingface_hub raises OSErrors
        raise BadBase(
            f"{hub_id}: cannot download it from the Hugging Face Hub ({error_reason(error)}); "
            "check the id and the connection, or snapshot a local folder"
        ) from error
    # The download's own bookkeeping (.cache/huggingface) is no part of the model.
    shutil.rmtree(folder / ".cache", ignore_errors=True)


def pin_folder(out: Path) -> tuple[str | None, str | None]:
    """(md5, what pins it) for `out`: `dvc add` inside a DVC repository, unless dvc.yaml makes it a stage
    output (then `dvc repro` pins it); (None, None) outside any repository."""
    root = dvc_root(out)
    if root is None:
        return None, None
    rel = out.resolve().relative_to(root).as_posix()
    command = pin_command(rel, root)
    if command.startswith("dvc repro"):
        return None, command
    pin = root / f"{rel}.dvc"
    before = pin.read_bytes() if pin.is_file() else None
    try:
        run_dvc(["add", rel], root)
    except BaseException:  # a refusal or Ctrl-C: the folder goes back (write_staged), and so does its pin
        if before is None:
            pin.unlink(missing_ok=True)
        else:
            pin.write_bytes(before)
        raise
    return yaml.safe_load(pin.read_text())["outs"][0]["md5"], pin.relative_to(root).as_posix()


def run_dvc(arguments: list[str], root: Path) -> None:
    """`dvc ARGUMENTS` in the repository `root`; PinFailed quoting dvc's own error line when it fails. The
    stages `dvc repro` runs call `python`: this interpreter's, as under `make`, whatever PATH the caller
    has."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    # Not -q: it silences dvc's ERROR line too, and that line is what the user needs to read.
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *arguments],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PATH": path},
    )
    if done.returncode != 0:
        said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        # DVC's ERROR line says why; the lines after it are hints (a command to run), not the reason.
        reason = next((line for line in said if line.startswith("ERROR")), said[-1] if said else None)
        raise PinFailed(
            f"dvc {' '.join(arguments)} (in {root}) failed: {reason or f'exit {done.returncode}'}"
        )
