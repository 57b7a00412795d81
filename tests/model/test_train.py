"""The trainer's behaviour on a tiny random model: learning, exact accumulation, seeds, cancel, host syncs."""

import copy
import json
import traceback
from dataclasses import replace

import pytest
import torch

from pipeline.config import ConfigError, TrainConfig
from pipeline.data import synthetic
from pipeline.data.split import TrainSource
from pipeline.data.validate import validate_rows
from pipeline.families.laya.family import LayaFamily
from pipeline.families.laya.forward import decision_logits, score_items, soft_cross_entropy
from pipeline.families.laya.items import build_items, collate
from pipeline.families.laya.training import laya_batch_task, prepare_model
from pipeline.families.laya_layout import load_model
from pipeline.stages.train import train_on_data
from pipeline.training.controls import CancelToken, RunControls, RunHooks
from pipeline.training.loop import (
    accumulate_gradients,
    micro_batches,
    plan_windows,
    train,
)

CPU = torch.device("cpu")
FAST = TrainConfig(
    method="full",
    micro_batch=4,
    grad_accum=2,
    full_lr=1e-3,
    head_lr=1e-3,
    lora_r=4,
    log_every=2,
    precision="fp32",
)


@pytest.fixture(scope="module")
def tiny_items(tiny_base):
    loaded = load_model(tiny_base)
    records = validate_rows(synthetic.generate_rows(24, seed=5)).records
    items, skipped = build_items(records, loaded)
    assert skipped == {}
    return items


def _fresh(tiny_base, config=FAST):
    loaded = load_model(tiny_base)
    for module in loaded.model.modules():  # no dropout: updates must be comparable bit for bit
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(module, torch.nn.MultiheadAttention):
            module.dropout = 0.0  # a float attribute, not a Dropout module
    prepare_model(loaded.model, config)
    return loaded


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("method", ["full", "lora"])
def test_loss_falls_and_parameters_stay_finite(tiny_base, tiny_items, method):
    config = replace(FAST, method=method, epochs=6, lora_lr=5e-3)
    loaded = _fresh(tiny_base, config)
    result = train(loaded.model, tiny_items, config, CPU, laya_batch_task(loaded.tokenizer.pad_token_id))
    first, last = result.losses[0][1], result.losses[-1][1]
    assert last < 0.8 * first, result.losses
    assert all(torch.isfinite(p).all() for p in loaded.model.parameters())
    assert all(
        p.dtype == torch.float32 for n, p in loaded.model.named_parameters() if not n.startswith("encoder.")
    )


