"""Training speed against laya: the same base, VADER subset, micro-batch and steps, side by side.

Both trainers start from the stock MiniLM snapshot (data/snapshots/minilm) and train one epoch over the same
training rows (micro-batch 8, accumulation 8), each in a fresh process of this script, one after the other.
laya runs `laya.train.finetune` (full fine-tuning, soft cross-entropy); its training loop is timed by wrapping
`laya.train.train_model`. Ours runs `pipeline.stages.train.train_on_data` with params.yaml's training
settings. Both fine-tunes are then scored with the same code on the same held-out rows.

    python benchmarks/bench_train.py [--rows 600] [--heldout 100] [--profile]

Goal: ours >= 1.3x laya's decisions/s at equal held-out accuracy (within one point).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
BASE = ROOT / "data/snapshots/minilm"
DATA = ROOT / "data/processed/vader.jsonl"
MICRO_BATCH, GRAD_ACCUM = 8, 8


def write_subsets(rows: int, heldout: int, folder: Path) -> tuple[Path, Path]:
    """Training and held-out rows: the held-out split of the full set, and the first `rows` training rows."""
    sys.path.insert(0, str(ROOT))
    import orjson

    from pipeline.config import ValidateConfig
    from pipeline.data.split import split_holdout
    from pipeline.data.validate import validate_file

    records = validate_file(DATA).records
    split = split_holdout(records, ValidateConfig(holdout_max_decisions=4 * heldout, holdout_fraction=0.1))
    lines = DATA.read_bytes().splitlines()
    folder.mkdir(parents=True, exist_ok=True)
    train, evaluation = folder / "train.jsonl", folder / "heldout.jsonl"
    train.write_bytes(b"\n".join(lines[r.row] for r in split.train[:rows]) + b"\n")
    evaluation.write_bytes(b"\n".join(lines[r.row] for r in split.heldout) + b"\n")
    assert orjson.loads(lines[split.heldout[0].row])["state"] == split.heldout[0].state
    return train, evaluation


def run_laya(train: Path, out: Path) -> dict:
    import laya.train as laya_train

    timed: dict[str, float] = {}
    original = laya_train.train_model

    def timed_train_model(*args, **kwargs):
        started = time.perf_counter()
        history = original(*args, **kwargs)
        timed["train_seconds"] = time.perf_counter() - started
        timed["items"] = len(args[2])
        return history

    laya_train.train_model = timed_train_model
    config = laya_train.TrainConfig(
        epochs=1,
        micro_batch=MICRO_BATCH,
        grad_accum=GRAD_ACCUM,
        loss="soft-ce",
        calib_max=0,
        calib_frac=0.0,
        log_every=0,
    )
    laya_train.finetune(str(train), str(BASE), str(out), config, device="cpu")
    micro_steps = -(-timed["items"] // MICRO_BATCH)
    return {
        "decisions": timed["items"],
        "train_seconds": timed["train_seconds"],
        "micro_steps": micro_steps,
        "steps": -(-micro_steps // GRAD_ACCUM),
        "model": str(out),
    }


def run_ours(train: Path, out: Path, method: str, precision: str | None, profile: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from dataclasses import replace

    from pipeline.config import load_params
    from pipeline.data.split import TrainSource
    from pipeline.stages.train import train_on_data

    params = load_params(ROOT / "params.yaml")
    config = replace(
        params.train,
        family="laya",
        method=method,
        min_steps=0,
        precision=precision or params.train.precision,
        epochs=1,
        micro_batch=MICRO_BATCH,
        grad_accum=GRAD_ACCUM,
        max_steps=None,
    )
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    # The held-out rows are given separately, so every training row is trained on, as in laya's run.
    run = train_on_data(TrainSource(train, eval_data=train.with_name("heldout.jsonl")), BASE, out, config)
    if profiler is not None:
        profiler.disable()
        _print_profile(profiler)
    return {
        "decisions": run.train_decisions,
        "train_seconds": run.train_seconds,
        "steps": run.steps,
        "s_per_step": run.s_per_step,
        "precision": run.precision,
        "method": config.method,
        "model": str(out),
    }


def _print_profile(profiler) -> None:
    import io
    import pstats

    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    print(text.getvalue(), file=sys.stderr)


def heldout_accuracy(model_dir: str, heldout: Path) -> dict:
    """Accuracy of a fine-tune on the held-out rows, scored by the same code for both trainers."""
    sys.path.insert(0, str(ROOT))
    from pipeline.data.validate import validate_file
    from pipeline.families.laya.adapters import ADAPTER_FILE, load_adapter
    from pipeline.families.laya.forward import score_items
    from pipeline.families.laya.items import build_items
    from pipeline.families.laya_layout import load_model
    from pipeline.scoring.metrics import heldout_metrics

    folder = Path(model_dir)
    if (folder / ADAPTER_FILE).is_file():
        loaded = load_model(BASE)
        load_adapter(loaded.model, folder)
    else:
        loaded = load_model(folder)
    items, _ = build_items(validate_file(heldout).records, loaded)
    import torch

    probabilities = score_items(loaded.model, items, loaded.tokenizer.pad_token_id, torch.device("cpu"), 64)
    return heldout_metrics(items, probabilities)


def child(args: argparse.Namespace) -> None:
    work = Path(args.work)
    if args.child == "laya":
        result = run_laya(work / "train.jsonl", work / "laya_model")
    else:
        method = args.child.removeprefix("ours-")
        result = run_ours(work / "train.jsonl", work / f"ours_{method}", method, args.precision, args.profile)
    result["heldout"] = heldout_accuracy(result["model"], work / "heldout.jsonl")
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=600, help="training rows (4 decisions each)")
    parser.add_argument("--heldout", type=int, default=100, help="held-out rows")
    parser.add_argument("--profile", action="store_true", help="print where our trainer's time goes")
    parser.add_argument(
        "--methods", default="lora,full", help="our fine-tuning methods to run (comma-separated)"
    )
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], help="override train.precision")
    parser.add_argument("--skip-laya", action="store_true", help="reuse laya's last result from the JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", default=str(HERE / ".cache/train"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    write_subsets(args.rows, args.heldout, Path(args.work))
    results, names = {}, [f"ours-{m}" for m in args.methods.split(",")]
    if args.skip_laya:
        results["laya"] = json.loads((RESULTS / "bench_train.json").read_text())["results"]["laya"]
    else:
        names.insert(0, "laya")
    for name in names:
        command = [sys.executable, __file__, "--child", name, "--work", args.work]
        command += ["--profile"] * args.profile + (["--precision", args.precision] if args.precision else [])
        print(f"training with {name} ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            sys.exit(f"{name} failed:\n{done.stderr[-4000:]}")
        if args.profile and name.startswith("ours"):
            print(done.stderr[-6000:])
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    report(results)


def report(results: dict) -> None:
    print(
        f"\n{'trainer':<8}{'decisions':>10}{'steps':>7}{'seconds':>9}{'s/step':>8}{'dec/s':>8}{'accuracy':>10}"
    )
    for name, r in results.items():
        r["decisions_per_second"] = r["decisions"] / r["train_seconds"]
        r["s_per_step"] = r["train_seconds"] / r["steps"]
        print(
            f"{name:<10}{r['decisions']:>10}{r['steps']:>7}{r['train_seconds']:>9.1f}{r['s_per_step']:>8.2f}"
            f"{r['decisions_per_second']:>8.1f}{r['heldout']['accuracy']:>10.4f}"
        )
    laya = results["laya"]
    summary = {}
    for name in [n for n in results if n != "laya"]:
        ratio = results[name]["decisions_per_second"] / laya["decisions_per_second"]
        gap = results[name]["heldout"]["accuracy"] - laya["heldout"]["accuracy"]
        summary[name] = {"speed_ratio": ratio, "accuracy_gap": gap}
        print(
            f"{name} / laya decisions/s = {ratio:.2f}x (goal >= 1.3x); accuracy {name} - laya = {gap:+.4f} "
            f"(goal: within 0.01)"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_train.json"
    out.write_text(json.dumps({"results": results, "summary": summary}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
