"""The joint family's layout: load, merged crash-safe export, parity after reload, and the Decision API.

A tiny random Qwen3 with a byte-level BPE tokenizer trained in memory; nothing is downloaded.
"""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from pipeline.data.answers import answer_probabilities, parse_request
from pipeline.data.pins import current_md5
from pipeline.families import list_models
from pipeline.families.base import Answered, BadQuestion, ModelLayoutError
from pipeline.families.joint.backbone import is_causal_lm_folder
from pipeline.families.joint.layout import (
    BACKBONE_DIR,
    HEAD_FILE,
    JOINT_CONFIG,
    JointExportError,
    LoadedJoint,
    export_joint,
    is_joint_export,
    load_joint,
)
from pipeline.families.joint.predict import answer_joint_requests
from pipeline.families.joint.records import SYSTEM_INSTRUCTION
from tests.api.conftest import QUESTIONS

VOCAB = 320  # the model's; the tokenizer's is 300, below it
TOKENIZER_VOCAB = 300
MAX_LEN = 512
WIDTH = 32
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TEMPERATURES = (0.8, 1.2, 1.5)
STATES = ["I love this product, it is great", {"text": "the order was late", "stars": 2}, "fine, okay"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
LINES = [
    SYSTEM_INSTRUCTION,
    "What is the tone? negative, neutral or positive. How intense? none mild strong",
    "The delivery was late but the support team was kind. The text is positive.",
    *map(str, STATES),
]


def bpe_tokenizer(pad: bool = True):
    """A byte-level BPE tokenizer (the Qwen and Llama kind) trained in memory on a few lines."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    backend = ByteLevelBPETokenizer()
    backend.train_from_iterator(
        LINES, vocab_size=TOKENIZER_VOCAB, min_frequency=1, special_tokens=SPECIALS, show_progress=False
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend._tokenizer,
        bos_token=SPECIALS[0],
        eos_token=SPECIALS[1],
        pad_token=SPECIALS[2] if pad else None,
    )


def tiny_lm_folder(folder: Path, dtype: torch.dtype = torch.float32, pad: bool = True) -> Path:
    """A tiny random Qwen3 (tied embeddings) in `dtype` with its tokenizer, as a local checkpoint."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(dtype).save_pretrained(folder)
    tokenizer = bpe_tokenizer(pad)
    assert len(tokenizer) <= TOKENIZER_VOCAB < VOCAB
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory) -> Path:
    return tiny_lm_folder(tmp_path_factory.mktemp("lm") / "qwen3-tiny")


def requests():
    return [parse_request(state, QUESTIONS) for state in STATES]


def fresh(folder: Path, dtype=torch.float32, lora: bool = False, quantization=None) -> LoadedJoint:
    """The LM with a fresh head whose logits are spread (so probability checks can fail), LoRA if asked."""
    loaded = load_joint(folder, MAX_LEN, WIDTH, seed=0, dtype=dtype, quantization=quantization)
    with torch.no_grad():
        loaded.model.head.scorer[-1].weight.mul_(40.0)
    if lora:
        add_lora(loaded)
    loaded.config["temperature"] = {"global": 1.0, "by_type": list(TEMPERATURES)}
    return loaded


def probabilities(results) -> list[list[float]]:
    assert all(isinstance(r, Answered) for r in results), results
    return [p for r in results for answer in r.answers.values() for p in answer_probabilities(answer)]


