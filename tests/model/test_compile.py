"""Compiled encoder layers: parity with eager, no recompiles after the warm-up, eager fallback, clean exit.

    .venv/bin/python -m pytest tests/model/test_compile.py -q

A tiny random BERT and 16-token buckets keep every compile to a second or two on CPU. Only the parity
test uses Inductor. Recompiles are decided by dynamo's guards, before any backend runs, so the rest use
the "eager" backend (dynamo only) or, where checkpointing must go through AOT autograd, "aot_eager".
"""

from __future__ import annotations

import logging

import pytest
import torch
from laya.common import DecisionModel
from peft import LoraConfig, inject_adapter_in_model
from torch import nn
from torch._dynamo.utils import counters
from transformers import BertConfig, BertModel

from pipeline.training.compile import (
    CompileConfig,
    bucket_length,
    compiled_encoder,
    decide_compile,
    encoder_layers,
    no_cudnn_sdpa,
    pad_to_bucket,
    pick_warmup_batches,
)

PAD_ID = 0
CPU = torch.device("cpu")
# Four static buckets (16..64); lengths just short of a multiple so every padded batch keeps a mask.
FAST = CompileConfig(bucket=16, max_static_len=64, backend="eager")
STATIC_LENGTHS = (13, 29, 45, 61)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # One thread: these models are tiny, and OpenMP workers stall for whole time slices on a busy
    # two-core runner (a four-step eager loop went from 0.03 s to 5 s).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


def _model(dropout: float = 0.0, lora: bool = False, seed: int = 0) -> DecisionModel:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    config._attn_implementation = "sdpa"
    encoder = BertModel(config, add_pooling_layer=False)
    if lora:
        # As in training: base weights frozen, so layer 0's input does not require grad.
        encoder = inject_adapter_in_model(LoraConfig(r=4, target_modules=["query", "value"]), encoder)
    return DecisionModel(encoder, head_layers=1, dropout=dropout).train()


def _batch(rows: int, length: int, seed: int, options: int = 3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=gen)
    lengths[0] = length
    positions = torch.arange(length)
    attention = (positions[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, 100, (rows, length), generator=gen) * attention
    k = torch.randint(2, options + 1, (rows,), generator=gen)
    k[0] = options
    marker_mask = torch.arange(options)[None, :] < k[:, None]
    # Markers at distinct positions inside each row's own tokens.
    marker_pos = torch.stack([torch.randperm(int(n), generator=gen)[:options].sort().values for n in lengths])
    target = torch.rand(rows, options, generator=gen) * marker_mask
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "marker_pos": marker_pos,
        "marker_mask": marker_mask,
        "qtype": torch.randint(0, 3, (rows,), generator=gen),
        "target": target / target.sum(-1, keepdim=True),
    }


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits, _ = model(
        batch["input_ids"], batch["attention_mask"], batch["marker_pos"], batch["marker_mask"], batch["qtype"]
    )
    mask = batch["marker_mask"]
    logp = torch.log_softmax(logits.masked_fill(~mask, -1e4), -1)
    return -(batch["target"] * logp * mask).sum(-1).mean()


