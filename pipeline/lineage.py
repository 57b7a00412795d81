"""Lineage: what a run or an export came from (git commit, data and base hashes, params, code digest).

One place for the digests that name things: `idempotency_key` names a retraining run (its run folder, MLflow
run and model version); `source_digest` names a trained model, so exporting the same one twice is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.config import UNKEYED_SECTIONS, Params, TrainConfig
from pipeline.data.mapping import mapping_content
from pipeline.data.pins import current_md5, data_revision


def git_commit() -> str | None:
    """The checked-out commit, or None outside a git checkout."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def uncommitted(paths: list[str], root: str | Path = ".") -> list[str]:
    """Those of `paths` (files, relative to the repository root `root`) that git sees as new or changed; []
    outside a git checkout."""
    present = [path for path in paths if (Path(root) / path).is_file()]
    if not present:
        return []
    try:
        done = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "--", *present],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    listed = {line[3:] for line in done.stdout.splitlines()} if done.returncode == 0 else set()
    return [path for path in present if path in listed]  # porcelain paths are relative to the repository root


def code_digest(root: str | Path = ".") -> str:
    """sha256 over the library and flow sources, so a code change makes a new key even without a commit."""
    root = Path(root)
    digest = hashlib.sha256()
    for path in sorted([*root.glob("pipeline/**/*.py"), *root.glob("flows/**/*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class DataRevision:
    """Which revision of its data source a retrain used, and the one the model's previous version was trained
    on (`previous_version` None for a model's first version)."""

    source: str
    revision: str
    previous_version: str | None = None
    previous_revision: str | None = None
    rerun_of: str | None = None
    """The version a run of the same idempotency key registered already: this run is that one again."""
    changes: tuple[str, ...] = ()
    """What else differs from the previous version (`settings_changed`): why a run on the same data is new."""

    @property
    def changed(self) -> bool:
        """True when a previous version exists and was trained on other data (a changed, added or removed
        shard), and this run is no rerun of a version."""
        return (
            self.rerun_of is None
            and self.previous_revision is not None
            and self.previous_revision != self.revision
        )

    def line(self) -> str:
        """What the retrain says about its data, in one line."""
        if self.rerun_of is not None:
            since = f"a rerun of version {self.rerun_of}: the same data, base, params and code"
        elif self.previous_version is None:
            since = "the model's first version"
        elif self.changed:
            since = f"new: version {self.previous_version} was trained on {self.previous_revision[:12]}"
            since += f"; also changed: {'; '.join(self.changes)}" if self.changes else ""
        else:
            since = f"unchanged since version {self.previous_version}"
            since += f"; a new version for its {'; '.join(self.changes)}" if self.changes else ""
        return f"data: {self.source} at revision {self.revision[:12]} ({since})"

    def to_dict(self) -> dict[str, Any]:
        """The fields with `changed` and the `line`, as the retrain summary carries them."""
        return asdict(self) | {"changed": self.changed, "line": self.line()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DataRevision:
        """A revision as `to_dict` or `asdict` wrote it (JSON: the changes as a list)."""
        fields = {k: v for k, v in values.items() if k not in ("changed", "line")}
        return cls(**fields | {"changes": tuple(fields.get("changes", ()))})


SHOWN_PARAMS = 4  # settings named in a revision's line; the rest counted
# A version's tags that `settings_changed` compares.
TAGGED_SETTINGS = ("base_md5", "code_digest", "git_commit")


def settings_changed(before: dict[str, str], now: dict[str, str]) -> tuple[str, ...]:
    """What differs between two runs' settings (`before`: the previous version's, as MLflow keeps them, `now`:
    this run's, both flat `section.name` -> text; `base_md5`, `code_digest` and `git_commit` among them as
    tags): params as `name old -> new`, then the base and the code, in words for a run's first lines."""
    tagged = {"base_md5": "base", "code_digest": "code"}
    if "code_digest" not in before:  # a version from before the digest was tagged: its commit says as much
        tagged["git_commit"] = "git commit"
    # params.yaml's settings only (`section.name`): the MLflow model's config (`backend`, `precision`) is logged
    # as bare run params, and is no setting of the run.
    params = [
        name
        for name in sorted(before.keys() | now.keys())
        if "." in name and before.get(name) != now.get(name)
    ]
    shown = [
        f"{name} {before.get(name, '(unset)')} -> {now.get(name, '(unset)')}"
        for name in params[:SHOWN_PARAMS]
    ]
    more = f" and {len(params) - SHOWN_PARAMS} more" if len(params) > SHOWN_PARAMS else ""
    changes = [f"params ({', '.join(shown)}{more})"] if params else []
    for tag, what in tagged.items():
        if before.get(tag) and now.get(tag) and before[tag] != now[tag]:
            changes.append(f"{what} ({before[tag][:12]} -> {now[tag][:12]})")
    return tuple(changes)


def idempotency_key(
    data_md5: str, base_md5: str, params: dict[str, Any], code: str, unpinned: bool = False
) -> str:
    """The key of a retraining run: data, base snapshot, every params section and the code.

    A run with --allow-unpinned (`unpinned`) gets a key of its own: the same bytes pinned later make a new
    version the gate may promote, not the held one found again by key.
    """
    parts = {"data": data_md5, "base": base_md5, "params": params, "code": code}
    # Only when set, so the key of every pinned run stays what it was.
    text = json.dumps(parts | ({"unpinned": True} if unpinned else {}), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def keyed_sections(params: Params) -> dict[str, Any]:
    """Every params section as the idempotency key reads it (but `UNKEYED_SECTIONS`): a mapping file's path
    replaced by what the file says, so an edited mapping (new decision rows from the same table) makes a new
    run."""
    sections = {name: values for name, values in params.sections().items() if name not in UNKEYED_SECTIONS}
    if isinstance(params.validate.mapping, str):
        sections["validate"]["mapping"] = mapping_content(params.validate.mapping)
    return sections


def source_digest(data, base, config: TrainConfig, pins: dict[str, str], steps: int, losses) -> str:
    """What a trained model is: inputs, settings, pins, and the losses it logged on the way (JSON writes a
    tuple as a list, so losses read back from train.json give the same digest)."""
    parts = json.dumps([str(data), str(base), asdict(config), pins, steps, losses], default=str)
    return hashlib.sha256(parts.encode()).hexdigest()


MAPPING_OPTIONS = "mapping_options"
"""The manifest key of a model trained on a table read through a mapping: per question id, the options it was
trained with (label texts in the model's order), so unlabelled rows can be asked the same questions."""


def options_of(labels: dict[str, dict[str, int]] | None) -> dict[str, list[str]] | None:
    """Per question, the options a mapped table trained with (its validation report's label counts, in the
    model's order); None for decision rows."""
    return {qid: list(counts) for qid, counts in labels.items()} if labels else None


def export_manifest(
    data,
    base,
    config: TrainConfig,
    family: str,
    run: dict[str, Any],
    temperatures,
    heldout: dict[str, Any],
    options: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The `manifest.json` of an export: data and base hashes, git commit, params, metrics, digest, and with
    `options` (a mapped table's options per question) `mapping_options`.

    `run` holds the training run's `pins`, `inputs` (each with whether DVC pins it), `steps` and `losses` (a
    `TrainRun` as a dict, or `train.json`).
    """
    pins, steps, losses = run.get("pins", {}), run["steps"], run.get("losses", [])
    return {
        "data": str(data),
        "data_md5": data_revision(data),
        "base": str(base),
        "base_md5": current_md5(Path(base)),
        "pins": pins,
        "inputs": run.get("inputs", {}),
        "git_commit": git_commit(),
        "family": family,
        "params": {"train": asdict(config)},
        "steps": steps,
        "temperatures": list(temperatures),
        "metrics": {k: v for k, v in heldout.items() if isinstance(v, dict)},
        "source_digest": source_digest(data, base, config, pins, steps, losses),
    } | ({MAPPING_OPTIONS: options} if options else {})
