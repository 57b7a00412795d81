"""The GPU check's training rows: each family in fp32 and bf16, eager and compiled per layer; QLoRA; the
data-parallel launcher with one rank. Every run goes through the trainer's own loop
(`pipeline.training.loop.train`) after the family's own preparation, as `pipeline.training.fit` runs it.

A compiled run is forced by `DECISION_COMPILE=1` (the auto rule compiles only CUDA runs of 4,000 forward
passes or more) and must show it in the run's compile report: enabled, graphs compiled, no fallback to eager,
no recompile after the warm-up. Parity is measured against the fp32 eager run of the same seed and data,
dropout off (its masks depend on the padded shape, which compiling changes): the gradients the loop computed
for its first step (captured at the optimizer's step) and the losses of every step.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from pipeline.config import TrainConfig
from pipeline.families import pick_family
from pipeline.families.joint.merge import is_quantised
from pipeline.training.compile import ENV_VAR, CompileConfig
from pipeline.training.controls import RunControls, RunHooks
from pipeline.training.launch import launch_ranks
from pipeline.training.loop import TrainResult, train
from scripts.gpu_check_setup import Outcome, Setup, Sizes, judged
from tests.tiny import without_dropout

MODES = (("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True))
"""(precision, compiled) of each training run; the first is the reference."""
COMPILED_GRADIENTS = 1e-3
"""Largest relative difference of the first step's gradients, compiled fp32 against eager fp32."""
COMPILED_LOSS = 1e-3
"""... and of each step's loss (the runs take the same steps, so the losses stay together)."""
RANKED_LOSS = 1e-3
"""Largest relative difference of each step's loss, one torchrun rank against this process (the same run)."""
BF16_GRADIENTS = 0.1
"""Largest relative difference of the first step's gradients in bf16 against fp32 (bf16 keeps 8 bits)."""
BF16_LOSS = 0.02
"""... and of the first step's loss."""


@dataclass
class Run:
    """One training run: the loop's result, the first step's gradients, peak GPU memory, wall time."""

    label: str
    result: TrainResult
    gradients: torch.Tensor
    peak_gib: float | None
    wall_seconds: float
    quantised_weights: int

    def losses(self) -> list[float]:
        return [loss for _step, loss in self.result.losses]

    def figures(self) -> dict[str, Any]:
        losses = self.losses()
        return {
            "precision": self.result.precision,
            "s_per_step": self.result.s_per_step,
            "steps": self.result.steps,
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "peak_gib": self.peak_gib,
            "wall_seconds": self.wall_seconds,
            "compile": self.result.compile,
        }


def training_config(sizes: Sizes, family: str, method: str = "lora") -> TrainConfig:
    """Fixed steps of `sizes` (more epochs where the rows are few), a loss every step, no checkpoints."""
    return TrainConfig(
        family=family,
        method=method,
        lora_r=sizes.lora_r,
        lora_alpha=2 * sizes.lora_r,
        micro_batch=sizes.micro_batch,
        grad_accum=sizes.grad_accum,
        max_steps=sizes.steps,
        min_steps=sizes.steps,
        log_every=1,
        precision="fp32",
        head_width=64,
        checkpoint_every_steps=0,
        checkpoint_every_minutes=0.0,
        dist_timeout_minutes=2.0,
    )


@contextmanager
def forced_compile(compiled: bool) -> Iterator[None]:
    """`DECISION_COMPILE` set to 1 or 0 inside, put back after."""
    was = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = "1" if compiled else "0"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(ENV_VAR)
        else:
            os.environ[ENV_VAR] = was


@contextmanager
def first_step_gradients() -> Iterator[list[torch.Tensor]]:
    """Inside, the gradients of the first optimizer step anywhere in the process land in the yielded list
    (flat, fp32, on the CPU, in the optimizer's parameter order)."""
    captured: list[torch.Tensor] = []

    def capture(optimizer, _args, _kwargs) -> None:
        if captured:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        captured.append(torch.cat([_flat(p.grad, p) for p in params]))

    handle = register_optimizer_step_pre_hook(capture)
    try:
        yield captured
    finally:
        handle.remove()


def _flat(grad: torch.Tensor | None, parameter: torch.Tensor) -> torch.Tensor:
    if grad is None:
        return torch.zeros(parameter.numel())
    return grad.detach().float().reshape(-1).cpu()