def test_a_plain_lm_folder_loads_with_a_seeded_head_and_is_only_read(lm_folder, tmp_path):
    before = current_md5(lm_folder)
    first, again, other = (load_joint(lm_folder, head_width=WIDTH, seed=s) for s in (3, 3, 4))
    assert is_causal_lm_folder(lm_folder) and not is_joint_export(lm_folder)
    heads = [loaded.model.head.state_dict() for loaded in (first, again, other)]
    assert all(torch.equal(heads[0][name], heads[1][name]) for name in heads[0])
    assert not all(torch.equal(heads[0][name], heads[2][name]) for name in heads[0])
    assert first.max_len == 1024 and first.config["fine_tuned"] is False
    assert first.config["temperature"] == {"global": 1.0, "by_type": [1.0, 1.0, 1.0]}
    assert first.tokenizer.pad_token == "<|pad|>" and not first.model.training
    assert current_md5(lm_folder) == before

    no_pad = tiny_lm_folder(tmp_path / "no-pad", pad=False)
    assert load_joint(no_pad, head_width=WIDTH).tokenizer.pad_token == "<|end_of_text|>"


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_export_then_reload_answers_as_the_in_memory_model(tmp_path, dtype, lora):
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import load_file

    loaded = fresh(tiny_lm_folder(tmp_path / "lm", dtype), dtype, lora)
    expected = probabilities(answer_joint_requests(loaded, requests()))
    if lora:  # the adapter matters, so the merge is tested
        with loaded.model.lm.disable_adapter():
            base = probabilities(answer_joint_requests(loaded, requests()))
        assert np.abs(np.subtract(base, expected)).max() > 1e-2
    export_joint(loaded, tmp_path / "export", TEMPERATURES, {"source": "test"})
    reloaded = load_joint(tmp_path / "export", dtype=dtype)
    np.testing.assert_allclose(
        probabilities(answer_joint_requests(reloaded, requests())), expected, atol=2e-2
    )

    written = torch.bfloat16 if dtype == torch.bfloat16 else torch.float16
    backbone = load_file(str(tmp_path / "export" / BACKBONE_DIR / "model.safetensors"))
    assert {t.dtype for t in backbone.values()} == {written} and not any("lora" in k for k in backbone)
    assert {t.dtype for t in load_file(str(tmp_path / "export" / HEAD_FILE)).values()} == {torch.float32}
    config = json.loads((tmp_path / "export" / JOINT_CONFIG).read_text())
    assert config["temperature"] == {"global": 1.0, "by_type": [0.8, 1.2, 1.5], "folded_global": 1.0}
    assert (
        config["family"] == "joint"
        and config["backbone"] == "causal_lm"
        and config["max_len"] == MAX_LEN
        and config["fine_tuned"] is lora
    )
    assert config["head"] == {
        "width": WIDTH,
        "heads": 4,
        "layers": 2,
        "chunk": 2048,
        "read_layers": 1,
        "lexicon": 0,
        "bigrams": 0,
        "isolated": True,
    }
    if lora:  # the training model keeps its adapters and still answers as before
        assert isinstance(loaded.model.lm, PeftModel)
        assert any(isinstance(m, LoraLayer) for m in loaded.model.lm.modules())
    assert probabilities(answer_joint_requests(loaded, requests())) == expected


def add_lora(loaded: LoadedJoint) -> None:
    """Wrap the LM with peft LoRA whose B is non-zero (it starts at zero), so merging it changes answers."""
    from peft import LoraConfig, get_peft_model

    loaded.model.lm = get_peft_model(
        loaded.model.lm, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS)
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in loaded.model.lm.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)


