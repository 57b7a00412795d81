"""The GPU check's rows beside training: the device's facts, a layer plan under per-layer compile, the export
merge, the packed serving pass in fp32 and bf16, and the `gpu`-marked tests. Each returns an `Outcome`.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.device import has_native_bf16, precision_name, resolve_precision
from pipeline.families import pick_family
from pipeline.families.exporting import has_peft_modules, merged_copy
from pipeline.families.laya.adapters import apply_lora, has_lora
from pipeline.families.laya.forward import decision_logits
from pipeline.families.laya.items import collate
from pipeline.families.laya.packed import packs
from pipeline.families.laya.predict import calibrated_probabilities, packed_item_logits, padded_item_logits
from pipeline.families.laya_layout import load_model
from pipeline.families.planned_layers import apply_layer_plan, layer_count, physical_layers
from pipeline.layer_plans import resolve_plan
from pipeline.training.compile import CompileConfig, compiled_encoder, pad_to_bucket
from scripts.gpu_check_setup import Outcome, Setup, judged
from scripts.gpu_check_train import compile_problems, free_device, relative

ROOT = Path(__file__).resolve().parents[1]
GPU_TESTS = ("tests/model/test_gpu.py",)
"""The test files holding `gpu`-marked tests (only these are collected: the rest import what the GPU machine
lacks)."""
PLAN_OUTPUT, PLAN_GRADIENTS = 1e-4, 1e-3
"""Largest relative differences, compiled against eager under a layer plan (fp32)."""
PACKED_FP32 = 1e-4
"""Largest probability difference of the packed fp32 pass against the padded pass."""
PACKED_BF16, BF16_AGREEMENT = 0.05, 0.95
"""Largest probability difference of the packed bf16 pass against packed fp32, and the least argmax
agreement."""
MERGED = 1e-4
"""Largest relative difference of the merged copy's logits against the model with its adapters."""
TESTS_LEAST = 30.0
"""The gpu_tests row starts only with this many seconds of the budget left (pytest alone takes ~5 s to
start)."""


def check_device(setup: Setup) -> Outcome:
    """What torch sees; native bf16 is the hardware's (capability 8.0 on), and the auto precision follows
    it."""
    device, problems = setup.device, []
    native = has_native_bf16(device)
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device.type,
        "native_bf16": native,
        "auto_precision": precision_name(resolve_precision("auto", device)),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "bf16_with_emulation": torch.cuda.is_bf16_supported(including_emulation=True),
            "nccl": dist.is_nccl_available(),
        }
        if native != (props.major >= 8):
            problems.append(f"native bf16 {native} on compute capability {facts['capability']}")
        what = f"{props.name}, capability {facts['capability']}, {facts['memory_gib']:.0f} GiB"
    else:
        what = f"CPU ({platform.machine()}, torch threads: {torch.get_num_threads()})"
    if facts["auto_precision"] != ("bfloat16" if native else "fp32"):
        problems.append(f"auto precision {facts['auto_precision']} with native bf16 {native}")
    summary = (
        f"{what}; torch {torch.__version__}, CUDA {torch.version.cuda}; native bf16 "
        f"{'yes' if native else 'no'}, auto precision {facts['auto_precision']}"
    )
    return judged(problems, summary, facts)


def check_layer_plan(setup: Setup) -> Outcome:
    """The laya base's encoder under a plan that visits every layer twice, compiled per layer by the trainer's own
    context: each physical layer is one compiled module, and outputs and summed gradients match eager."""
    free_device(setup.device)
    # Train mode, as the trainer runs the layers: the bases have no dropout, so both passes see the same
    # numbers.
    encoder = load_model(setup.bases.laya).model.encoder.to(setup.device).train()
    layers = layer_count(encoder)
    plan = resolve_plan([[0, layers, 2]], layers)
    apply_layer_plan(encoder, plan)
    config = CompileConfig(backend=setup.backend)
    batch = pad_to_bucket(_token_batch(4, 40, setup.device), 0, config)
    loss_fn = lambda model, batch: _hidden(model, batch).pow(2).mean()  # noqa: E731
    eager_out, eager_grads = _forward_backward(encoder, batch)
    with compiled_encoder(
        encoder, config, True, "gpu check", [batch], loss_fn, 0, backbone=encoder
    ) as report:
        modules = sum(1 for layer in physical_layers(encoder) if "_compiled_call_impl" in layer.__dict__)
        out, grads = _forward_backward(encoder, batch)
    report_dict = vars(report).copy()
    numbers = {
        "layers": layers,
        "visits": len(plan.visits),
        "compiled_modules": modules,
        "compile": report_dict,
        "output_difference": relative(out, eager_out),
        "gradient_difference": relative(grads, eager_grads),
    }
    problems = compile_problems(report_dict)
    if modules != layers:
        problems.append(f"{modules} compiled modules for {layers} physical layers")
    for name, limit in (("output_difference", PLAN_OUTPUT), ("gradient_difference", PLAN_GRADIENTS)):
        if not numbers[name] <= limit:
            problems.append(f"{name} {numbers[name]:.1e} > {limit:.0e}")
    summary = (
        f"{numbers['visits']} visits on {modules} compiled layers ({setup.backend}, graphs: "
        f"{report.graphs_compiled}); vs eager: outputs {numbers['output_difference']:.1e}, gradients "
        f"{numbers['gradient_difference']:.1e}"
    )
    return judged(problems, summary, numbers)