def train_run(setup: Setup, family_name: str, base: Path, config: TrainConfig, compiled: bool) -> Run:
    """Load, prepare and train as the fit chain does, compile forced on or off; the run's figures."""
    free_device(setup.device)
    family = pick_family(base, family_name)
    loaded = family.load(base, config, setup.device)
    examples, _skipped = family.build_examples(loaded, setup.records)
    torch.manual_seed(config.seed)
    family.prepare(loaded, config)
    family.learn_from_rows(loaded, examples)
    without_dropout(loaded.model)  # dropout masks depend on the padded shape, which compiling changes
    ready = family.training_examples(loaded, examples, config, setup.device)
    task = family.batch_task(loaded, config)
    quantised = sum(1 for p in loaded.model.parameters() if is_quantised(p))
    started = time.perf_counter()
    with forced_compile(compiled), first_step_gradients() as gradients:
        result = train(
            loaded.model,
            ready,
            config,
            setup.device,
            task,
            controls=RunControls(compile=CompileConfig(backend=setup.backend)),
        )
    peak = torch.cuda.max_memory_allocated(setup.device) / 2**30 if setup.device.type == "cuda" else None
    label = f"{config.precision} {'compiled' if compiled else 'eager'}"
    return Run(label, result, gradients[0], peak, time.perf_counter() - started, quantised)


def free_device(device: torch.device) -> None:
    """Drop what earlier runs left (dynamo's graphs, cached GPU blocks) and restart the peak-memory count."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def relative(a: torch.Tensor | float, b: torch.Tensor | float) -> float:
    """|a - b| / |b| (vector norms for tensors)."""
    if isinstance(a, torch.Tensor):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))
    return abs(a - b) / max(abs(b), 1e-30)


def check_training(setup: Setup, family_name: str, base: Path) -> Outcome:
    """LoRA in fp32 and bf16, eager and compiled per layer: compile really happened, gradients and losses
    agree with fp32 eager, and s/step of each."""
    config = training_config(setup.sizes, family_name)
    runs = [train_run(setup, family_name, base, replace(config, precision=p), c) for p, c in MODES]
    reference, problems, numbers = runs[0], [], {}
    for run in runs:
        figures = numbers[run.label] = run.figures()
        figures["gradient_difference"] = relative(run.gradients, reference.gradients)
        figures["first_loss_difference"] = relative(run.losses()[0], reference.losses()[0])
        figures["loss_difference"] = max(map(relative, run.losses(), reference.losses()))
        problems += _run_problems(run, figures)
    speed = {run.label: reference.result.s_per_step / run.result.s_per_step for run in runs}
    numbers["speed_vs_fp32_eager"] = speed
    compiled = runs[1].result.compile
    summary = (
        f"fp32 eager {reference.result.s_per_step * 1e3:.1f} ms/step; speed x fp32 eager: "
        + ", ".join(f"{label} {x:.2f}" for label, x in list(speed.items())[1:])
        + f"; compiled ({setup.backend}): {compiled.get('graphs_compiled', 0)} graphs, warm-up "
        f"{compiled.get('warmup_seconds', 0.0):.1f} s; gradients vs fp32 eager: compiled "
        f"{numbers['fp32 compiled']['gradient_difference']:.1e}, bf16 "
        f"{numbers['bf16 eager']['gradient_difference']:.1e}"
    )
    return judged(problems, summary, numbers)


def _run_problems(run: Run, figures: dict[str, Any]) -> list[str]:
    problems = [] if all(map(math.isfinite, run.losses())) else [f"{run.label}: a loss is not finite"]
    if run.label.endswith("compiled"):
        problems += [f"{run.label}: {p}" for p in compile_problems(run.result.compile)]
    if run.label == "fp32 compiled":
        limits = {"gradient_difference": COMPILED_GRADIENTS, "loss_difference": COMPILED_LOSS}
    elif run.label.startswith("bf16"):
        limits = {"gradient_difference": BF16_GRADIENTS, "first_loss_difference": BF16_LOSS}
    else:
        limits = {}
    return problems + [
        f"{run.label}: {name} {figures[name]:.1e} > {limit:.0e}"
        for name, limit in limits.items()
        if not figures[name] <= limit
    ]


def compile_problems(report: dict[str, Any]) -> list[str]:
    """What a forced compile's report says went wrong (nothing when the layers ran compiled all along)."""
    if not report.get("enabled"):
        return [f"not compiled ({report.get('reason')}; fallback: {report.get('fallback_error')})"]
    problems = [] if report.get("graphs_compiled", 0) > 0 else ["compile on, but no graph was compiled"]
    if report.get("recompiles_after_warmup", 0):
        problems.append(f"{report['recompiles_after_warmup']} frames recompiled after the warm-up")
    if report.get("recompile_limit_hits", 0):
        problems.append(f"{report['recompile_limit_hits']} frames hit the recompile limit (ran eagerly)")
    return problems