def _loss_and_grads(
    model: nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = _loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _frames() -> tuple[int, int]:
    return counters["frames"]["total"], counters["stats"]["unique_graphs"]


def _is_eager(model: DecisionModel) -> bool:
    return all(layer._compiled_call_impl is None for layer in encoder_layers(model.encoder))


@pytest.mark.slow
def test_compiled_matches_eager_and_padding_leaves_the_loss_unchanged(monkeypatch):
    monkeypatch.setenv("DECISION_COMPILE", "1")
    config = CompileConfig(bucket=16, max_static_len=64)  # the real backend: Inductor
    enabled, reason = decide_compile(CPU, 10, config)
    model = _model()
    batch = _batch(rows=3, length=29, seed=1)
    padded = pad_to_bucket(batch, PAD_ID, config)
    assert padded["input_ids"].shape[1] == 32

    eager_loss, eager_grads = _loss_and_grads(model, batch)
    padded_loss, _ = _loss_and_grads(model, padded)
    assert padded_loss == pytest.approx(eager_loss, rel=1e-6)

    with compiled_encoder(model, config, enabled, reason, [batch], _loss, PAD_ID) as report:
        assert report.enabled and report.fallback_error is None and report.graphs_compiled >= 1
        compiled_loss, compiled_grads = _loss_and_grads(model, padded)
    assert report.recompiles_after_warmup == 0
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-5)
    assert compiled_grads.keys() == eager_grads.keys()
    # Compared as one vector: some gradients are zero in exact arithmetic (the scorer's last bias and the
    # key biases cannot move a softmax), and their float residue has no meaningful relative error.
    compiled_all = torch.cat([compiled_grads[n].flatten() for n in eager_grads])
    eager_all = torch.cat([g.flatten() for g in eager_grads.values()])
    assert _relative(compiled_all, eager_all) < 1e-5
    assert (
        max((compiled_grads[n] - g).norm().item() for n, g in eager_grads.items())
        < 1e-5 * eager_all.norm().item()
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("checkpointing", "backend"), [(False, "eager"), (True, "aot_eager")], ids=["plain", "checkpointing"]
)
def test_no_recompiles_after_warmup_over_every_bucket(checkpointing, backend):
    # Four buckets and a long length, two graphs each (layer 0's input is frozen under LoRA): ten
    # graphs, past dynamo's default limit of 8, which would silently send the rest of the run to eager.
    config = CompileConfig(bucket=16, max_static_len=64, backend=backend)
    model = _model(dropout=0.1, lora=True)
    if checkpointing:
        # Reentrant on purpose: compiled_encoder must switch the run to non-reentrant.
        model.encoder.activation_checkpointing_enable({"use_reentrant": True})
    names = [n for n, _ in model.named_parameters()]
    lengths = (*STATIC_LENGTHS, 90)  # 90 is past the static limit: one dynamic-length graph
    warmup = [_batch(rows=2, length=n, seed=n) for n in lengths]
    limit = torch._dynamo.config.recompile_limit

    with compiled_encoder(model, config, True, "test", warmup, _loss, PAD_ID) as report:
        assert report.enabled, report.fallback_error
        assert report.recompile_limit_hits == 0
        assert report.graphs_compiled >= len(lengths)
        before = _frames()
        # Every bucket twice, other batch sizes, other long lengths: all served by the warm-up's graphs.
        for rows in (3, 5):
            for n in (*lengths, 100, 120):
                loss = _loss(model, pad_to_bucket(_batch(rows, n, seed=rows * n), PAD_ID, config))
                loss.backward()
                assert torch.isfinite(loss)
        assert _frames() == before
        assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)

    assert report.recompiles_after_warmup == 0 and report.recompile_limit_hits == 0
    assert torch._dynamo.config.recompile_limit == limit
    assert [n for n, _ in model.named_parameters()] == names
    assert _is_eager(model)


@pytest.mark.parametrize("failure", ["compile", "warmup"])
def test_a_failing_compile_falls_back_to_eager_training(monkeypatch, caplog, failure):
    def broken_compile(self, *args, **kwargs):
        raise RuntimeError("boom in compile")

    warming = [True]

    def loss_fn(model, batch):
        loss = _loss(model, batch)
        if failure == "warmup" and warming[0]:
            raise RuntimeError("boom in warm-up")
        return loss

    if failure == "compile":
        monkeypatch.setattr(nn.Module, "compile", broken_compile)
    model = _model(dropout=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [_batch(rows=2, length=n, seed=n) for n in STATIC_LENGTHS]
    limit = torch._dynamo.config.recompile_limit

    with (
        caplog.at_level(logging.WARNING, logger="pipeline.training.compile"),
        compiled_encoder(model, FAST, True, "test", batches[:2], loss_fn, PAD_ID) as report,
    ):
        warming[0] = False
        assert _is_eager(model)
        assert torch._dynamo.config.recompile_limit == limit
        losses = []
        for batch in batches:
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())

    assert not report.enabled
    assert "RuntimeError" in report.fallback_error and "boom" in report.fallback_error
    assert len([r for r in caplog.records if r.name == "pipeline.training.compile"]) == 1
    assert all(torch.isfinite(torch.tensor(losses)))
    assert _is_eager(model)


@pytest.mark.parametrize(
    ("env", "device", "passes", "expected"),
    [
        ({"DECISION_COMPILE": "1"}, "cpu", 10, True),
        ({"DECISION_COMPILE": "0"}, "cuda", 100_000, False),
        ({}, "cuda", 4000, True),
        ({}, "cuda", 3999, False),
        ({}, "cpu", 100_000, False),
        ({"DECISION_COMPILE": ""}, "cuda", 12_000, True),
    ],
)
def test_decide_compile_honours_the_override_and_the_auto_rule(env, device, passes, expected):
    enabled, reason = decide_compile(torch.device(device), passes, CompileConfig(), env)
    assert enabled is expected
    assert reason


def test_decide_compile_names_the_variable_on_a_bad_value():
    with pytest.raises(ValueError, match="DECISION_COMPILE"):
        decide_compile(CPU, 10, CompileConfig(), {"DECISION_COMPILE": "yes"})