def _token_batch(rows: int, length: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Random tokens of the tiny vocabulary, each row a little shorter than the one before (masked
    padding)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 150, (rows, length), generator=generator)
    mask = (torch.arange(length)[None, :] < torch.arange(length, length - 3 * rows, -3)[:, None]).long()
    return {"input_ids": (ids * mask).to(device), "attention_mask": mask.to(device)}


def _hidden(encoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state


def _forward_backward(encoder, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The last hidden states and the gradients of their mean square, by parameter, flat."""
    encoder.zero_grad(set_to_none=True)
    out = _hidden(encoder, batch)
    out.pow(2).mean().backward()
    grads = torch.cat([p.grad.reshape(-1).float().cpu() for p in encoder.parameters() if p.grad is not None])
    encoder.zero_grad(set_to_none=True)
    return out.detach().float().cpu(), grads


def check_export_merge(setup: Setup) -> Outcome:
    """Merging LoRA for export copies to the CPU: the device's memory does not grow, the training model keeps
    its adapters, and the merged copy answers as the model with adapters does."""
    free_device(setup.device)
    family = pick_family(setup.bases.laya, "laya")
    loaded = family.load(setup.bases.laya)
    items, _ = family.build_examples(loaded, setup.records)
    torch.manual_seed(0)  # the adapters' A, as the fit chain seeds it
    apply_lora(loaded.model, setup.sizes.lora_r, 2 * setup.sizes.lora_r, 0.0, "all-linear")
    model = loaded.model.to(setup.device).eval()
    batch = {k: v.to(setup.device) for k, v in collate(items[:16], loaded.tokenizer.pad_token_id).items()}
    base = _logits(model, batch)
    # A fresh adapter's B is zero (the merge would change nothing): give it values, as training does.
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    adapted = _logits(model, batch)
    allocated = _allocated(setup.device)
    merged = merged_copy(model)
    growth, peak = _growth_since(setup.device, allocated)
    merged_logits = _logits(merged, {k: v.cpu() for k, v in batch.items()})
    numbers = {
        "merged_on": next(merged.parameters()).device.type,
        "adapters_kept": has_lora(model),
        "merged_has_adapters": has_peft_modules(merged),
        "device_memory_growth_mib": growth,
        "device_memory_peak_growth_mib": peak,
        "adapter_effect": relative(adapted, base),
        "merged_difference": relative(merged_logits, adapted),
    }
    problems = [
        f"{name} is {numbers[name]!r}, expected {want!r}"
        for name, want in (("merged_on", "cpu"), ("adapters_kept", True), ("merged_has_adapters", False))
        if numbers[name] != want
    ]
    if growth is not None and growth > 1.0:
        problems.append(f"device memory grew by {growth:.1f} MiB while merging")
    if not numbers["merged_difference"] <= MERGED:
        problems.append(f"merged logits differ by {numbers['merged_difference']:.1e}")
    summary = (
        f"merged copy on {numbers['merged_on']}, adapters kept; merged vs adapted logits "
        f"{numbers['merged_difference']:.1e} (adapters moved them by {numbers['adapter_effect']:.1e})"
        + (f"; device memory {growth:+.1f} MiB (peak {peak:+.1f} MiB)" if growth is not None else "")
    )
    return judged(problems, summary, numbers)


@torch.no_grad()
def _logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The option logits at real options only (masked options carry a constant)."""
    return decision_logits(model, batch)[batch["marker_mask"]].float().cpu()


def _allocated(device: torch.device) -> int:
    """GPU memory allocated now, the peak count restarted from here (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _growth_since(device: torch.device, allocated: int) -> tuple[float | None, float | None]:
    """MiB allocated beyond `allocated`, now and at the peak since (None, None off CUDA)."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    now, peak = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    return (now - allocated) / 2**20, (peak - allocated) / 2**20


def check_packed_forward(setup: Setup) -> Outcome:
    """The laya family's serving pass on packed tokens, fp32 and bf16, against the padded pass: probabilities,
    argmax agreement, and decisions per second (best of three after a warm-up)."""
    free_device(setup.device)
    family = pick_family(setup.bases.laya, "laya")
    loaded = family.load(setup.bases.laya, None, setup.device)
    loaded.model.eval().requires_grad_(False)
    if not packs(loaded.model):
        return Outcome("fail", "the laya base's model cannot run the packed pass (packs() is False)")
    items, _ = family.build_examples(loaded, setup.records)
    variants = {
        "padded fp32": lambda: padded_item_logits(loaded, items, 16),
        "packed fp32": lambda: packed_item_logits(loaded.model, items),
        "packed bf16": lambda: packed_item_logits(loaded.model, items, torch.bfloat16),
    }
    probabilities, rates = {}, {}
    for name, run in variants.items():
        probabilities[name] = calibrated_probabilities(loaded, items, run())
        rates[name] = len(items) / min(_seconds(run) for _ in range(3))
    fp32 = _largest(probabilities["packed fp32"], probabilities["padded fp32"])
    bf16 = _largest(probabilities["packed bf16"], probabilities["packed fp32"])
    agreement = float(
        np.mean(
            [
                np.argmax(a) == np.argmax(b)
                for a, b in zip(probabilities["packed bf16"], probabilities["packed fp32"])
            ]
        )
    )
    numbers = {
        "decisions": len(items),
        "decisions_per_second": rates,
        "packed_fp32_vs_padded": fp32,
        "packed_bf16_vs_fp32": bf16,
        "bf16_argmax_agreement": agreement,
        "native_bf16": has_native_bf16(setup.device),
    }
    problems = [
        f"{what} {value:.1e} > {limit:.0e}"
        for what, value, limit in (
            ("packed fp32 vs padded", fp32, PACKED_FP32),
            ("packed bf16 vs fp32", bf16, PACKED_BF16),
        )
        if not value <= limit
    ]
    if agreement < BF16_AGREEMENT:
        problems.append(f"bf16 argmax agreement {agreement:.1%} < {BF16_AGREEMENT:.0%}")
    base = rates["padded fp32"]
    summary = (
        f"{len(items)} decisions; probabilities: packed fp32 vs padded {fp32:.1e}, bf16 vs fp32 {bf16:.1e} "
        f"(argmax {agreement:.0%}); decisions/s x padded: packed fp32 {rates['packed fp32'] / base:.2f}, "
        f"bf16 {rates['packed bf16'] / base:.2f}"
        + ("" if numbers["native_bf16"] else " (bf16 emulated here)")
    )
    return judged(problems, summary, numbers)


def _seconds(run) -> float:
    started = time.perf_counter()
    run()  # every variant ends in .cpu(): the device has finished
    return time.perf_counter() - started


def _largest(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def check_gpu_tests(setup: Setup, timeout: float) -> Outcome:
    """`pytest -m gpu` on the GPU test files, the missing packages hidden and no plugin loaded but ours: pass
    when every test passed, skipped when every test skipped (no CUDA), fail otherwise."""
    if timeout < TESTS_LEAST:
        return Outcome(
            "skipped", f"{timeout:.0f} s of the check's budget left, less than {TESTS_LEAST:.0f} s"
        )
    report = setup.work / "gpu_tests.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        "-p",
        "scripts.gpu_check_absent",
        "-q",
        f"--junitxml={report}",
        *GPU_TESTS,
    ]
    environment = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return Outcome("fail", f"pytest -m gpu ran past {timeout:.0f} s")
    suite = ElementTree.parse(report).getroot() if report.exists() else None
    suite = suite.find("testsuite") if suite is not None and suite.tag == "testsuites" else suite
    if suite is None:
        return Outcome(
            "fail", f"pytest exit {done.returncode}, no report: {done.stdout[-500:]}{done.stderr[-500:]}"
        )
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    skips = sorted({s.get("message", "") for s in suite.iter("skipped")})
    numbers = counts | {"exit_code": done.returncode, "skip_reasons": skips, "tail": done.stdout[-1500:]}
    line = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failures", "errors", "skipped") if counts[k])
    if counts["failures"] or counts["errors"] or done.returncode not in (0, 5) or not counts["tests"]:
        return Outcome(
            "fail", f"pytest -m gpu: {line or 'nothing collected'} (exit {done.returncode})", numbers
        )
    if not counts["passed"]:
        return Outcome("skipped", f"pytest -m gpu: {line}: {'; '.join(skips)}", numbers)
    return Outcome("pass", f"pytest -m gpu: {line}", numbers)