def check_qlora(setup: Setup) -> Outcome:
    """The joint family on the causal LM in bf16: LoRA (fp32 weights under bf16 autocast) against QLoRA (nf4
    4-bit weights computing in bf16): both train, the backbone really is 4-bit, peak GPU memory of each."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return Outcome(
            "skipped",
            "bitsandbytes is not importable here (the lent GPU machine has none: carry its "
            "wheel, bash scripts/gpu_check.sh --fetch-wheels; the CPU dry run hides it)",
        )
    config = replace(training_config(setup.sizes, "joint"), precision="bf16")
    runs = [
        train_run(setup, "joint", setup.bases.causal_lm, replace(config, method=m), False)
        for m in ("lora", "qlora")
    ]
    lora, qlora = runs
    problems = [
        f"{m}: a loss is not finite"
        for m, r in zip(("lora", "qlora"), runs)
        if not all(map(math.isfinite, r.losses()))
    ]
    if not qlora.quantised_weights:
        problems.append("qlora: no 4-bit weight in the loaded backbone")
    memory = lora.peak_gib / qlora.peak_gib if lora.peak_gib and qlora.peak_gib else None
    numbers = {
        "lora": lora.figures(),
        "qlora": qlora.figures() | {"quantised_weights": qlora.quantised_weights},
        "peak_memory_lora_over_qlora": memory,
    }
    summary = (
        f"LoRA {lora.result.s_per_step * 1e3:.1f} ms/step, QLoRA {qlora.result.s_per_step * 1e3:.1f} ms/step "
        f"({qlora.quantised_weights} 4-bit weights)"
        + (f"; peak memory LoRA / QLoRA {memory:.2f}x" if memory else "")
    )
    return judged(problems, summary, numbers)


def check_data_parallel(setup: Setup) -> Outcome:
    """The same fp32 LoRA run in this process and on one torchrun rank started by the stage's own launcher
    (NCCL on CUDA, gloo on the CPU): equal losses, the launcher's cost, one all-reduce through the backend."""
    config = training_config(setup.sizes, "laya")
    started = time.perf_counter()
    alone = train_run(setup, "laya", setup.bases.laya, config, False)
    alone_wall = time.perf_counter() - started  # loading and preparing too, as a rank does
    spec, out = setup.work / "ranks.json", setup.work / "rank0.json"
    spec.write_text(
        json.dumps(
            {
                "base": str(setup.bases.laya),
                "config": asdict(config),
                "device": setup.device.type,
                "rows": len(setup.records),
                "state_chars": setup.sizes.state_chars,
                "out": str(out),
            }
        )
    )
    lines: list[str] = []
    started = time.perf_counter()
    with forced_compile(False):  # the ranks inherit the variable: eager, as the run in this process
        launch_ranks("scripts.gpu_check_ranks", spec, nproc=1, hooks=RunHooks(report=lines.append))
    wall = time.perf_counter() - started
    ranked = json.loads(out.read_text())
    expected = "nccl" if setup.device.type == "cuda" else "gloo"
    difference = max(map(relative, ranked["losses"], alone.losses()))
    problems = [
        f"{name}: {got!r}, expected {want!r}"
        for name, got, want in (
            ("backend", ranked["backend"], expected),
            ("world size", ranked["world_size"], 1),
            ("all-reduce of ones", ranked["all_reduce"], 1.0),
            ("steps", ranked["steps"], alone.result.steps),
        )
        if got != want
    ]
    if not difference <= RANKED_LOSS:
        problems.append(f"losses differ from this process's by {difference:.1e}")
    numbers = {
        "in_process": alone.figures() | {"wall_seconds": alone_wall},
        "torchrun": ranked,
        "launcher_wall_seconds": wall,
        "loss_difference": difference,
        "rank0_lines": lines[-5:],
    }
    ratio = ranked["s_per_step"] / alone.result.s_per_step
    summary = (
        f"torchrun, 1 rank ({ranked['backend']}): {ranked['s_per_step'] * 1e3:.1f} ms/step, {ratio:.2f}x "
        f"this process's; {wall:.1f} s from launch to exit against {alone_wall:.1f} s to load and train "
        f"here; losses within {difference:.1e}"
    )
    return judged(problems, summary, numbers)
