"""Device and precision choice, in one place: the device a run uses, the autocast dtype, the memory it peaked
at.

device = pick_device("auto")                    # cuda when available, else cpu
dtype = resolve_precision("auto", device)       # bf16 only where the device runs it natively
"""

from __future__ import annotations

import resource

import torch


def pick_device(name: str = "auto") -> torch.device:
    """cuda when available for "auto", else cpu; an explicit name is taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_problem(name: str) -> str | None:
    """Why `name` (a `--device` value) names no device this process can use, or None."""
    if name == "auto":
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return f"{name!r} is no device: use auto, cpu, cuda or cuda:N"
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"{name!r}: no CUDA device here (this torch {torch.__version__} sees none): use cpu or auto"
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        return f"{name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    if device.type not in ("cpu", "cuda"):
        return f"{name!r}: only cpu and cuda devices are supported"
    return None


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The backbone's autocast dtype (None for fp32)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    return torch.bfloat16 if has_native_bf16(device) else None


def has_native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 natively: a CUDA GPU with bf16 in hardware (compute capability 8.0 on; an
    older GPU only emulates it, far slower than fp32), a CPU with AVX-512 bf16 or AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return cpu_has_native_bf16()


class PrecisionUnavailable(ValueError):
    """A serving precision this device cannot run natively."""


def serving_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype `decision serve --precision` asks for: fp32 (None) or bf16, which is refused where
    the device only emulates it (FACTS: ~1 GFLOP/s there against ~120 in fp32), so it can never be a silent
    slowdown. `int8` and `auto` run torch at fp32 (None): the int8 encoder is another runtime's
    (`runtimes.precision`)."""
    if precision in ("fp32", "int8", "auto"):
        return None
    if precision != "bf16":
        raise PrecisionUnavailable(f"--precision {precision!r}: choose auto, fp32, bf16 or int8")
    if not has_native_bf16(device):
        raise PrecisionUnavailable(
            f"--precision bf16: {device.type} here has no native bf16 (no AVX-512 bf16 or AMX on a CPU), so "
            "it would be emulated and far slower than fp32; serve with --precision fp32"
        )
    return torch.bfloat16


def precision_name(dtype: torch.dtype | None) -> str:
    """ "fp32" for no autocast, else the dtype's short name ("bfloat16")."""
    return str(dtype or "fp32").replace("torch.", "")


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (AVX-512 bf16 or AMX); emulated bf16 is far slower."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def peak_memory_mb() -> float:
    """Peak resident memory of this process (or of the GPU when it used more), in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peak = max(peak, torch.cuda.max_memory_allocated() / 2**20)
    return round(peak, 1)
