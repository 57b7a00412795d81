"""Merged export: parity with base + adapter, laya compatibility, idempotence, and crash safety under
SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from pipeline.config import TrainConfig
from pipeline.data import synthetic
from pipeline.data.validate import validate_rows
from pipeline.families import list_models
from pipeline.families.exporting import MANIFEST, NonFiniteWeights, merged_copy
from pipeline.families.laya.adapters import has_lora
from pipeline.families.laya.export import export_model
from pipeline.families.laya.family import LayaFamily
from pipeline.families.laya.forward import decision_logits
from pipeline.families.laya.items import build_items, collate
from pipeline.families.laya.predict import predict
from pipeline.families.laya.training import laya_batch_task, prepare_model
from pipeline.families.laya_layout import load_model
from pipeline.stages.export import export_folder
from pipeline.training.loop import train

CONFIG = TrainConfig(
    method="lora",
    micro_batch=4,
    grad_accum=2,
    lora_r=4,
    lora_lr=2e-2,
    max_steps=4,
    precision="fp32",
    log_every=2,
)
QUESTIONS = {
    "tone": {"type": "choice", "instructions": "what tone", "criteria": ["negative", "neutral", "positive"]},
    "good": {"type": "noul", "instructions": "it is good"},
}


@pytest.fixture(scope="module")
def lora_model(tiny_base):
    loaded = load_model(tiny_base)
    prepare_model(loaded.model, CONFIG)
    records = validate_rows(synthetic.generate_rows(30, seed=8)).records
    items, _ = build_items(records, loaded)
    train(
        loaded.model,
        items,
        CONFIG,
        torch.device("cpu"),
        laya_batch_task(loaded.tokenizer.pad_token_id),
    )
    with torch.no_grad():  # make the adapters matter, so parity below could fail
        for name, parameter in loaded.model.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.05 * torch.randn_like(parameter))
    return loaded, items


def test_merged_copy_equals_base_plus_adapter_and_leaves_the_adapters(lora_model):
    loaded, items = lora_model
    batch = collate(items[:12], loaded.tokenizer.pad_token_id)
    merged = merged_copy(loaded.model)
    with torch.no_grad():
        expected = decision_logits(loaded.model.eval(), batch)
        got = decision_logits(merged.eval(), batch)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert has_lora(loaded.model) and not has_lora(merged)


def test_export_loads_strictly_and_answers_like_laya(lora_model, tmp_path):
    import laya

    loaded, _ = lora_model
    result = export_model(loaded, tmp_path / "export", [1.3, 1.0, 0.8], {"source_digest": "a"})
    assert result.written and (tmp_path / "export" / MANIFEST).is_file()
    exported = load_model(tmp_path / "export")  # laya's loader is strict: no missing or unexpected keys
    assert exported.config["temperature"] == [1.3, 1.0, 0.8]
    agent = laya.Agent(str(tmp_path / "export"), device="cpu")
    for state in ("this is great", "the order was late and bad"):
        ours = predict(exported, state, QUESTIONS)
        answers = agent.system_one(state, QUESTIONS)["answers"]
        theirs = [answers["tone"]["probabilities"][k] for k in ("negative", "neutral", "positive")]
        np.testing.assert_allclose(ours["tone"], theirs, atol=2e-3)
        assert ours["good"][1] == pytest.approx(answers["good"]["noul"], abs=2e-3)


def test_exporting_the_same_fine_tune_again_is_a_no_op(lora_model, tiny_base, tmp_path):
    loaded, _ = lora_model
    adapter = LayaFamily().save_finetune(
        loaded, tmp_path / "adapter", {"method": "lora", "steps": 4, "base": str(tiny_base)}
    )
    first = export_folder(adapter, tmp_path / "export")
    stamp = (tmp_path / "export" / "model.safetensors").stat().st_mtime_ns
    second = export_folder(adapter, tmp_path / "export")
    assert first.written and not second.written
    assert (tmp_path / "export" / "model.safetensors").stat().st_mtime_ns == stamp
    assert not export_folder(tmp_path / "export", tmp_path / "export").written  # already merged, in place


def test_non_finite_weights_are_refused_and_nothing_is_written(lora_model, tmp_path):
    loaded, _ = lora_model
    broken = replace(loaded, model=merged_copy(loaded.model))
    with torch.no_grad():
        broken.model.scorer[1].weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights, match=r"scorer\.1\.weight"):
        export_model(broken, tmp_path / "export", [1, 1, 1], {"source_digest": "x"})
    assert list(tmp_path.iterdir()) == []


EXPORT_LOOP = """
import sys, torch
from pipeline.families.laya_layout import load_model
from pipeline.families.laya.export import export_model
loaded = load_model(sys.argv[1])
print("ready", flush=True)
for i in range(10_000):  # export after export, so a kill at any moment lands inside one
    export_model(loaded, sys.argv[2], [2.0 + i % 2] * 3, {"source_digest": f"v{i % 2}"})
"""
TEMPERATURE_OF = {"old": 1.0, "v0": 2.0, "v1": 3.0}


@pytest.mark.slow
def test_a_killed_export_leaves_a_complete_model_and_nothing_partial_is_listed(tiny_base, tmp_path):
    target = tmp_path / "models" / "current"
    export_model(load_model(tiny_base), target, [1.0, 1.0, 1.0], {"source_digest": "old"})
    script = tmp_path / "export_loop.py"
    script.write_text(EXPORT_LOOP)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    seen = set()
    for delay in np.linspace(0.02, 0.6, 10):  # seconds into the loop: kills land at many points of a write
        child = subprocess.Popen(
            [sys.executable, str(script), str(tiny_base), str(target)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        manifest = json.loads((target / MANIFEST).read_text())
        model = load_model(target)  # loadable after every kill, and weights, config and manifest agree
        assert model.config["temperature"] == [TEMPERATURE_OF[manifest["source_digest"]]] * 3
        assert list_models(target.parent) == [target]  # a staging folder is never listed
        seen.add(manifest["source_digest"])
    assert len(seen) >= 2  # the kills really interrupted a running sequence of exports
    export_model(load_model(tiny_base), target, [1.0, 1.0, 1.0], {"source_digest": "old"})
    assert not [
        p for p in target.parent.iterdir() if p.name.startswith(".")
    ]  # leftovers of killed exports are cleaned
