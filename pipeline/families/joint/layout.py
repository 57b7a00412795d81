"""Decoder decision models on disk and at inference: load a folder, export one crash-safe, answer requests.

The second model family's layout (the encoder family's is `pipeline.families.laya.layout`):

    decision_config.json  family "decoder", max_len, head {width, heads, layers, chunk}, temperature {global,
                          by_type [choice, score, noul], folded_global}, fine_tuned, training
    backbone/             the causal LM, LoRA merged, in 16 bits (bf16 from a bf16 or 4-bit source, else fp16)
                          with its tokenizer
    head.safetensors      the JointHead in fp32, written last: a folder without it is never listed or loaded
    manifest.json         lineage, as the encoder export's

A plain Hugging Face causal LM folder loads too, with a fresh seeded head (the start of a fine-tune).

    loaded = load_decoder("models/qwen3-0.6b", max_len=2048)
    export_decoder(loaded, "models/decision-qwen3", {"global": 1.3, "by_type": [1.0, 1.1, 0.9]}, manifest)
    served = load_decoder("models/decision-qwen3")
    results = answer_decoder_requests(served, [parse_request(state, questions)])
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.data.answers import ParsedRequest, shape_answers
from pipeline.scoring.calibration import softmax
from pipeline.families.joint.head import DecoderDecisionModel, JointHead, load_backbone, output_embeddings
from pipeline.families.laya.export import (
    MANIFEST,
    ExportResult,
    _already_exported,
    _cpu_clone,
    _fsync_file,
    _fsync_tree,
    check_finite,
    cpu_copy,
    merge_lora_layers,
    write_staged,
)
from pipeline.families.laya.forward import length_batches
from pipeline.families.laya.layout import ModelLayoutError
from pipeline.families.laya.predict import Answered, BadQuestion
from pipeline.families.joint.records import EncodedRecord, RecordTooLong, collate_records, encode_record

DECODER_CONFIG = "decision_config.json"
HEAD_FILE = "head.safetensors"
BACKBONE_DIR = "backbone"
HEAD_DEFAULTS = {"heads": 4, "layers": 2, "chunk": 2048}


class DecoderExportError(ValueError):
    """The model cannot be written as a decoder export (bad temperatures, adapters that cannot be merged)."""


@dataclass
class LoadedDecoder:
    """A decoder decision model with its tokenizer and decision config."""

    model: DecoderDecisionModel
    tokenizer: Any
    config: dict[str, Any]

    @property
    def max_len(self) -> int:
        return int(self.config["max_len"])


def is_decoder_folder(path: str | Path) -> bool:
    """A complete decoder export: its head (written last) and its decision config are there."""
    path = Path(path)
    return (path / HEAD_FILE).is_file() and (path / DECODER_CONFIG).is_file()


def is_causal_lm_folder(path: str | Path) -> bool:
    """A plain Hugging Face causal LM checkpoint (config.json naming a `...ForCausalLM` architecture)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    return any(str(name).endswith("ForCausalLM") for name in architectures)


def load_decoder(path: str | Path, max_len: int = 1024, head_width: int = 256, seed: int = 0,
                 dtype: torch.dtype = torch.float32, quantization: Any | None = None,
                 device: str = "cpu") -> LoadedDecoder:  # fmt: skip
    """A decoder export, or a plain causal LM with a fresh head seeded by `seed`; the backbone in `dtype`.

    `max_len` and `head_width` apply to a plain LM only (an export carries its own). The head is fp32 always.
    `quantization` (a transformers quantization config, e.g. 4-bit `BitsAndBytesConfig` for QLoRA) loads the
    backbone quantised, computing in the config's compute dtype. The folder is only read.
    """
    path = Path(path)
    if is_decoder_folder(path):
        return _load_export(path, _load_lm(path / BACKBONE_DIR, dtype, quantization, device))
    if is_causal_lm_folder(path):
        return _load_plain_lm(path, _load_lm(path, dtype, quantization, device), max_len, head_width, seed)
    raise ModelLayoutError(
        f"{path}: not a decoder decision model (no {HEAD_FILE} and {DECODER_CONFIG}; an unfinished export?) "
        "nor a causal LM folder (config.json with a ...ForCausalLM architecture)"
    )