def test_a_4bit_base_with_lora_exports_dequantised_to_bf16(tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    folder = tiny_lm_folder(tmp_path / "lm", torch.bfloat16)
    nf4 = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    loaded = fresh(folder, torch.bfloat16, quantization=nf4)
    lm = loaded.model.lm
    assert type(lm.model.layers[0].mlp.up_proj.weight).__name__ == "Params4bit"
    add_lora(loaded)
    # Once before any inference pass, once after: on the CPU bitsandbytes repacks 4-bit weights at the first.
    export_joint(loaded, tmp_path / "before", TEMPERATURES, {})
    expected = probabilities(answer_joint_requests(loaded, requests()))
    export_joint(loaded, tmp_path / "after", TEMPERATURES, {})
    for out in ("before", "after"):
        reloaded = load_joint(tmp_path / out, dtype=torch.bfloat16)
        np.testing.assert_allclose(
            probabilities(answer_joint_requests(reloaded, requests())), expected, atol=2e-2
        )
        backbone = json.loads((tmp_path / out / BACKBONE_DIR / "config.json").read_text())
        assert "quantization_config" not in backbone and backbone["dtype"] == "bfloat16"
    assert type(lm.model.layers[0].mlp.up_proj.base_layer.weight).__name__ == "Params4bit"  # left as it was
    assert probabilities(answer_joint_requests(loaded, requests())) == expected


@torch.inference_mode()
def test_only_a_complete_export_is_listed_or_loaded(lm_folder, tmp_path):
    out = tmp_path / "models" / "decision-qwen3"
    assert export_joint(fresh(lm_folder), out, TEMPERATURES, {"source_digest": "abc"}).written
    unfinished = tmp_path / "models" / "unfinished"
    shutil.copytree(out, unfinished)
    (unfinished / HEAD_FILE).unlink()
    assert is_joint_export(out) and not is_joint_export(unfinished)
    assert list_models(tmp_path / "models") == [out]
    with pytest.raises(ModelLayoutError, match=HEAD_FILE):
        load_joint(unfinished)
    assert not export_joint(fresh(lm_folder), out, TEMPERATURES, {"source_digest": "abc"}).written


def test_a_crash_before_the_swap_leaves_the_old_export_loadable(lm_folder, tmp_path, monkeypatch):
    out = tmp_path / "decision-qwen3"
    export_joint(fresh(lm_folder), out, TEMPERATURES, {"run": "old"})
    old = probabilities(answer_joint_requests(load_joint(out), requests()))

    def crash(staging, target):
        assert is_joint_export(staging)  # the new model was complete, the head written last
        raise KeyboardInterrupt("killed before the swap")

    monkeypatch.setattr("pipeline.families.exporting._swap_in", crash)
    with pytest.raises(KeyboardInterrupt):
        export_joint(fresh(lm_folder), out, (3.0, 3.0, 3.0), {"run": "new"})
    assert json.loads((out / "manifest.json").read_text())["run"] == "old"
    assert probabilities(answer_joint_requests(load_joint(out), requests())) == old
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # the staging folder is gone


def test_bad_temperatures_are_refused_by_name(lm_folder, tmp_path):
    with pytest.raises(JointExportError, match=r"temperatures\[0\].*temperatures\[1\]"):
        export_joint(fresh(lm_folder), tmp_path / "out", (0.0, -1.0, 1.0), {})
    assert not (tmp_path / "out").exists()


def test_a_request_that_cannot_fit_fails_alone(lm_folder):
    loaded = fresh(lm_folder)
    long = {"huge": {"type": "choice", "instructions": "why " * 400, "criteria": ["a", "b"]}}
    results = answer_joint_requests(loaded, [parse_request("ok", long), requests()[0]])
    assert isinstance(results[0], BadQuestion) and "max_len" in str(results[0])
    assert results[1] == answer_joint_requests(loaded, requests()[:1])[0]


@pytest.fixture(scope="module")
def exported(lm_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("served") / "decision-qwen3"
    export_joint(fresh(lm_folder), out, TEMPERATURES, {"owner": "team"})
    return out


def test_the_decision_api_serves_an_export(exported):
    from pipeline.serving.catalog import Catalog, export_name
    from pipeline.serving.keys import KeyStore
    from pipeline.serving.server import create_app

    state = STATES[0]
    with TestClient(create_app(Catalog(str(exported)), KeyStore())) as client:
        deadline = time.monotonic() + 60
        while client.get("/healthz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/healthz").json()
            time.sleep(0.05)
        response = client.post("/v1/systemone", json={"state": state, "questions": QUESTIONS})
        long = {"huge": {"type": "noul", "instructions": "why " * 400}}
        too_long = client.post("/v1/systemone", json={"state": state, "questions": long})
    assert response.status_code == 200, response.text
    body = response.json()
    [expected] = answer_joint_requests(load_joint(exported), [parse_request(state, QUESTIONS)])
    assert body["model"] == export_name(exported) != exported.name  # named by its manifest, not its folder
    assert body["usage"] == {"input_tokens": expected.input_tokens, "output_tokens": 0}
    tone, intensity, positive = (body["answers"][q] for q in ("tone", "intensity", "positive"))
    automate = {"x_automate", "x_automate_reason"}  # no certificates here: never automated
    assert set(tone) == {"type", "choice", "probabilities", "confidence", "x_top_probability"} | automate
    assert list(tone["probabilities"]) == ["negative", "neutral", "positive"]
    shape = {"type", "score", "legend", "probabilities", "confidence", "x_top_probability"} | automate
    assert set(intensity) == shape
    assert intensity["legend"] == {"0": "none", "1": "mild", "2": "strong"}
    assert set(positive) == {"type", "noul", "x_confidence"} | automate
    np.testing.assert_allclose(
        probabilities([Answered(body["answers"], 0)]), probabilities([expected]), atol=1e-4
    )
    assert too_long.status_code == 422
    assert too_long.json()["detail"][0]["loc"] == ["body", "questions"]
