"""Layer plans on the MiniLM base: accuracy, calibration, training and serving speed per plan, side by side.

Each plan fine-tunes the joint family on the stock MiniLM snapshot with LoRA for the same number of optimizer
steps on the same VADER training rows, then is scored on the same held-out rows (accuracy and ECE of the
uncalibrated fine-tune) and served by our Decision API (one process, the CPU) with the same 5-question
requests at concurrency 1 and 8. Plans: native (6 layers), the first 4, the first 3, and layers 2-3 run twice
(8 visits). Prints one table with each figure's ratio to native, writes
benchmarks/results/bench_layer_plans.json and a plot of held-out accuracy against serving throughput
(bench_layer_plans.png).

    python benchmarks/bench_layer_plans.py [--steps 120] [--rows 600] [--heldout 150] [--requests 48]
        [--data data/processed/vader.jsonl] [--base data/snapshots/minilm]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

PLANS = {
    "native (6)": None,
    "first 4": [0, 1, 2, 3],
    "first 3": [0, 1, 2],
    "2-3 twice (8)": [[2, 4, 2]],
}


def write_subsets(data: Path, rows: int, heldout: int, folder: Path) -> tuple[Path, Path]:
    """The first `rows` training rows and `heldout` held-out rows of the content-hash split, as JSONL
    files."""
    from pipeline.config import ValidateConfig
    from pipeline.data.split import split_holdout
    from pipeline.data.validate import validate_file

    split = split_holdout(validate_file(data).records, ValidateConfig(holdout_max_decisions=4 * heldout))
    lines = data.read_bytes().splitlines()
    train, evaluation = folder / "train.jsonl", folder / "heldout.jsonl"
    train.write_bytes(b"\n".join(lines[r.row] for r in split.train[:rows]) + b"\n")
    evaluation.write_bytes(b"\n".join(lines[r.row] for r in split.heldout[:heldout]) + b"\n")
    return train, evaluation


def fine_tune(plan, train: Path, heldout: Path, base: Path, out: Path, steps: int) -> dict:
    """LoRA on the joint family for exactly `steps` optimizer steps under `plan`; the run's figures."""
    from pipeline.config import load_params
    from pipeline.data.split import TrainSource
    from pipeline.stages.train import train_on_data

    params = load_params(ROOT / "params.yaml")
    layer_plan = tuple(tuple(e) if isinstance(e, list) else e for e in plan) if plan else None
    config = replace(
        params.train,
        family="joint",
        method="lora",
        micro_batch=8,
        grad_accum=1,
        epochs=100,
        min_steps=0,
        max_steps=steps,
        warmup_steps=10,
        layer_plan=layer_plan,
        log_every=20,
        checkpoint_every_steps=0,
        checkpoint_every_minutes=0.0,
    )
    run = train_on_data(
        TrainSource(train, eval_data=heldout, split_config=params.validate), base, out, config, device="cpu"
    )
    tuned = run.heldout["tuned"]
    return {
        "steps": run.steps,
        "s_per_step": run.s_per_step,
        "accuracy": tuned["accuracy"],
        "ece": tuned["ece"],
        "base_accuracy": run.heldout["base"]["accuracy"],
        "decisions": run.heldout["decisions"],
    }


def serve(folder: Path, bodies: list[dict]) -> dict[int, float]:
    """Requests/s of our server on `folder` at concurrency 1 and 8."""
    from bench_serve import measure, start_ours

    runs = measure("ours", start_ours, folder, bodies, [1, 8], 16, "cpu")["runs"]
    return {run["concurrency"]: run["throughput_rps"] for run in runs}


def ratios(rows: dict[str, dict]) -> None:
    native = rows[next(iter(rows))]
    for row in rows.values():
        row["ratio"] = {k: row[k] / native[k] for k in ("accuracy", "ece", "s_per_step", "rps_1", "rps_8")}


def print_table(rows: dict[str, dict], steps: int) -> None:
    print(f"\nLoRA (joint family), {steps} steps of micro-batch 8 per plan; ratios to native in brackets")
    print(
        f"{'plan':<15}{'visits':>7}{'accuracy':>16}{'ECE':>16}{'train s/step':>18}{'req/s c=1':>16}"
        f"{'req/s c=8':>16}"
    )
    for name, row in rows.items():
        r = row["ratio"]
        print(
            f"{name:<15}{row['visits']:>7}{row['accuracy']:>9.3f} ({r['accuracy']:.2f}){row['ece']:>9.3f} "
            f"({r['ece']:.2f}){row['s_per_step']:>11.2f} ({r['s_per_step']:.2f}){row['rps_1']:>9.1f} "
            f"({r['rps_1']:.2f}){row['rps_8']:>9.1f} ({r['rps_8']:.2f})"
        )


def plot(rows: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for name, row in rows.items():
        axis.scatter(row["rps_8"], row["accuracy"])
        axis.annotate(name, (row["rps_8"], row["accuracy"]), textcoords="offset points", xytext=(5, 5))
    axis.set_xlabel("serving requests/s at concurrency 8 (5-question requests, CPU)")
    axis.set_ylabel("held-out accuracy")
    axis.set_title("Layer plans on MiniLM: accuracy against serving speed")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--base", type=Path, default=ROOT / "data/snapshots/minilm")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps per plan (the same for each)")
    parser.add_argument("--rows", type=int, default=600, help="training rows")
    parser.add_argument("--heldout", type=int, default=150, help="held-out rows")
    parser.add_argument("--requests", type=int, default=48, help="requests per concurrency level")
    args = parser.parse_args()

    from bench_serve import build_requests

    from pipeline.layer_plans import resolve_plan

    bodies = build_requests(args.data, args.requests)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        train, heldout = write_subsets(args.data, args.rows, args.heldout, Path(tmp))
        for name, plan in PLANS.items():
            print(f"{name}: fine-tuning", flush=True)
            out = Path(tmp) / f"plan{len(rows)}"
            row = fine_tune(plan, train, heldout, args.base, out, args.steps)
            served = serve(out, bodies)
            visits = len(resolve_plan(plan, 6).visits) if plan else 6
            rows[name] = {"plan": plan, "visits": visits, **row, "rps_1": served[1], "rps_8": served[8]}
    ratios(rows)
    print_table(rows, args.steps)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_layer_plans.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "plans": rows}, indent=2)
    )
    plot(rows, RESULTS / "bench_layer_plans.png")
    print(f"wrote {RESULTS / 'bench_layer_plans.json'} and {RESULTS / 'bench_layer_plans.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
