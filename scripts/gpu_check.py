"""GPU check: the trainer, per-layer compile, bf16, layer plans, QLoRA, the export merge, the packed serving
pass, the data-parallel launcher and the default fine-tune on one CUDA GPU, as one table and one JSON file,
within one device lease.

    bash scripts/gpu_check.sh                       # on the GPU machine (what it carries and its budget: see there)
    bash scripts/gpu_check.sh --dry-run             # every row on the CPU with the tiny models
    python scripts/gpu_check.py --rows laya_train,data_parallel     # some rows again

Rows, in order (each pass, fail or skipped, with its reason and numbers):
  device          torch, CUDA, the GPU and its compute capability; native bf16 and the auto precision
  laya_train      the laya family (LoRA): fp32 and bf16, eager and compiled per layer (DECISION_COMPILE=1):
                  s/step, compile report, first-step gradients and losses against fp32 eager
  layer_plan      a plan visiting every encoder layer twice under per-layer compile: outputs and gradients
  packed_forward  the packed serving pass in fp32 and bf16 against the padded pass
  export_merge    LoRA merged into a CPU copy: device memory, adapters kept, merged == adapted
  data_parallel   one torchrun rank through the stage's launcher (NCCL on CUDA) against this process
  default_fit     params.yaml's default fine-tune (joint head, both lexicons, precision auto) through the stage's
                  fit, on the GPU in fp32 and auto against the CPU: the ensemble kept, the base's held-out pass
                  equal, trained accuracy as high
  joint_train     the joint family on a causal LM (LoRA), as laya_train
  qlora           the joint family's QLoRA (nf4) against LoRA; skipped without bitsandbytes
  gpu_tests       pytest -m gpu on tests/model/test_gpu.py

The models are random, built where the check runs (`scripts/gpu_check_setup.py`); the packages the GPU machine
lacks are hidden from this process first (`scripts/gpu_check_absent.py`), so the dry run imports what a GPU
run can. A row that would start past the time budget is skipped, saying so; the JSON is rewritten after every
row, so a run killed by its timeout still leaves the rows it finished. Exit status: 0 when no row failed, 1
when one did, 2 when there is no CUDA device and no --dry-run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Nothing of the project, nor torch, at module level: `main` hides the packages the GPU machine lacks first.
from scripts.gpu_check_absent import ABSENT, DRY_RUN_ABSENT, hide_absent  # noqa: E402

ROWS = (
    "device",
    "laya_train",
    "layer_plan",
    "packed_forward",
    "export_merge",
    "data_parallel",
    "default_fit",
    "joint_train",
    "qlora",
    "gpu_tests",
)
TESTS_TIMEOUT = 180.0
"""Most seconds the gpu_tests row may take (less when less of the budget is left)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="the CPU: tiny models, dynamo's eager compile backend, a 240 s budget",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda (cpu with --dry-run)")
    parser.add_argument(
        "--size",
        choices=["tiny", "small", "long"],
        help="default: small on CUDA, tiny on the CPU; long: small on ~100-token states",
    )
    parser.add_argument(
        "--backend", help="torch.compile backend (default: inductor on CUDA, eager (dynamo alone) on the CPU)"
    )
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument(
        "--budget", type=float, help="seconds for all rows (default: 420 on CUDA, 240 on the CPU)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("GPU_CHECK_OUT") or ROOT / "benchmarks/results/gpu_check.json"),
        help="the JSON results (default: $GPU_CHECK_OUT, else benchmarks/results/gpu_check.json)",
    )
    args = parser.parse_args(argv)
    cpu = args.dry_run or args.device == "cpu"
    args.device = args.device or ("cpu" if cpu else "cuda")
    args.size = args.size or ("tiny" if cpu else "small")
    args.backend = args.backend or ("eager" if cpu else "inductor")
    args.budget = args.budget or (240.0 if cpu else 420.0)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    return args


def row_functions(setup, deadline: float) -> dict[str, Callable]:
    from scripts import gpu_check_fit as default_fit
    from scripts import gpu_check_rows as rows
    from scripts import gpu_check_train as training

    return {
        "device": rows.check_device,
        "laya_train": lambda s: training.check_training(s, "laya", s.bases.laya),
        "layer_plan": rows.check_layer_plan,
        "packed_forward": rows.check_packed_forward,
        "export_merge": rows.check_export_merge,
        "data_parallel": training.check_data_parallel,
        "default_fit": default_fit.check_default_fit,
        "joint_train": lambda s: training.check_training(s, "joint", s.bases.causal_lm),
        "qlora": training.check_qlora,
        "gpu_tests": lambda s: rows.check_gpu_tests(s, min(TESTS_TIMEOUT, deadline - time.monotonic())),
    }


