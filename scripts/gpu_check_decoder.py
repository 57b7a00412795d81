"""GPU check, decoder section: LoRA (bf16 backbone) vs QLoRA (nf4 backbone) training steps on a ~0.5B config.

A random-initialised Qwen3 of about 0.5B parameters (nothing is downloaded) is saved once, then loaded twice:
in bf16 with LoRA, and in 4-bit nf4 (double quantisation, bf16 compute) with LoRA. Each trains the decision
head and the adapters for a few steps on fixed synthetic records. Prints s/step (median after the first),
tokens/s and peak GPU memory for each, and the LoRA / QLoRA memory ratio; writes JSON.

    python scripts/gpu_check_decoder.py              # on a CUDA machine (bash scripts/gpu_check.sh runs it)
    python scripts/gpu_check_decoder.py --tiny --device cpu   # the same code path on a tiny config, anywhere
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HALF_B = {"vocab_size": 151_936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 24,
          "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64}  # fmt: skip
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def write_random_lm(folder: Path, sizes: dict) -> int:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**sizes, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def synthetic_batch(vocab: int, rows: int, length: int, device: str) -> dict[str, torch.Tensor]:
    """Records of `length` tokens with 4 questions of 3 options each (spans laid out after the state)."""
    gen = torch.Generator().manual_seed(0)
    q, k = 4, 3
    batch = {"input_ids": torch.randint(10, vocab, (rows, length), generator=gen),
             "attention_mask": torch.ones(rows, length, dtype=torch.long),
             "question_spans": torch.zeros(rows, q, 2, dtype=torch.long), "question_mask": torch.ones(rows, q, dtype=torch.bool),
             "option_spans": torch.zeros(rows, q, k, 2, dtype=torch.long), "option_mask": torch.ones(rows, q, k, dtype=torch.bool),
             "option_tokens": torch.randint(10, vocab, (rows, q, k, 2), generator=gen),
             "option_token_mask": torch.ones(rows, q, k, 2, dtype=torch.bool),
             "qtype": torch.tensor([0, 1, 2, 0]).repeat(rows, 1)}  # fmt: skip
    start = length - q * (4 + 2 * k)
    for i in range(q):
        base = start + i * (4 + 2 * k)
        batch["question_spans"][:, i] = torch.tensor([base, base + 4])
        for j in range(k):
            batch["option_spans"][:, i, j] = torch.tensor([base + 4 + 2 * j, base + 6 + 2 * j])
    target = torch.zeros(rows, q, k)
    target[..., 0] = 1.0
    return {key: value.to(device) for key, value in (batch | {"target": target}).items()}


def run(method: str, folder: Path, batch: dict, steps: int, device: str) -> dict:
    from pipeline.config import TrainConfig
    from pipeline.families.joint.backbone import qlora_config
    from pipeline.families.joint.layout import load_joint
    from pipeline.families.joint.training import prepare_joint, summed_loss

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    quantization = qlora_config(torch.device(device)) if method == "qlora" else None
    loaded = load_joint(folder, dtype=torch.bfloat16, quantization=quantization, device=device)
    if method != "qlora":
        loaded.model.to(device)
    loaded.model.head.to(device)
    prepare_joint(loaded.model, TrainConfig(method=method, lora_r=16, lora_alpha=32))
    model = loaded.model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times, losses = [], []
    for _ in range(steps):
        started = time.perf_counter()
        loss = summed_loss(model, batch, torch.bfloat16)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        losses.append(loss.item())
    s_per_step = statistics.median(times[1:] or times)
    tokens = batch["input_ids"].numel()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    del model, loaded, optimizer
    return {"method": method, "s_per_step": s_per_step, "tokens_per_s": tokens / s_per_step, "peak_gb": peak,
            "first_loss": losses[0], "last_loss": losses[-1]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny config (checks the code path, no GPU needed)"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_check_decoder.json"))
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check_decoder: no CUDA device visible to torch; nothing to check", file=sys.stderr)
        return 2
    sizes = TINY if args.tiny else HALF_B
    with tempfile.TemporaryDirectory() as tmp:
        parameters = write_random_lm(Path(tmp), sizes)
        print(f"random Qwen3, {parameters / 1e6:.0f}M parameters, {args.rows} x {args.length} tokens per step",
              flush=True)  # fmt: skip
        batch = synthetic_batch(sizes["vocab_size"], args.rows, min(args.length, 1024 if not args.tiny else 128),
                                args.device)  # fmt: skip
        rows = [run(method, Path(tmp), batch, args.steps, args.device) for method in ("lora", "qlora")]
    print(f"\n{'method':<8}{'s/step':>9}{'tokens/s':>11}{'peak GB':>9}{'loss first':>12}{'loss last':>11}")
    for r in rows:
        print(f"{r['method']:<8}{r['s_per_step']:>9.3f}{r['tokens_per_s']:>11.0f}{r['peak_gb']:>9.2f}"
              f"{r['first_loss']:>12.4f}{r['last_loss']:>11.4f}")  # fmt: skip
    ratio = (
        rows[0]["peak_gb"] / rows[1]["peak_gb"] if rows[1]["peak_gb"] == rows[1]["peak_gb"] else float("nan")
    )
    print(f"\npeak memory, bf16 LoRA / QLoRA: {ratio:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"parameters": parameters, "runs": rows, "lora_qlora_memory_ratio": ratio},
                                         indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
