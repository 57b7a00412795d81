"""Layer plans on the backbones, against oracles: the identity plan is native execution exactly, a repeated
layer is a hand-built stack calling that module twice (outputs and the summed gradient), and parameters,
checkpoint keys, LoRA adapters and optimizer state stay single."""

import copy

import pytest
import torch
from torch import nn

from pipeline.families.joint.backbone import backbone_body
from pipeline.families.planned_layers import (
    apply_layer_plan,
    current_plan,
    freeze_skipped,
    materialise_plan,
    physical_layers,
)
from pipeline.layer_plans import LayerPlanError, resolve_plan
from pipeline.training.compile import encoder_layers
from tests.tiny import tiny_model

LAYERS = 4
REPEAT = [0, 1, 1, 2, 3]


def _encoder():
    return tiny_model(seed=1, layers=LAYERS).encoder.train()  # train mode: dropout 0, gradients as trained


def _causal_lm(arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_class, model_class = {
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[arch]
    torch.manual_seed(2)
    config = config_class(
        vocab_size=200,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    return model_class(config).train()


BACKBONES = {"bert": _encoder, "qwen3": lambda: _causal_lm("qwen3"), "llama": lambda: _causal_lm("llama")}


def _inputs():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding: the attention mask has to reach every visit
    return ids, mask


def _hidden(backbone: nn.Module) -> torch.Tensor:
    ids, mask = _inputs()
    return backbone_body(backbone)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def _grads(backbone: nn.Module) -> dict[str, torch.Tensor]:
    """Forward, a weighted loss (so the gradient depends on every position), backward; the gradients by
    name."""
    hidden = _hidden(backbone)
    weights = torch.linspace(-1, 1, hidden.numel()).reshape(hidden.shape)
    (hidden * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in backbone.named_parameters() if p.grad is not None}
    backbone.zero_grad(set_to_none=True)
    return grads


def _hand_built(backbone: nn.Module, visits: list[int]) -> nn.Module:
    """A copy whose layer list holds the same module objects in plan order: the native loop calls each
    visit."""
    built = copy.deepcopy(backbone)
    home = built.encoder if hasattr(built, "encoder") else built.model
    name = "layer" if hasattr(built, "encoder") else "layers"
    setattr(home, name, nn.ModuleList([getattr(home, name)[i] for i in visits]))
    if getattr(built.config, "layer_types", None):
        built.config.layer_types = [built.config.layer_types[i] for i in visits]
    built.config.num_hidden_layers = len(visits)
    return built


@pytest.mark.parametrize("kind", BACKBONES)
def test_the_identity_plan_is_native_execution_exactly(kind):
    backbone = BACKBONES[kind]()
    native_out, native_grads = _hidden(backbone).detach(), _grads(backbone)
    apply_layer_plan(backbone, resolve_plan(list(range(LAYERS)), LAYERS))
    assert current_plan(backbone).is_identity
    assert torch.equal(_hidden(backbone).detach(), native_out)
    planned_grads = _grads(backbone)
    assert planned_grads.keys() == native_grads.keys()
    assert all(torch.equal(planned_grads[n], native_grads[n]) for n in native_grads)


@pytest.mark.parametrize("kind", BACKBONES)
def test_a_repeated_layer_equals_a_stack_calling_its_module_twice(kind):
    backbone = BACKBONES[kind]()
    built = _hand_built(backbone, REPEAT)
    native = _hidden(backbone).detach()
    apply_layer_plan(backbone, resolve_plan(REPEAT, LAYERS))
    planned = _hidden(backbone)
    torch.testing.assert_close(planned, _hidden(built), rtol=0, atol=0)
    assert (planned - native).abs().max() > 1e-3, (
        "the repeat must change the output, or this test could not fail"
    )
    ours, theirs = _grads(backbone), _grads(built)
    shared = [n for n in ours if ".1." in n and ("layer.1." in n or "layers.1." in n)]
    assert shared, "layer 1's parameters must get a gradient"
    for name in shared:  # autograd sums both visits into the one parameter
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", BACKBONES)
def test_parameters_keys_and_optimizer_state_stay_single(kind):
    backbone = BACKBONES[kind]()
    keys, count = list(backbone.state_dict()), len(list(backbone.parameters()))
    apply_layer_plan(backbone, resolve_plan([0, 1, 2, 3, 0, 1, 2, 3], LAYERS))
    assert list(backbone.state_dict()) == keys and len(list(backbone.parameters())) == count
    assert len(physical_layers(backbone)) == LAYERS
    optimizer = torch.optim.AdamW(backbone.parameters(), lr=1e-3)
    _hidden(backbone).pow(2).mean().backward()
    optimizer.step()
    assert len(optimizer.state) == sum(1 for p in backbone.parameters() if p.grad is not None) <= count


def test_lora_on_a_repeated_layer_is_one_adapter_shared_by_its_visits():
    from peft import LoraConfig, inject_adapter_in_model

    backbone, native = _encoder(), _encoder()
    apply_layer_plan(backbone, resolve_plan(REPEAT, LAYERS))
    for model in (backbone, native):
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]), model)
    lora = lambda m: [n for n, _ in m.named_parameters() if "lora_" in n]  # noqa: E731
    assert lora(backbone) == lora(native) and len(lora(backbone)) == 2 * 2 * LAYERS  # A and B, 2 targets
    with torch.no_grad():  # a non-zero B, so the adapter changes the layer it sits in
        physical_layers(backbone)[1].attention.self.query.lora_B["default"].weight.fill_(0.1)
    built = _hand_built(backbone, REPEAT)
    torch.testing.assert_close(_hidden(backbone), _hidden(built), rtol=0, atol=0)


