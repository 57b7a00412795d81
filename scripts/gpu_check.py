"""GPU check: the trainer on CUDA in bf16, compile forced off and on the auto rule, side by side.

Prints one table: s/step (median of the steady steps after the first), whether compile ran and why, graphs
compiled and recompiles after the warm-up, peak GPU memory, and held-out accuracy before and after a short run.
Needs the project's Python packages already installed (it installs nothing) and a CUDA device.

    bash scripts/gpu_check.sh            # or: python scripts/gpu_check.py --steps 500
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ensure_inputs() -> None:
    """Build the dataset and base snapshot from the files in the repo when they are missing (no network)."""
    from pipeline.stages.dvc import run_stage

    if not (ROOT / "data/processed/vader.jsonl").exists():
        run_stage("dataset", root=ROOT)
    if not (ROOT / "data/snapshots/minilm/rl_agent_config.json").exists():
        run_stage("snapshot", root=ROOT)


def run(mode: str, steps: int) -> dict:
    import torch

    from pipeline.config import load_params
    from pipeline.stages.train import train_on_data

    os.environ["DECISION_COMPILE"] = "0" if mode == "eager" else ""
    if mode == "compile-auto":
        os.environ.pop("DECISION_COMPILE")
    torch._dynamo.reset()
    torch.cuda.reset_peak_memory_stats()
    params = load_params(ROOT / "params.yaml")
    config = replace(params.train, precision="bf16", max_steps=steps, log_every=50)
    started = time.perf_counter()
    result = train_on_data(ROOT / "data/processed/vader.jsonl", ROOT / "data/snapshots/minilm", None, config,
                           params.validate, device="cuda", progress=False)  # fmt: skip
    return {
        "mode": mode, "steps": result.steps, "s_per_step": result.s_per_step,
        "decisions_per_second": result.decisions_per_second, "compile": result.compile,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30, "wall_seconds": time.perf_counter() - started,
        "accuracy_base": result.heldout["base"]["accuracy"], "accuracy_tuned": result.heldout["tuned"]["accuracy"],
    }  # fmt: skip


def export_memory_check() -> dict:
    """Merging for export copies to the CPU: device memory must not grow and the training model keeps its adapters."""
    import torch

    from pipeline.families.exporting import merged_copy
    from pipeline.families.laya.adapters import apply_lora, has_lora
    from pipeline.families.laya_layout import load_model

    loaded = load_model(ROOT / "data/snapshots/minilm")
    apply_lora(loaded.model, r=64, alpha=64, dropout=0.0, targets="all-linear")
    loaded.model.to("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    merged = merged_copy(loaded.model)
    torch.cuda.synchronize()
    return {
        "allocated_before_mb": before / 2**20, "allocated_after_mb": torch.cuda.memory_allocated() / 2**20,
        "peak_during_merge_mb": torch.cuda.max_memory_allocated() / 2**20,
        "merged_on": next(merged.parameters()).device.type, "adapters_kept": has_lora(loaded.model),
    }  # fmt: skip


def layer_plan_compile_check() -> dict:
    """A layer plan under per-layer compile: layers 2-3 visited twice are still one compiled module each, and the
    outputs and summed gradients match eager (dropout off, so both passes see the same numbers)."""
    import torch

    from pipeline.families.laya_layout import load_model
    from pipeline.families.planned_layers import apply_layer_plan, physical_layers
    from pipeline.layer_plans import resolve_plan

    encoder = load_model(ROOT / "data/snapshots/minilm").model.encoder.to("cuda").eval()
    apply_layer_plan(encoder, resolve_plan([[2, 4, 2]], len(physical_layers(encoder))))
    ids = torch.randint(1000, 2000, (4, 64), device="cuda")
    mask = torch.ones_like(ids)

    def forward_backward():
        out = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        out.pow(2).mean().backward()
        grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        encoder.zero_grad(set_to_none=True)
        return out.detach(), grads

    eager_out, eager = forward_backward()
    for layer in physical_layers(encoder):
        layer.compile()
    compiled_out, compiled = forward_backward()
    compiled_layers = sum(1 for layer in physical_layers(encoder) if "_compiled_call_impl" in layer.__dict__)
    return {"visits": 8, "compiled_modules": compiled_layers,
            "max_output_diff": float((compiled_out - eager_out).abs().max()),
            "max_grad_diff": max(float((compiled[n] - eager[n]).abs().max()) for n in eager)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps per run (x8 forward passes)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_check.json"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible to torch; nothing to check", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    ensure_inputs()
    rows = [run(mode, args.steps) for mode in ("eager", "compile-auto")]
    print(f"\n{'mode':<14}{'compiled':>9}{'s/step':>9}{'dec/s':>9}{'graphs':>8}{'recompiles':>11}"
          f"{'warmup s':>10}{'peak GB':>9}{'acc base':>10}{'acc tuned':>10}")  # fmt: skip
    for r in rows:
        c = r["compile"]
        print(f"{r['mode']:<14}{'yes' if c.get('enabled') else 'no':>9}{r['s_per_step']:>9.3f}"
              f"{r['decisions_per_second']:>9.0f}{c.get('graphs_compiled', 0):>8}{c.get('recompiles_after_warmup', 0):>11}"
              f"{c.get('warmup_seconds', 0.0):>10.1f}{r['peak_memory_gb']:>9.2f}{r['accuracy_base']:>10.4f}"
              f"{r['accuracy_tuned']:>10.4f}")  # fmt: skip
    for r in rows:
        print(f"{r['mode']}: {r['compile'].get('reason')}; fallback: {r['compile'].get('fallback_error')}")
    speedup = rows[0]["s_per_step"] / rows[1]["s_per_step"]
    print(f"\ncompiled / eager speed: {speedup:.2f}x")
    merge = export_memory_check()
    growth = merge["allocated_after_mb"] - merge["allocated_before_mb"]
    print(f"export merge: device memory {merge['allocated_before_mb']:.1f} -> {merge['allocated_after_mb']:.1f} MB "
          f"(growth {growth:+.1f} MB, peak {merge['peak_during_merge_mb']:.1f} MB), merged copy on "
          f"{merge['merged_on']}, training model keeps its adapters: {merge['adapters_kept']}")  # fmt: skip
    plan = layer_plan_compile_check()
    print(f"layer plan [[2, 4, 2]] compiled: {plan['visits']} visits on {plan['compiled_modules']} compiled layers, "
          f"max |output diff| {plan['max_output_diff']:.2e}, max |grad diff| {plan['max_grad_diff']:.2e} vs eager")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"runs": rows, "compile_speedup": speedup, "export_merge": merge, "layer_plan": plan}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
