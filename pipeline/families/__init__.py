"""The model families and the one function that picks one (`pick_family`); see `pipeline.families.base`.

family = pick_family("data/snapshots/minilm")                 # laya (what the folder is)
family = pick_family("data/snapshots/minilm", "joint")        # the joint head on the same encoder
family = pick_family("models/deberta-v3-small")               # joint (a plain encoder folder)
model = load_decision_model("runs/abc/export")                # a family and its loaded model
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError

from pipeline.config import ConfigError, TrainConfig
from pipeline.families.base import BadBase, DecisionFamily, DecisionModel, ModelLayoutError
from pipeline.families.base_folders import folder_problem, weights_problem
from pipeline.families.exporting import read_automation
from pipeline.families.joint.family import JointFamily
from pipeline.families.laya.family import LayaFamily

# transformers builds models inside `no_init_weights`, which swaps torch.nn.init's functions for no-ops
# process-wide and puts back what it found: two loads at once in two threads (a server's catalog and its
# shadow's) can leave the no-ops in place for good, and every model initialised later in the process holds
# uninitialised memory (NaN). One model built at a time: a load, and (in training, where a sweep runs trials
# in threads) the adapters and heads a family adds to a loaded base.
MODEL_BUILDS = threading.Lock()

# Order matters only where a folder could be read as several: a joint export is checked before the rest.
FAMILIES: dict[str, DecisionFamily] = {family.name: family for family in (JointFamily(), LayaFamily())}


PICKING_RULE = (
    "with no --family (train.family: null) a base trains in the family whose base it is (`starts from` "
    "above; a Laya-layout folder: laya, a plain Hugging Face encoder or causal LM folder: joint); --family "
    "picks another that can start from it. The method is that family's default unless --method "
    "(train.method) names another. A run's first lines say which and why."
)
"""How a family and method follow from a base (`decision families` states it)."""


def pick_family(folder: str | Path, name: str | None = None) -> DecisionFamily:
    """The family named (`train.family` / `--family`), or the one whose layout `folder` is; BadBase, one line
    naming the folder and what to do, when that family cannot start from it."""
    folder = Path(folder)
    if name is not None and name not in FAMILIES:
        raise ConfigError(f"train.family: expected one of {', '.join(FAMILIES)}; got {name!r}")
    owner = _owner(folder)
    if name is not None and FAMILIES[name].can_load(folder):
        return FAMILIES[name]
    if owner is None:
        raise BadBase(folder_problem(folder))
    if name is None:
        return owner
    raise BadBase(
        f"{folder}: the {name} family cannot start from it: it is {owner.describe_base(folder)}; "
        f"train it in the {owner.name} family (--family {owner.name}, or train.family: null)"
    )


def _owner(folder: Path) -> DecisionFamily | None:
    """The family whose layout `folder` is (the first that owns it)."""
    return next((family for family in FAMILIES.values() if family.owns(folder)), None)


def resolve_training(base: str | Path, config: TrainConfig) -> tuple[DecisionFamily, TrainConfig]:
    """The family that trains on `base` and `config` with its family and method filled in (`train.method:
    null` is the family's default); ConfigError naming `train.method` when the family does not train that way,
    BadBase when one of the base's weight files is damaged."""
    family = pick_family(base, config.family)
    if (damaged := weights_problem(Path(base))) is not None:
        raise BadBase(damaged)
    method = config.method or family.default_method
    if method not in family.methods:
        raise ConfigError(
            f"train.method={method}: the {family.name} family trains with {' or '.join(family.methods)}"
        )
    if (problem := family.method_problem(Path(base), method)) is not None:
        raise ConfigError(problem)
    resolved = replace(config, family=family.name, method=method)
    return family, replace(resolved, precision=family.training_precision(resolved)[0])


def explain_training(base: str | Path, family: DecisionFamily, config: TrainConfig) -> str:
    """Which family and method train on `base` and why, in one line (a run's first lines say it); `config` is
    resolved (`resolve_training`)."""
    folder = Path(base)
    owner = _owner(folder) or family
    why_family = (
        "what the base is"
        if owner is family
        else f"set by train.family or --family; the base's own is {owner.name}"
    )
    why_method = (
        f"the {family.name} family's default"
        if config.method == family.default_method
        else "set by train.method or --method"
    )
    precision, why_precision = family.training_precision(config)
    return (
        f"{family.name} family ({why_family}): {base} is {family.describe_base(folder)}; method "
        f"{config.method} ({why_method})"
        + (f"; precision {precision} ({why_precision})" if why_precision else "")
    )


def load_decision_model(folder: str | Path) -> DecisionModel:
    """A servable model of any family: an export, or a family's fine-tune folder; ModelLayoutError naming the
    folder where its files are missing, damaged or of another shape."""
    family = pick_family(folder)
    with MODEL_BUILDS, loading(folder, ModelLayoutError, "a model", "an unfinished or damaged export?"):
        loaded = family.load_trained(folder)
    return DecisionModel(family, loaded, automation=read_automation(folder))


@contextmanager
def loading(folder: str | Path, refusal: type[ModelLayoutError], what: str, hint: str = "") -> Iterator[None]:
    """What a loader raises on a folder whose files are missing, truncated, corrupted or of another shape (an
    OS error, safetensors' own, a shape mismatch, a missing key) as one `refusal` naming the folder; the
    project's own errors, and running out of memory, as they are."""
    try:
        yield
    except (ModelLayoutError, ConfigError, torch.OutOfMemoryError):
        raise
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as error:
        said = " ".join(str(error).split())  # one line, whatever the loader wrote
        raise refusal(
            f"{folder}: does not load as {what} ({type(error).__name__}: {said}){' ' + hint if hint else ''}"
        ) from error


def is_complete_export(folder: Path) -> bool:
    """A folder some family wrote completely (its last file is there); a staging folder never is."""
    return any(family.is_export(folder) for family in FAMILIES.values())


def list_models(folder: str | Path) -> list[Path]:
    """The complete exports among a folder's visible subfolders."""
    folder = Path(folder)
    return sorted(
        p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and is_complete_export(p)
    )


def find_exports(root: str | Path) -> list[Path]:
    """Every complete export at or below `root` (e.g. inside a downloaded MLflow model)."""
    root = Path(root)
    return sorted(p for p in [root, *root.rglob("*")] if p.is_dir() and is_complete_export(p))


def written_last(folder: Path) -> Path:
    """The file the folder's family wrote last (it dates the release)."""
    return pick_family(folder).written_last(folder)