def test_accumulation_is_exact(tiny_base, tiny_items):
    """Accumulation 4 x micro-batch 2 gives the same gradient, and so the same update, as 1 x 8."""
    window = plan_windows(len(tiny_items), replace(FAST, micro_batch=8, grad_accum=1))[0]
    grads = []
    for micro_batch in (8, 2):
        loaded = _fresh(tiny_base)
        pad = loaded.tokenizer.pad_token_id

        def summed_loss(indices, model=loaded.model, pad=pad):
            batch = collate([tiny_items[i] for i in indices], pad)
            return soft_cross_entropy(
                decision_logits(model, batch), batch["target"], batch["marker_mask"]
            ).sum()

        accumulate_gradients(window, tiny_items, micro_batch, summed_loss)
        grads.append({n: p.grad.clone() for n, p in loaded.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    assert max(g.abs().max().item() for g in grads[0].values()) > 1e-4  # so equality below means something
    for name, grad in grads[0].items():
        # atol: sums over every token (e.g. the token-type embedding) differ in float order between batch shapes
        torch.testing.assert_close(
            grads[1][name], grad, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_a_seed_reproduces_a_run_and_another_seed_does_not(tiny_base, tiny_items):
    runs = []
    for seed in (0, 0, 1):
        config = replace(FAST, max_steps=3, seed=seed)
        loaded = _fresh(tiny_base, config)
        train(
            loaded.model,
            tiny_items,
            config,
            CPU,
            laya_batch_task(loaded.tokenizer.pad_token_id),
        )
        runs.append(_params(loaded.model))
    assert all(torch.equal(runs[0][n], runs[1][n]) for n in runs[0])
    assert any(not torch.equal(runs[0][n], runs[2][n]) for n in runs[0])


def test_micro_batches_group_by_length_and_keep_the_window(tiny_items):
    window = list(range(len(tiny_items)))
    grouped = micro_batches(window, tiny_items, 4)
    assert sorted(i for batch in grouped for i in batch) == window

    def padded(batches):
        return sum(len(b) * max(len(tiny_items[i]) for i in b) for b in batches)

    naive = [window[i : i + 4] for i in range(0, len(window), 4)]
    assert padded(grouped) <= padded(naive)


def test_one_host_sync_per_logging_step(tiny_base, tiny_items, monkeypatch):
    config = replace(FAST, max_steps=6, log_every=3)
    loaded = _fresh(tiny_base, config)
    calls = []
    original = torch.Tensor.item

    def counted_item(self):
        # Reads of our own loss only: optimizers read their CPU step counters, which is not a device sync.
        caller = traceback.extract_stack(limit=2)[0].filename
        calls.append(caller) if "/pipeline/" in caller else None
        return original(self)

    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    train(loaded.model, tiny_items, config, CPU, laya_batch_task(loaded.tokenizer.pad_token_id))
    assert len(calls) == 2, calls  # steps 3 and 6


def test_cancel_stops_at_the_next_step_and_saves_nothing(tiny_base, synthetic_train_file, tmp_path):
    cancel = CancelToken()
    config = replace(FAST, max_steps=20, log_every=1)
    loaded = _fresh(tiny_base, config)
    items, _ = build_items(validate_rows(synthetic.generate_rows(40, seed=2)).records, loaded)
    logged = []

    def cancel_after_two(entry):
        logged.append(entry["step"])
        if entry["step"] == 2:
            cancel.cancel("test")

    result = train(
        loaded.model,
        items,
        config,
        CPU,
        laya_batch_task(loaded.tokenizer.pad_token_id),
        RunHooks(on_log=cancel_after_two),
        RunControls(cancel=cancel),
    )
    assert result.cancelled and result.steps == 2 and logged == [1, 2]
    cancel = CancelToken()
    cancel.cancel("before start")
    run = train_on_data(
        TrainSource(synthetic_train_file),
        tiny_base,
        tmp_path / "out",
        config,
        controls=RunControls(cancel=cancel),
    )
    assert run.cancelled and run.saved_to is None and not (tmp_path / "out").exists()


def test_scoring_returns_the_callers_order(tiny_base, tiny_items):
    loaded = load_model(tiny_base)
    shuffled = tiny_items[::-1] + tiny_items[:3]
    together = score_items(loaded.model, shuffled, loaded.tokenizer.pad_token_id, CPU, batch_size=5)
    for item, probabilities in zip(shuffled, together):
        alone = score_items(loaded.model, [item], loaded.tokenizer.pad_token_id, CPU)[0]
        torch.testing.assert_close(
            torch.from_numpy(probabilities), torch.from_numpy(alone), rtol=1e-5, atol=1e-6
        )
    assert collate(tiny_items[:2], 0)["target"].sum(-1).allclose(torch.ones(2))


def test_qlora_is_refused_for_the_laya_family(tiny_base, synthetic_train_file):
    with pytest.raises(ConfigError, match=r"train\.method=qlora: the laya family trains with lora or full"):
        train_on_data(
            TrainSource(synthetic_train_file), tiny_base, None, TrainConfig(method="qlora"), device="cpu"
        )


@pytest.mark.parametrize("method", ["lora", "full"])
def test_decision_train_cli_saves_a_fine_tune(tiny_base, synthetic_train_file, tmp_path, capsys, method):
    from pipeline.cli.main import main
    from pipeline.families import pick_family

    params = tmp_path / "params.yaml"
    params.write_text("train:\n  micro_batch: 4\n  grad_accum: 2\n  lora_r: 4\n  precision: fp32\n")
    out = tmp_path / method
    code = main(
        [
            "train",
            "--data",
            str(synthetic_train_file),
            "--base",
            str(tiny_base),
            "--out",
            str(out),
            "--method",
            method,
            "--max-steps",
            "3",
            "--params",
            str(params),
            "--json",
        ]
    )
    assert code == 0
    run = json.loads(capsys.readouterr().out)
    assert run["steps"] == 3 and run["saved_to"] == str(out)
    assert set(run["heldout"]) == {"decisions", "base", "tuned"}
    assert run["heldout"]["decisions"] > 0 and 0 <= run["heldout"]["tuned"]["accuracy"] <= 1
    assert pick_family(out).describe_training(out)["method"] == method
    if method == "full":
        assert load_model(out).config["fine_tuned"] is True
    else:
        assert not (out / "rl_agent_config.json").exists()  # adapters are not a servable model


def test_lora_fine_tune_reloads_with_the_same_predictions(tiny_base, tiny_items, tmp_path):
    from pipeline.families.laya.adapters import load_adapter

    config = replace(FAST, method="lora", max_steps=3, lora_lr=1e-2)
    loaded = _fresh(tiny_base, config)
    train(loaded.model, tiny_items, config, CPU, laya_batch_task(loaded.tokenizer.pad_token_id))
    expected = score_items(loaded.model, tiny_items, loaded.tokenizer.pad_token_id, CPU)
    LayaFamily().save_finetune(
        copy.copy(loaded), tmp_path / "lora", {"method": "lora", "steps": 3, "base": str(tiny_base)}
    )
    fresh = load_model(tiny_base)
    load_adapter(fresh.model, tmp_path / "lora")
    got = score_items(fresh.model, tiny_items, fresh.tokenizer.pad_token_id, CPU)
    for a, b in zip(expected, got):
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_training_compiled_on_cpu_warms_up_once_and_matches_eager(tiny_base, tiny_items, monkeypatch):
    from pipeline.training.compile import CompileConfig

    compile_config = CompileConfig(bucket=16, max_static_len=128, backend="aot_eager")
    config = replace(FAST, max_steps=4)
    torch._dynamo.reset()
    losses = {}
    for forced in ("1", "0"):
        monkeypatch.setenv("DECISION_COMPILE", forced)
        loaded = _fresh(tiny_base, config)
        names = [n for n, _ in loaded.model.named_parameters()]
        result = train(
            loaded.model,
            tiny_items,
            config,
            CPU,
            laya_batch_task(loaded.tokenizer.pad_token_id),
            controls=RunControls(compile=compile_config),
        )
        losses[forced] = [loss for _, loss in result.losses]
        assert result.compile["enabled"] is (forced == "1")
        assert [n for n, _ in loaded.model.named_parameters()] == names
    assert result.compile["recompiles_after_warmup"] == 0 or forced == "0"
    torch.testing.assert_close(torch.tensor(losses["1"]), torch.tensor(losses["0"]), rtol=1e-4, atol=1e-5)


def test_a_failing_compile_still_trains_eagerly(tiny_base, tiny_items, monkeypatch):
    from pipeline.training.compile import CompileConfig

    def broken_compile(self, *args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setenv("DECISION_COMPILE", "1")
    monkeypatch.setattr(torch.nn.Module, "compile", broken_compile)
    config = replace(FAST, max_steps=3)
    loaded = _fresh(tiny_base, config)
    result = train(
        loaded.model,
        tiny_items,
        config,
        CPU,
        laya_batch_task(loaded.tokenizer.pad_token_id),
        controls=RunControls(compile=CompileConfig(bucket=16, max_static_len=128, backend="aot_eager")),
    )
    assert result.steps == 3 and not result.compile["enabled"]
    assert "no compiler here" in result.compile["fallback_error"]


def test_a_signal_sets_the_cancel_flag_and_the_old_handler_comes_back():
    # In a fresh interpreter: in the whole suite's process a SIGINT crashed the interpreter (rc 139), not
    # here.
    import subprocess
    import sys

    code = (
        "import signal\nfrom pipeline.training.controls import CancelToken\n"
        "before = signal.getsignal(signal.SIGINT)\ncancel = CancelToken()\n"
        "with cancel.on_signals():\n    signal.raise_signal(signal.SIGINT)\n"
        "    assert cancel.cancelled and cancel.reason == 'signal SIGINT'\n"
        "assert signal.getsignal(signal.SIGINT) is before\nprint('restored')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "restored", done.stderr