def test_a_skip_plan_freezes_what_it_never_visits_and_none_restores_native():
    backbone = _encoder()
    native = _hidden(backbone).detach()
    apply_layer_plan(backbone, resolve_plan([0, 1], LAYERS))
    freeze_skipped(backbone)
    frozen = {n for n, p in backbone.named_parameters() if not p.requires_grad}
    assert frozen and all(".layer.2." in n or ".layer.3." in n for n in frozen)
    assert not torch.equal(_hidden(backbone).detach(), native)
    apply_layer_plan(backbone, None)
    assert current_plan(backbone) is None and torch.equal(_hidden(backbone).detach(), native)


def test_the_plan_changes_only_between_optimizer_steps():
    backbone = _encoder()
    apply_layer_plan(backbone, resolve_plan(REPEAT, LAYERS))
    _hidden(backbone).sum().backward()
    with pytest.raises(LayerPlanError, match="only between optimizer steps"):
        apply_layer_plan(backbone, None)
    backbone.zero_grad(set_to_none=True)
    apply_layer_plan(backbone, None)


def test_compile_sees_each_physical_layer_once():
    backbone = _encoder()
    apply_layer_plan(backbone, resolve_plan(REPEAT, LAYERS))
    layers = encoder_layers(backbone)
    assert list(layers) == list(physical_layers(backbone)) and len(set(map(id, layers))) == LAYERS


@pytest.mark.parametrize("kind", BACKBONES)
def test_a_materialised_plan_is_a_native_stack_that_runs_alike(kind):
    backbone = BACKBONES[kind]()
    apply_layer_plan(backbone, resolve_plan([0, 2, 2, 3], LAYERS))
    planned = _hidden(backbone).detach()
    written = copy.deepcopy(backbone)
    materialise_plan(written)
    assert current_plan(written) is None and written.config.num_hidden_layers == 4
    assert "layers.3" in "".join(written.state_dict()) or "layer.3" in "".join(written.state_dict())
    torch.testing.assert_close(_hidden(written), planned, rtol=0, atol=0)
    assert backbone.config.num_hidden_layers == LAYERS  # the original keeps its config


def test_a_causal_lm_whose_layers_attend_differently_refuses_a_plan_by_name():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=200,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=2,
    )
    assert len(set(config.layer_types)) > 1
    with pytest.raises(LayerPlanError, match="mixes attention types"):
        apply_layer_plan(Qwen3ForCausalLM(config), resolve_plan(REPEAT, LAYERS))


def test_a_backbone_without_a_layer_list_cannot_run_a_plan():
    with pytest.raises(LayerPlanError, match="BERT-like encoder"):
        apply_layer_plan(nn.Sequential(nn.Linear(2, 2)), resolve_plan([0], 1))


@pytest.mark.slow
def test_compiled_layers_run_a_plan_as_eager_does():
    from pipeline.training.compile import CompileConfig, compiled_encoder

    torch._dynamo.reset()
    model = tiny_model(seed=1, layers=LAYERS).train()
    apply_layer_plan(model.encoder, resolve_plan(REPEAT, LAYERS))
    ids, mask = _inputs()
    batch = {"input_ids": ids, "attention_mask": mask}

    def loss_fn(m, b):
        return (
            m.encoder(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
            .last_hidden_state.pow(2)
            .mean()
        )

    def grads():
        loss_fn(model, batch).backward()
        found = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return found

    eager = grads()
    config = CompileConfig(
        bucket=16, max_static_len=64, backend="eager"
    )  # dynamo only: the guards, not Inductor
    try:
        with compiled_encoder(model, config, True, "test", [batch], loss_fn) as report:
            assert report.enabled, report.fallback_error
            assert all(layer._compiled_call_impl is not None for layer in physical_layers(model.encoder))
            compiled = grads()
    finally:
        torch._dynamo.reset()
    assert compiled.keys() == eager.keys()
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-5, atol=1e-6)