def _load_lm(folder: Path, dtype: torch.dtype, quantization: Any | None, device: str) -> nn.Module:
    if quantization is None:
        return load_backbone(folder, dtype)
    from transformers import AutoModelForCausalLM

    compute = getattr(quantization, "bnb_4bit_compute_dtype", None) or dtype
    lm = AutoModelForCausalLM.from_pretrained(
        str(folder),
        dtype=compute,
        quantization_config=quantization,
        local_files_only=True,
        device_map={"": device},  # bitsandbytes quantises as the weights land on their device
    )
    return lm.eval()


def _load_export(path: Path, lm: nn.Module) -> LoadedDecoder:
    from safetensors.torch import load_file

    config = json.loads((path / DECODER_CONFIG).read_text(encoding="utf-8"))
    head = _build_head(lm, config["head"])
    head.load_state_dict(load_file(str(path / HEAD_FILE)), strict=True)
    return _assemble(lm, head, path / BACKBONE_DIR, config)


def _load_plain_lm(path: Path, lm: nn.Module, max_len: int, head_width: int, seed: int) -> LoadedDecoder:
    head_config = {"width": head_width, **HEAD_DEFAULTS}
    with torch.random.fork_rng(devices=[]):  # seeded without moving the caller's random state
        torch.manual_seed(seed)
        head = _build_head(lm, head_config)
    config = {
        "family": "decoder",
        "max_len": max_len,
        "head": head_config,
        "temperature": {"global": 1.0, "by_type": [1.0, 1.0, 1.0]},
        "fine_tuned": False,
        "training": {"base": path.name, "head_seed": seed},
    }
    return _assemble(lm, head, path, config)


def _build_head(lm: nn.Module, head: dict[str, Any]) -> JointHead:
    hidden = output_embeddings(lm).weight.shape[1]
    return JointHead(hidden, head["width"], head["heads"], head["layers"], head["chunk"])


def _assemble(lm: nn.Module, head: JointHead, tokenizer_dir: Path, config: dict[str, Any]) -> LoadedDecoder:
    model = DecoderDecisionModel(lm, head.float()).eval()
    return LoadedDecoder(model, _load_tokenizer(tokenizer_dir), config)


def _load_tokenizer(folder: Path):
    """The LM's tokenizer; one without a pad token pads with its eos token (padding is masked anyway)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLayoutError(f"{folder}: the tokenizer has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def export_decoder(loaded: LoadedDecoder, out: str | Path, temperatures: dict[str, Any],
                   manifest: dict[str, Any]) -> ExportResult:  # fmt: skip
    """Merge, check and write `loaded` to `out` crash-safe; a no-op when `out` already holds this export.

    `temperatures` is {"global": g, "by_type": [choice, score, noul]}. The global one is folded into the head
    (its last Linear divided by g, exact: the logit is linear in it); the per-type ones stay in the config.
    The training model is left as it is (adapters included); the merge happens on a CPU copy.
    """
    out = Path(out)
    config = _export_config(loaded, temperatures)
    manifest = {**manifest, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if _already_exported(out, config, manifest, DECODER_CONFIG, HEAD_FILE):
        return ExportResult(str(out), False, json.loads((out / MANIFEST).read_text()))
    dtype = _export_dtype(loaded.model.lm)
    lm, head = _merged_parts(loaded.model)
    _fold_temperature(head, float(temperatures["global"]))
    lm.to(dtype)
    check_finite(lm.state_dict(), dtype)
    check_finite(head.state_dict(), torch.float32)
    write_staged(out, lambda staging: _write_layout(lm, head, loaded.tokenizer, config, manifest, staging))
    return ExportResult(str(out), True, manifest)


def _export_config(loaded: LoadedDecoder, temperatures: dict[str, Any]) -> dict[str, Any]:
    global_t, by_type = _checked_temperatures(temperatures)
    already_folded = float((loaded.config.get("temperature") or {}).get("folded_global", 1.0))
    return {
        **loaded.config,
        "family": "decoder",
        "max_len": loaded.max_len,
        "head": _head_config(loaded.model.head, loaded.config.get("head") or {}),
        "temperature": {"global": 1.0, "by_type": by_type, "folded_global": already_folded * global_t},
        "fine_tuned": bool(loaded.config.get("fine_tuned")) or _has_lora(loaded.model.lm),
    }


def _checked_temperatures(temperatures: dict[str, Any]) -> tuple[float, list[float]]:
    """(global, by_type), or DecoderExportError naming every bad entry."""
    global_t, by_type = temperatures.get("global"), temperatures.get("by_type")
    problems = []
    if not _positive(global_t):
        problems.append(f"temperatures.global must be a positive finite number, got {global_t!r}")
    if not isinstance(by_type, (list, tuple)) or len(by_type) != 3:
        problems.append(
            f"temperatures.by_type must list 3 temperatures (choice, score, noul), got {by_type!r}"
        )
    else:
        problems += [f"temperatures.by_type[{i}] must be positive and finite, got {t!r}"
                     for i, t in enumerate(by_type) if not _positive(t)]  # fmt: skip
    if problems:
        raise DecoderExportError("; ".join(problems))
    return float(global_t), [float(t) for t in by_type]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _head_config(head: JointHead, known: dict[str, Any]) -> dict[str, int]:
    """The head's shape read from the head itself (a head without blocks keeps the configured heads)."""
    heads = head.blocks[0].self_attn.num_heads if len(head.blocks) else known.get("heads", 4)
    return {"width": head.memory_proj.out_features, "heads": heads, "layers": len(head.blocks),
            "chunk": head.chunk}  # fmt: skip


