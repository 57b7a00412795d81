"""Data-parallel training: one process against torchrun ranks on the same global batch, side by side.

Each row trains the same fine-tune (params.yaml's `train:` settings, with the method, steps and batch below)
on the same rows, one run after the other: in this process (1 rank, no launcher), then under
`torch.distributed.run` with 1 rank (the launcher's own cost) and with `--ranks` ranks (each on its share of
every window; gloo on the CPU, NCCL on GPUs). It prints s/step (median, first step left out), decisions/s over
the training loop, the all-reduce's seconds per step and its share of a step (rank 0's time inside the one
gradient all-reduce per step), and each figure's ratio to the one-process row. On a 2-core machine two CPU
ranks cannot be faster (each gets one core); the point there is that they train the same model
(tests/model/test_ddp.py).

    python benchmarks/bench_ddp.py --data /work/main/data/processed/vader.jsonl \\
        --base /work/main/data/snapshots/minilm [--rows 300] [--steps 8] [--method lora] [--device cpu]

Writes benchmarks/results/bench_ddp.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def measure(label: str, run) -> dict:
    """The figures of one `TrainRun`, per optimizer step."""
    steps = max(run.steps, 1)
    return {
        "setup": label,
        "world_size": run.world_size,
        "steps": run.steps,
        "s_per_step": run.s_per_step,
        "decisions_per_s": run.decisions_per_second,
        "allreduce_s_per_step": run.allreduce_seconds / steps,
        "allreduce_share": run.allreduce_seconds / run.train_seconds if run.train_seconds else 0.0,
        "train_seconds": run.train_seconds,
    }


def run_all(args: argparse.Namespace) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from pipeline.config import ValidateConfig, load_params
    from pipeline.data.read import RowSlice
    from pipeline.data.split import TrainSource
    from pipeline.stages.train import train_on_data, train_on_ranks

    config = replace(
        load_params(ROOT / "params.yaml").train,
        method=args.method,
        max_steps=args.steps,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        precision="fp32",
        log_every=1000,
        warmup_steps=0,
        **({"family": args.family} if args.family else {}),
    )
    source = TrainSource(
        args.data, RowSlice(0, args.rows), split_config=ValidateConfig(holdout_max_decisions=args.heldout)
    )
    data = source.validated()  # validated once; every setup trains on the same split
    rows = [measure("1 process", train_on_data(source, args.base, None, config, args.device))]
    rows.append(
        measure("torchrun, 1 rank", train_on_ranks(data, args.base, None, config, args.device, nproc=1))
    )
    if args.ranks > 1:  # one GPU: the launcher's row is the comparison
        ranked = replace(config, nproc=args.ranks)
        rows.append(
            measure(
                f"torchrun, {args.ranks} ranks",
                train_on_ranks(data, args.base, None, ranked, args.device),
            )
        )
    return rows


def print_table(rows: list[dict], window: int) -> None:
    base = rows[0]
    print(f"\nglobal batch: {window} items per optimizer step, {base['steps']} steps per run")
    header = ("setup", "ranks", "s/step", "x", "decisions/s", "x", "all-reduce s/step", "all-reduce share")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print(
            f"| {row['setup']} | {row['world_size']} | {row['s_per_step']:.3f} | "
            f"{row['s_per_step'] / base['s_per_step']:.2f} | {row['decisions_per_s']:.1f} | "
            f"{row['decisions_per_s'] / base['decisions_per_s']:.2f} | {row['allreduce_s_per_step']:.4f} | "
            f"{100 * row['allreduce_share']:.1f}% |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=str(ROOT / "data/processed/vader.jsonl"))
    parser.add_argument("--base", default=str(ROOT / "data/snapshots/minilm"))
    parser.add_argument("--rows", type=int, default=300, help="rows of DATA to use (a slice from the start)")
    parser.add_argument("--heldout", type=int, default=40, help="held-out decisions (scored, not timed)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--method", default="lora", choices=["head", "lora", "full"])
    parser.add_argument("--family", choices=["laya", "joint"], help="default: train.family in params.yaml")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (NCCL; one GPU per rank)")
    args = parser.parse_args()
    rows = run_all(args)
    print_table(rows, args.micro_batch * args.grad_accum)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench_ddp.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
