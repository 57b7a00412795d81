"""Merging a trained joint model into dense weights: LoRA merged on a CPU copy, 4-bit (bitsandbytes) layers
dequantised exactly, nothing of peft or bitsandbytes left; the training model is never changed.

    backbone, head = merged_parts(loaded.model)
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from pipeline.families.exporting import cpu_clone, cpu_copy, merge_lora_layers, set_module
from pipeline.families.joint.head import JointDecisionModel, JointHead


class JointExportError(ValueError):
    """The model cannot be written as a joint export (bad temperatures, adapters that cannot be merged)."""


def merged_parts(model: JointDecisionModel) -> tuple[nn.Module, JointHead]:
    """A fp32 CPU copy's LM (LoRA merged, peft wrapper and quantised layers gone) and head."""
    copied = _cpu_copy_dequantised(model).float()
    try:
        lm = _merged_lm(copied.lm)
    except (ValueError, RuntimeError, NotImplementedError) as error:
        raise JointExportError(f"cannot merge the adapters into the backbone: {error}") from error
    leftovers = [
        name or "the LM"
        for name, m in lm.named_modules()
        if _is_bnb_module(m) or type(m).__module__.startswith("peft.")
    ]
    if leftovers:
        raise JointExportError(f"modules left unmerged after the merge: {', '.join(leftovers[:8])}")
    return lm, copied.head


def _merged_lm(lm: nn.Module) -> nn.Module:
    from peft import PeftModel

    _merge_lora_over_quantised(lm)
    lm = lm.merge_and_unload() if isinstance(lm, PeftModel) else merge_lora_layers(lm)
    _replace_quantised_linears(lm)
    quantizer = getattr(lm, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense now: they must be cast and saved as such
        quantizer.remove_quantization_config(lm)
    return lm


def is_quantised(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ in ("Params4bit", "Int8Params")  # bitsandbytes' 4-bit and 8-bit weights


def _is_bnb_module(module: nn.Module) -> bool:
    return type(module).__module__.split(".")[0] == "bitsandbytes"


def _cpu_copy_dequantised(model: nn.Module) -> nn.Module:
    """A CPU copy of `model` whose bitsandbytes Linears hold dense weights (`model` itself is not changed)."""
    dense = {
        id(m.weight): _dense_weight(m)
        for m in model.modules()
        if _is_bnb_module(m) and isinstance(m, nn.Linear)
    }
    return cpu_copy(model, lambda t: dense[id(t)] if id(t) in dense else cpu_clone(t))


@torch.no_grad()
def _dense_weight(linear: nn.Module) -> nn.Parameter:
    """A 4-bit bitsandbytes Linear's weight as its own forward computes with it, fp32 on the CPU.

    Read by passing the identity through a bias-less view of the layer: whatever layout bitsandbytes keeps
    the weight in (on the CPU it repacks it at the first inference pass, a layout `dequantize_4bit` and
    peft's dequantiser misread), the product is the dense weight, exactly.
    """
    if type(linear.weight).__name__ != "Params4bit":
        raise JointExportError(
            f"{type(linear).__name__}: only a 4-bit bitsandbytes base can be merged into a 16-bit export"
        )
    probe = copy.copy(linear)  # shares the weight; its own parameter dict and mode, so the layer is untouched
    probe._parameters = {**linear._parameters, "bias": None}
    dtype = linear.compute_dtype or linear.weight.quant_state.dtype
    eye = torch.eye(linear.in_features, dtype=dtype, device=linear.weight.device)
    # The class's forward, not the instance's: a hook (accelerate's) may have bound one to the layer itself.
    transposed = type(linear).forward(probe.train(False), eye)  # [in, out]: row i is the weight's column i
    return nn.Parameter(transposed.t().to("cpu", torch.float32).contiguous(), requires_grad=False)


def _merge_lora_over_quantised(lm: nn.Module) -> None:
    """LoRA layers over (now dequantised) bitsandbytes layers, merged by their delta and replaced by the base.

    Their own merge() would re-quantise the sum, adding 4-bit error to the adapter's update.
    """
    from peft.tuners.lora import LoraLayer

    for name, module in list(lm.named_modules()):
        if not (isinstance(module, LoraLayer) and _is_bnb_module(module.get_base_layer())):
            continue
        if any(module.use_dora.get(a) for a in module.active_adapters):
            raise JointExportError(f"{name}: DoRA over a quantised layer cannot be merged here")
        base = module.get_base_layer()
        for adapter in module.active_adapters:
            base.weight.data += module.get_delta_weight(adapter).to(base.weight.dtype)
        set_module(lm, name, base)


def _replace_quantised_linears(lm: nn.Module) -> None:
    """Each bitsandbytes Linear (its weight already dequantised by the copy) becomes a plain nn.Linear."""
    for name, module in list(lm.named_modules()):
        if not (_is_bnb_module(module) and isinstance(module, nn.Linear)):
            continue
        linear = nn.Linear(module.in_features, module.out_features, module.bias is not None, device="meta")
        linear.weight = nn.Parameter(module.weight.data.reshape(module.out_features, module.in_features))
        if module.bias is not None:
            linear.bias = nn.Parameter(module.bias.data)
        set_module(lm, name, linear.requires_grad_(False))