def _has_lora(lm: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in lm.modules())


def _export_dtype(lm: nn.Module) -> torch.dtype:
    """bf16 where the source is bf16 or quantised (fp16 could overflow what bf16 held), else fp16."""
    if any(_is_quantised(p) for p in lm.parameters()):
        return torch.bfloat16
    return torch.bfloat16 if output_embeddings(lm).weight.dtype == torch.bfloat16 else torch.float16


def _merged_parts(model: DecoderDecisionModel) -> tuple[nn.Module, JointHead]:
    """A fp32 CPU copy's LM (LoRA merged, peft wrapper and quantised layers gone) and head."""
    copied = _cpu_copy_dequantised(model).float()
    try:
        lm = _merged_lm(copied.lm)
    except (ValueError, RuntimeError, NotImplementedError) as error:
        raise DecoderExportError(f"cannot merge the adapters into the backbone: {error}") from error
    leftovers = [name or "the LM" for name, m in lm.named_modules()
                 if _is_bnb_module(m) or type(m).__module__.startswith("peft.")]  # fmt: skip
    if leftovers:
        raise DecoderExportError(f"modules left unmerged after the merge: {', '.join(leftovers[:8])}")
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


def _is_quantised(tensor: torch.Tensor) -> bool:
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
    return cpu_copy(model, lambda t: dense[id(t)] if id(t) in dense else _cpu_clone(t))


