"""The pipeline's stages by name: what `dvc.yaml` runs and what the Prefect flows call.

python -m pipeline.stages.dvc dataset      # the command each dvc.yaml stage runs
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.config import PARAMS_FILE, Params, load_params
from pipeline.data.dataset import DatasetResult, build_dataset
from pipeline.data.split import ledger_under
from pipeline.families.laya_layout import write_snapshot
from pipeline.stages import validate as validate_stage
from pipeline.stages.validate import ValidateResult


@dataclass(frozen=True)
class SnapshotResult:
    """Where the stock base went and the files it holds."""

    out: str
    files: list[str]


def run_dataset(params: Params, root: Path) -> DatasetResult:
    """Build the embedded VADER dataset (`dataset` in params.yaml)."""
    return build_dataset(params.dataset, root)


def run_validate(params: Params, root: Path) -> ValidateResult:
    """Validate the dataset, split it, write the report with the split summary, and add the held-out rows to
    the data set's ledger."""
    config = ledger_under(params.validate, root)
    return validate_stage.validate_stage(root / config.data, config, root / config.report)


def run_snapshot(params: Params, root: Path) -> SnapshotResult:
    """Build the stock base model: the packaged MiniLM encoder plus a seeded, fresh decision head."""
    config = params.snapshot
    installed = metadata.version(config.encoder_package)
    if installed != config.encoder_version:
        raise RuntimeError(
            f"snapshot.encoder_version: params.yaml pins {config.encoder_package}=={config.encoder_version}, "
            f"but {installed} is installed"
        )
    module = __import__(config.encoder_package.replace("-", "_"))
    out = write_snapshot(
        root / config.out,
        module.get_model_path(),
        config.seed,
        config.head_layers,
        config.max_len,
        config.head_max_len,
    )
    return SnapshotResult(str(config.out), sorted(p.name for p in out.rglob("*") if p.is_file()))


# name -> (function, the module whose code the stage runs); dvc.yaml must list the same stages.
STAGES: dict[str, tuple[Callable[[Params, Path], Any], str]] = {
    "dataset": (run_dataset, "pipeline/data/dataset.py"),
    "validate": (run_validate, "pipeline/data/validate.py"),
    "snapshot": (run_snapshot, "pipeline/families/laya_layout.py"),
}


def run_stage(name: str, params_file: str | Path = PARAMS_FILE, root: str | Path = "."):
    """Run one stage with the params from `params_file`."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return STAGES[name][0](load_params(Path(root) / params_file), Path(root))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in STAGES:
        print(f"usage: python -m pipeline.stages.dvc {{{','.join(STAGES)}}}", file=sys.stderr)
        return 2
    result = run_stage(args[0])
    shown = result.to_dict() if hasattr(result, "to_dict") else asdict(result)
    print(json.dumps({k: v for k, v in shown.items() if k != "examples"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