def test_exit_restores_layers_names_and_warmup_leaves_rng_and_grads_alone():
    model = _model(dropout=0.1)  # dropout draws from the RNG during the warm-up
    model.encoder.activation_checkpointing_enable({"use_reentrant": True})
    layers = encoder_layers(model.encoder)
    names = [n for n, _ in model.named_parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    dynamo = torch._dynamo.config
    limits = (dynamo.recompile_limit, dynamo.accumulated_recompile_limit, dynamo.suppress_errors)
    warmup = [_batch(rows=2, length=n, seed=n) for n in STATIC_LENGTHS[:2]]

    with compiled_encoder(model, FAST, True, "test", warmup, _loss, PAD_ID) as report:
        assert report.enabled and report.warmup_seconds > 0
        assert all(layer._compiled_call_impl is not None for layer in layers)
        assert all(layer._gradient_checkpointing_func.keywords["use_reentrant"] is False for layer in layers)
        assert dynamo.recompile_limit >= 2 * (FAST.max_static_len // FAST.bucket)
        assert torch.equal(torch.get_rng_state(), rng)
        assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
        assert [n for n, _ in model.named_parameters()] == names

    assert _is_eager(model)
    assert all(layer._gradient_checkpointing_func.keywords["use_reentrant"] is True for layer in layers)
    assert [n for n, _ in model.named_parameters()] == names
    assert (dynamo.recompile_limit, dynamo.accumulated_recompile_limit, dynamo.suppress_errors) == limits


def test_disabled_leaves_the_model_alone():
    model = _model()
    before = _frames()  # dynamo.reset() does not clear the counters, so compare
    with compiled_encoder(model, FAST, False, "off on CPU", [_batch(2, 13, 0)], _loss, PAD_ID) as report:
        assert not report.enabled and report.reason == "off on CPU"
        assert _is_eager(model)
        _loss(model, _batch(2, 13, 0)).backward()
    assert _frames() == before


def test_pad_to_bucket_pads_up_to_the_static_limit_only_and_copies():
    for length in range(1, 101):
        padded = bucket_length(length, FAST)
        if length <= FAST.max_static_len:
            assert padded % FAST.bucket == 0 and length <= padded < length + FAST.bucket
        else:
            assert padded == length

    batch = _batch(rows=3, length=29, seed=2)
    original = {k: v.clone() for k, v in batch.items()}
    out = pad_to_bucket(batch, 7, FAST)
    assert out is not batch and batch.keys() == original.keys()
    assert all(torch.equal(batch[k], original[k]) for k in batch)
    assert out["input_ids"].shape == (3, 32) and out["attention_mask"].shape == (3, 32)
    assert (out["input_ids"][:, 29:] == 7).all() and (out["attention_mask"][:, 29:] == 0).all()
    assert torch.equal(out["input_ids"][:, :29], batch["input_ids"])
    assert all(out[k] is batch[k] for k in ("marker_pos", "marker_mask", "qtype", "target"))

    long = _batch(rows=2, length=70, seed=3)
    long["attention_mask"][1, -1] = 0
    assert pad_to_bucket(long, PAD_ID, FAST)["input_ids"].shape[1] == 70


@pytest.mark.parametrize(("length", "padded"), [(32, 48), (64, 65), (70, 71)])
def test_pad_to_bucket_gives_a_batch_without_padding_a_masked_key(length, padded):
    # HF drops an all-ones mask, and a mask-less layer call is another graph for the same shape.
    full = _batch(rows=2, length=length, seed=4)
    full["attention_mask"].fill_(1)
    out = pad_to_bucket(full, PAD_ID, FAST)
    assert out["input_ids"].shape[1] == padded
    assert not out["attention_mask"].all()


def test_pick_warmup_batches_keeps_one_per_bucket_and_one_long():
    batches = [_batch(2, n, seed=n) for n in (13, 14, 29, 70, 90, 61)]
    picked = pick_warmup_batches(batches, FAST)
    assert [b["input_ids"].shape[1] for b in picked] == [13, 29, 70, 61]


def test_config_rejects_a_static_limit_off_the_bucket_grid():
    with pytest.raises(ValueError, match="max_static_len"):
        CompileConfig(bucket=64, max_static_len=1000)


def test_no_cudnn_sdpa_turns_the_backend_off_and_restores_it(monkeypatch):
    was = torch.backends.cuda.cudnn_sdp_enabled()
    with no_cudnn_sdpa():
        assert torch.backends.cuda.cudnn_sdp_enabled() == was  # no CUDA: a no-op
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        with no_cudnn_sdpa():
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