@torch.no_grad()
def _dense_weight(linear: nn.Module) -> nn.Parameter:
    """A 4-bit bitsandbytes Linear's weight as its own forward computes with it, fp32 on the CPU.

    Read by passing the identity through a bias-less view of the layer: whatever layout bitsandbytes keeps
    the weight in (on the CPU it repacks it at the first inference pass, a layout `dequantize_4bit` and
    peft's dequantiser misread), the product is the dense weight, exactly.
    """
    if type(linear.weight).__name__ != "Params4bit":
        raise DecoderExportError(
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
            raise DecoderExportError(f"{name}: DoRA over a quantised layer cannot be merged here")
        base = module.get_base_layer()
        for adapter in module.active_adapters:
            base.weight.data += module.get_delta_weight(adapter).to(base.weight.dtype)
        _set_module(lm, name, base)


def _replace_quantised_linears(lm: nn.Module) -> None:
    """Each bitsandbytes Linear (its weight already dequantised by the copy) becomes a plain nn.Linear."""
    for name, module in list(lm.named_modules()):
        if not (_is_bnb_module(module) and isinstance(module, nn.Linear)):
            continue
        linear = nn.Linear(module.in_features, module.out_features, module.bias is not None, device="meta")
        linear.weight = nn.Parameter(module.weight.data.reshape(module.out_features, module.in_features))
        if module.bias is not None:
            linear.bias = nn.Parameter(module.bias.data)
        _set_module(lm, name, linear.requires_grad_(False))


def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def _fold_temperature(head: JointHead, temperature: float) -> None:
    """Divide the head's logits by `temperature` for good: its last Linear's weight and bias, exactly."""
    final = head.scorer[-1]
    with torch.no_grad():
        final.weight.div_(temperature)
        final.bias.div_(temperature)


def _write_layout(lm, head, tokenizer, config, manifest, folder: Path) -> None:
    from safetensors.torch import save_file

    lm.save_pretrained(str(folder / BACKBONE_DIR))
    tokenizer.save_pretrained(str(folder / BACKBONE_DIR))
    (folder / DECODER_CONFIG).write_text(json.dumps(config, indent=2))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    _fsync_tree(folder)
    partial = folder / (HEAD_FILE + ".partial")
    save_file({k: v.detach().float().contiguous() for k, v in head.state_dict().items()}, str(partial))
    _fsync_file(partial)
    partial.replace(folder / HEAD_FILE)  # last: only now is the staging folder a model


def temperature_of(config: dict[str, Any], qtype: int) -> float:
    """The temperature a question type's softmax uses: its own times the (unfolded) global one."""
    temperature = config.get("temperature") or {}
    by_type = temperature.get("by_type") or [1.0, 1.0, 1.0]
    return float(by_type[qtype]) * float(temperature.get("global", 1.0))


def answer_decoder_requests(loaded: LoadedDecoder, requests: list[ParsedRequest],
                            batch_size: int = 8) -> list[Answered | BadQuestion]:  # fmt: skip
    """Answer parsed requests, one record each, in shared forward passes; a record too long fails alone."""
    encoded = [_encode(loaded, request) for request in requests]
    records = [record for record in encoded if isinstance(record, EncodedRecord)]
    probabilities = iter(record_probabilities(loaded, records, batch_size))
    results: list[Answered | BadQuestion] = []
    for request, record in zip(requests, encoded):
        if isinstance(record, BadQuestion):
            results.append(record)
            continue
        by_id = dict(zip(record.question_ids, next(probabilities)))
        results.append(Answered(shape_answers(request.questions, by_id, request.legends), len(record)))
    return results


def _encode(loaded: LoadedDecoder, request: ParsedRequest) -> EncodedRecord | BadQuestion:
    questions = list(request.questions.values())
    try:
        return encode_record(loaded.tokenizer, request.state, questions, loaded.max_len)
    except RecordTooLong as error:
        return BadQuestion(f"questions: {error}")


@torch.inference_mode()
def record_probabilities(loaded: LoadedDecoder, records: list[EncodedRecord],
                         batch_size: int = 8) -> list[list[np.ndarray]]:  # fmt: skip
    """Per record, per question: the softmax over its own options (model order) at its temperature.

    Records are grouped by length, so a pass pads little; padding is masked, so a record's answer does not
    depend on what it was batched with (beyond float rounding).
    """
    model = loaded.model.eval()
    device = next(model.parameters()).device
    out: list[list[np.ndarray]] = [[] for _ in records]
    for indices in length_batches([len(r) for r in records], batch_size):
        batch = collate_records([records[i] for i in indices], loaded.tokenizer.pad_token_id)
        logits = model({k: v.to(device) for k, v in batch.items()}).float().cpu().numpy().astype(np.float64)
        for row, index in enumerate(indices):
            record = records[index]
            out[index] = [
                softmax(logits[row, q, : len(spans)], temperature_of(loaded.config, qtype))
                for q, (spans, qtype) in enumerate(zip(record.option_spans, record.qtypes))
            ]
    return out


def load_decision_model(folder: str | Path):
    """A servable model of either family: a decoder export, or a Laya-layout folder."""
    from pipeline.families.laya.layout import load_model

    return load_decoder(folder) if is_decoder_folder(folder) else load_model(folder)
