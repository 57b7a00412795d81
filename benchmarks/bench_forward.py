"""Forward-pass benchmark: where the laya family's serving time goes, without HTTP, and how close it is to the
limit.

On bench_serve.py's 5-question requests, grouped as the server groups them at concurrency 8 (8 requests per
batch), it runs, side by side in one process: the padded pass (length-grouped passes of 16, the training
forward), the packed pass in fp32 (what `decision serve` runs) and the packed pass under bf16 autocast
(`--precision bf16`). It prints requests/s per variant and the ratios to padded, each variant's calibrated
answers against the padded pass (largest probability difference, argmax agreement), the share of the packed
pass's time spent in matrix products (torch.profiler), and the GFLOP/s of a matrix product at each of the
encoder's own linear shapes: when the products already run at those rates, no fp32 change to the same FLOPs
can make the pass much faster.

The backend column: where the runtimes are installed (and on the CPU), the same padded passes of 16 also run
with the encoder exported to ONNX and run by ONNX Runtime (`decision serve --backend onnxruntime`, fp32) and
compiled by OpenVINO (`--backend openvino`, fp32, and bf16 as `--precision bf16` runs it), the head in torch,
measured in the same run as the torch variants. Each row's GFLOP/s is its requests/s times the FLOPs one
request needs (counted by torch on the packed pass, no padding), against the fp32 matmul peak measured in the
same run.

    python benchmarks/bench_forward.py [--model DIR] [--requests 80] [--repeats 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_serve import build_requests, flops_per_request, matmul_peak_gflops  # noqa: E402  (a sibling script)

from pipeline.data.answers import parse_request  # noqa: E402
from pipeline.families import load_decision_model  # noqa: E402
from pipeline.families.forward_passes import bounded_batches  # noqa: E402
from pipeline.families.laya.family import LayaFamily  # noqa: E402
from pipeline.families.laya.items import item_parts  # noqa: E402
from pipeline.families.laya.predict import (  # noqa: E402
    calibrated_probabilities,
    packed_item_logits,
    padded_item_logits,
    request_items,
)
from pipeline.families.laya_layout import load_model  # noqa: E402
from pipeline.families.runtimes.onnx_encoder import (  # noqa: E402
    ONNX_FILE,
    OnnxEncoder,
    export_encoder,
    onnxruntime_missing,
)
from pipeline.families.runtimes.openvino_encoder import OpenVinoEncoder, openvino_missing  # noqa: E402


def batches_of_requests(loaded, bodies: list[dict], concurrency: int) -> list[list]:
    """The items of each batch the server would form at `concurrency`: that many requests' questions
    together."""
    encoded = []
    for body in bodies:
        request = parse_request(body["state"], body["questions"])
        encoded.append(request_items(loaded, request.state, list(request.questions.values())))
    return [
        [it for items in encoded[i : i + concurrency] for it in items]
        for i in range(0, len(encoded), concurrency)
    ]


def variants(loaded, runtimes: dict, bounds: tuple[float, ...] = ()) -> dict:
    """(variant, backend) -> a run of a batch's items to their logits; `runtimes`: (backend, dtype) ->
    encoder, each also in passes cut at each padding bound of `bounds` (`forward_passes.bounded_batches`)."""
    runs = {
        ("padded, passes of 16", "torch"): lambda items: padded_item_logits(loaded, items, 16),
        ("packed fp32", "torch"): lambda items: packed_item_logits(loaded.model, items),
        ("packed bf16", "torch"): lambda items: packed_item_logits(loaded.model, items, torch.bfloat16),
    }
    for (backend, dtype), encoder in runtimes.items():
        name = "padded, passes of 16" + (" bf16" if dtype is not None else "")
        runs[name, backend] = lambda items, e=encoder, d=dtype: padded_item_logits(loaded, items, 16, d, e)
        for bound in bounds:
            name = f"passes <= {bound:.0%} padding" + (" bf16" if dtype is not None else "")
            runs[name, backend] = lambda items, e=encoder, d=dtype, b=bound: padded_item_logits(
                loaded, items, 16, d, e, b
            )
    return runs


def runtime_encoders(loaded, device: torch.device, folder: Path) -> dict:
    """The model's encoder exported once to ONNX, then in ONNX Runtime (fp32) and OpenVINO (fp32; bf16 where
    the CPU has it), each on this process's threads: (backend, dtype) -> encoder; a runtime that cannot run
    here is left out, saying why."""
    if device.type != "cpu":
        print("runtime columns left out: the runtimes run on the CPU only")
        return {}
    started = time.perf_counter()
    path = export_encoder(LayaFamily().served_encoder(loaded), folder / ONNX_FILE)
    print(f"encoder exported to ONNX in {time.perf_counter() - started:.1f} s")
    encoders = {}
    candidates = {
        ("onnxruntime", None): (onnxruntime_missing, lambda d: OnnxEncoder(path)),
        ("openvino", None): (openvino_missing, lambda d: OpenVinoEncoder(path, d)),
        ("openvino", torch.bfloat16): (openvino_missing, lambda d: OpenVinoEncoder(path, d)),
    }
    for (backend, dtype), (missing, build) in candidates.items():
        why_not = missing(dtype) if backend == "openvino" else missing()
        if why_not is not None:
            print(f"{backend} {dtype or 'fp32'} column left out: {why_not}")
            continue
        encoders[backend, dtype] = build(dtype)
    return encoders


def requests_per_second(runs: dict, batches: list[list], n_requests: int, repeats: int) -> dict:
    """Best requests/s per run, the runs interleaved round by round: on a shared machine each sees the same
    spells of load (run one after another, a busy minute lands on one variant only)."""
    for run in runs.values():
        run(batches[0])  # warm-up
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for key, run in runs.items():
            started = time.perf_counter()
            for items in batches:
                run(items)
            best[key] = min(best[key], time.perf_counter() - started)
    return {key: n_requests / seconds for key, seconds in best.items()}


def parity(loaded, run, reference, batches: list[list]) -> tuple[float, float]:
    """(largest calibrated probability difference, argmax agreement) against the reference variant."""
    worst, same, total = 0.0, 0, 0
    for items in batches:
        ours = calibrated_probabilities(loaded, items, run(items))
        theirs = calibrated_probabilities(loaded, items, reference(items))
        for a, b in zip(ours, theirs):
            worst = max(worst, float(np.abs(a - b).max()))
            same += int(np.argmax(a) == np.argmax(b))
            total += 1
    return worst, same / total


def padding_share(batches: list[list], pass_size: int = 16, bound: float | None = None) -> float:
    """The share of the tokens a runtime computes that are padding: its passes group a batch's sequences by
    length (`length_batches`, `pass_size` at a time, cut at `bound` padding when given), each padded to its
    longest; the packed pass computes none."""
    real = padded = 0
    for items in batches:
        lengths = [len(part) for part in item_parts(items)]
        for indices in bounded_batches(lengths, pass_size, bound):
            real += sum(lengths[i] for i in indices)
            padded += max(lengths[i] for i in indices) * len(indices)
    return 1 - real / padded


def matmul_share(run, batches: list[list]) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for items in batches:
            run(items)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return (
        sum(e.self_cpu_time_total for e in events if e.key in ("aten::addmm", "aten::mm", "aten::bmm"))
        / total
    )


def linear_rate(
    tokens: int, k: int, n: int, device: torch.device, dtype: torch.dtype = torch.float32, repeats: int = 20
) -> float:
    """GFLOP/s of a [tokens, k] x [k, n] product in `dtype` on `device`."""
    x, w = torch.randn(tokens, k, dtype=dtype, device=device), torch.randn(n, k, dtype=dtype, device=device)
    for _ in range(3):
        torch.nn.functional.linear(x, w)
    synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(x, w)
    synchronize(device)
    return 2 * tokens * k * n * repeats / (time.perf_counter() - started) / 1e9


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def linear_rates(tokens: int, hidden: int, inner: int, device: torch.device) -> dict[str, float]:
    """GFLOP/s at the encoder's linear shapes in fp32, and its feed-forward product in bf16."""
    shapes = {
        "q/k/v/out": (hidden, hidden),
        "fused qkv": (hidden, 3 * hidden),
        "ffn up": (hidden, inner),
        "ffn down": (inner, hidden),
    }
    rates = {
        f"{tokens}x{k}x{n} ({name})": linear_rate(tokens, k, n, device) for name, (k, n) in shapes.items()
    }
    rates[f"{tokens}x{hidden}x{inner} (ffn up, bf16)"] = linear_rate(
        tokens, hidden, inner, device, torch.bfloat16
    )
    return rates