def run_row(name: str, check: Callable, setup) -> dict:
    """One row as the JSON holds it; an error inside a check is that row's failure, named, and the next row
    runs."""
    from scripts.gpu_check_setup import Outcome

    started = time.perf_counter()
    try:
        outcome = check(setup)
    # Deliberately broad: a check harness records what broke (type, message, traceback) as the row's failure
    # and goes on to the next row; the exit status still says that a row failed.
    except Exception as error:
        outcome = Outcome(
            "fail", f"{type(error).__name__}: {error}", {"traceback": traceback.format_exc()[-4000:]}
        )
    return {
        "row": name,
        "status": outcome.status,
        "seconds": round(time.perf_counter() - started, 2),
        "reason": outcome.reason,
        "numbers": outcome.numbers,
    }


CARRIED = ("laya", "orjson", "pandera")
"""Packages the GPU machine lacks and the check needs: gpu_check.sh installs their wheels from .whl/."""


def carried_packages() -> dict[str, str | None]:
    """Where each carried package is found (None: not importable)."""
    specs = {name: importlib.util.find_spec(name) for name in CARRIED}
    return {
        name: str(Path(spec.origin).parent) if spec and spec.origin else None for name, spec in specs.items()
    }


def print_row(row: dict) -> None:
    print(f"{row['row']:<15}{row['status']:<8}{row['seconds']:>8.1f}  {row['reason']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the rows asked for; 0 when none failed, 1 when one did, 2 when the check cannot start."""
    args = parse_args(argv)
    hidden = hide_absent(ABSENT if args.device == "cuda" else DRY_RUN_ABSENT)
    if args.device == "cpu":
        # One thread per process (the ranks inherit it): two on a busy 2-core machine ran steps 20x slower.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a table, not a progress bar per model written or loaded
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch; run with --dry-run for the CPU", file=sys.stderr)
        return 2
    carried = carried_packages()
    missing = [name for name, where in carried.items() if where is None]
    if missing:
        print(
            f"gpu_check: {', '.join(missing)} not importable: fetch the wheels here (bash "
            "scripts/gpu_check.sh --fetch-wheels) and carry .whl/; gpu_check.sh installs them",
            file=sys.stderr,
        )
        return 2
    results = {
        "device": args.device,
        "size": args.size,
        "backend": args.backend,
        "budget_seconds": args.budget,
        "hidden_packages": hidden,
        "carried": carried,
        "rows": [],
    }
    print(
        f"gpu check on {args.device} ({args.size} models, compile backend {args.backend}, budget "
        f"{args.budget:.0f} s); results: {args.out}\n\n{'row':<15}{'status':<8}{'seconds':>8}  result",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        run_rows(args, build_setup(args, Path(work)), results)
    statuses = [row["status"] for row in results["rows"]]
    print(
        f"\n{statuses.count('pass')} passed, {statuses.count('fail')} failed, {statuses.count('skipped')} "
        f"skipped in {results['wall_seconds']:.0f} s; wrote {args.out}"
    )
    return 1 if "fail" in statuses else 0


def build_setup(args: argparse.Namespace, work: Path):
    """The device, the random bases written under `work` and the synthetic records the rows share."""
    import torch

    from scripts.gpu_check_setup import SIZES, Setup, write_bases
    from tests.tiny import synthetic_records

    sizes = SIZES[args.size]
    return Setup(
        torch.device(args.device),
        sizes,
        write_bases(work / "bases", sizes),
        synthetic_records(sizes.rows, 0, sizes.state_chars),
        args.backend,
        work,
    )


def run_rows(args: argparse.Namespace, setup, results: dict) -> None:
    """Each row in turn (skipped past the budget), printed as it ends, the JSON rewritten after each."""
    started = time.monotonic()
    deadline = started + args.budget
    checks = row_functions(setup, deadline)
    for name in args.rows:
        if time.monotonic() > deadline:
            row = {
                "row": name,
                "status": "skipped",
                "seconds": 0.0,
                "numbers": {},
                "reason": f"past the check's budget of {args.budget:.0f} s",
            }
        else:
            row = run_row(name, checks[name], setup)
        results["rows"].append(row)
        results["wall_seconds"] = round(time.monotonic() - started, 1)
        write_results(args.out, results)
        print_row(row)


def write_results(out: Path, results: dict) -> None:
    """The results as JSON at `out`, replaced whole (a reader never sees half a file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(out.name + ".partial")
    staged.write_text(json.dumps(results, indent=2, default=str))
    staged.replace(out)


if __name__ == "__main__":
    sys.exit(main())