def measure(loaded, runs: dict, batches: list[list], n_requests: int, args, flops: float) -> dict:
    """Requests/s (interleaved), GFLOP/s and parity against torch's padded pass, per (variant, backend), in
    one process."""
    reference = runs["padded, passes of 16", "torch"]
    print(
        f"model {args.model} on {args.device}, {n_requests} requests in batches of {args.concurrency}, "
        f"{torch.get_num_threads()} threads; best of {args.repeats}"
    )
    rates, rows = requests_per_second(runs, batches, n_requests, args.repeats), {}
    for (name, backend), run in runs.items():
        rps = rates[name, backend]
        difference, agreement = parity(loaded, run, reference, batches)
        rows[name, backend] = {
            "variant": name,
            "backend": backend,
            "requests_per_s": rps,
            "gflops": rps * flops / 1e9,
            "max_probability_difference": difference,
            "argmax_agreement": agreement,
        }
    return rows


def print_table(rows: dict, peak: float) -> None:
    base = rows["padded, passes of 16", "torch"]["requests_per_s"]
    packed = rows["packed fp32", "torch"]["requests_per_s"]
    print(
        f"\n{'variant':<27}{'backend':<13}{'req/s':>8}{'x padded':>10}{'x packed':>10}{'GFLOP/s':>9}{'x peak':>8}"
        f"{'max |dp|':>11}{'argmax':>9}"
    )
    for row in rows.values():
        rps = row["requests_per_s"]
        print(
            f"{row['variant']:<27}{row['backend']:<13}{rps:>8.1f}{rps / base:>9.2f}x{rps / packed:>9.2f}x"
            f"{row['gflops']:>9.1f}{row['gflops'] / peak:>7.0%} {row['max_probability_difference']:>10.1e}"
            f"{row['argmax_agreement']:>9.1%}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=ROOT / "data/snapshots/minilm", help="a laya-family folder"
    )
    parser.add_argument("--data", type=Path, default=ROOT / "data/processed/vader.jsonl")
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--bounds",
        type=float,
        nargs="*",
        default=[0.05, 0.1, 0.2],
        help="padding bounds the runtimes' passes are also cut at (a variant each)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_forward.json")
    args = parser.parse_args()

    loaded = load_model(args.model)
    device = torch.device(args.device)
    loaded.model.eval().requires_grad_(False).to(device)
    bodies = build_requests(args.data, args.requests)
    batches = batches_of_requests(loaded, bodies, args.concurrency)
    flops = flops_per_request(load_decision_model(args.model), bodies[:20])
    peak = matmul_peak_gflops()
    print(f"{flops / 1e9:.2f} GFLOP per request; fp32 matmul peak {peak:.0f} GFLOP/s (2048^3)")
    with tempfile.TemporaryDirectory(prefix="bench-forward-") as scratch:
        runs = variants(loaded, runtime_encoders(loaded, device, Path(scratch)), tuple(args.bounds))
        rows = measure(loaded, runs, batches, len(bodies), args, flops)
    print_table(rows, peak)
    print(
        f"padding: {padding_share(batches):.1%} of the tokens the padded passes of 16 compute (packed: none)"
    )
    for bound in args.bounds:
        print(f"padding: {padding_share(batches, 16, bound):.1%} in passes cut at {bound:.0%}")
    # The CPU profiler sees where a CPU pass spends its time; on a GPU it would time kernel launches only.
    share = matmul_share(runs["packed fp32", "torch"], batches) if device.type == "cpu" else None
    config = loaded.model.encoder.config
    tokens = int(np.mean([sum(len(it) for it in items) for items in batches]))
    rates = linear_rates(tokens, config.hidden_size, config.intermediate_size, device)
    if share is not None:
        print(f"\npacked fp32: {share:.0%} of its time in matrix products")
    print(f"GFLOP/s at the encoder's shapes ({tokens} tokens = one batch):")
    for shape, rate in rates.items():
        print(f"  {shape:<28}{rate:>7.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "model": str(args.model),
                "variants": list(rows.values()),
                "matmul_share": share,
                "padding_share": padding_share(batches),
                "gflop_per_request": flops / 1e9,
                "matmul_peak_gflops": peak,
                "linear_gflops": rates,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
