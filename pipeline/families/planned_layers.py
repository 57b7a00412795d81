"""Run a backbone's layers as a layer plan says (`pipeline.layer_plans`), sharing parameters between visits.

Embeddings, masks, rotary position embeddings and the final norm run once, natively; only the layer loop
follows the plan.

    plan = resolve_plan([(2, 4, 2)], layer_count(backbone))
    apply_layer_plan(backbone, plan)       # BERT-like encoders, Qwen3 / Llama decoders
    apply_layer_plan(backbone, None)       # native execution again, same weights

The physical layers stay where they are (`named_parameters`, `state_dict` and checkpoint keys unchanged, one
copy of each parameter, LoRA adapters on a layer shared by its visits, autograd summing every visit). What
changes is what the native forward loop iterates: `PlannedLayers`, kept in the layer container's instance
attributes where it shadows the registered ModuleList for attribute access only.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torch import nn

from pipeline.layer_plans import LayerPlan, LayerPlanError, resolve_plan


class PlannedLayers(nn.ModuleList):
    """The physical layers (same objects, same indices), iterated as the plan says.

    Native forward loops index the config by loop position (Qwen3's `layer_types[i]`) and slice the list to
    `config.num_hidden_layers`, so iterating yields as many entries as there are physical layers: the first
    runs every visit of the plan, the rest hand the hidden states through. Indexing and `len` stay physical,
    so `get_submodule("...layers.3")`, peft and the export see the real layers. `physical` is the registered
    list.
    """

    def __init__(self, physical: nn.ModuleList, plan: LayerPlan) -> None:
        super().__init__(list(physical))
        # Not registered: the view's own entries are the physical layers, and nothing may count them twice.
        self.__dict__["physical"] = physical
        self.plan = plan

    def visited(self) -> list[nn.Module]:
        return [self.physical[i] for i in self.plan.visits]

    def __iter__(self):
        return iter(self._slots())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._slots()[index]
        return super().__getitem__(index)

    def _slots(self) -> list[Any]:
        return [_PlanRun(self.visited())] + [_hand_through] * (len(self.physical) - 1)


class _PlanRun:
    """Every visit of a plan, each called with the arguments the native loop gives its first layer."""

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers

    def __call__(self, hidden_states, *args, **kwargs):
        if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            raise LayerPlanError(
                "a layer plan runs without a KV cache (a repeated layer would write its slot twice)"
            )
        for layer in self.layers:
            hidden_states = layer(hidden_states, *args, **kwargs)
        return hidden_states


def _hand_through(hidden_states, *args, **kwargs):
    return hidden_states


def _layer_home(backbone: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the backbone's layer list and its attribute name: BERT-like `encoder.layer`, or a
    decoder's `layers` (Qwen3, Llama; also under a causal LM's `model`)."""
    candidates = [backbone, getattr(backbone, "encoder", None), getattr(backbone, "model", None)]
    if hasattr(backbone, "get_decoder"):
        candidates.append(backbone.get_decoder())
    for module in candidates:
        for name in ("layer", "layers"):
            if isinstance(module, nn.Module) and isinstance(module._modules.get(name), nn.ModuleList):
                return module, name
    raise LayerPlanError(
        f"a layer plan needs a BERT-like encoder (encoder.layer) or a decoder (layers); "
        f"{type(backbone).__name__} has neither"
    )


def physical_layers(backbone: nn.Module) -> nn.ModuleList:
    """The backbone's registered layer list (each layer once, in physical order), planned or not."""
    home, name = _layer_home(backbone)
    return home._modules[name]


def layer_count(backbone: nn.Module) -> int:
    return len(physical_layers(backbone))


def visited_layers(backbone: nn.Module) -> list[nn.Module]:
    """The backbone's layers in the order its forward runs them: its plan's visits, else the physical
    layers."""
    plan = current_plan(backbone)
    layers = physical_layers(backbone)
    return [layers[i] for i in plan.visits] if plan is not None else list(layers)


def current_plan(backbone: nn.Module) -> LayerPlan | None:
    """The plan `backbone` runs (None: native, also for a backbone that could not run one)."""
    view = next((v for v in vars(_home_or_none(backbone)).values() if isinstance(v, PlannedLayers)), None)
    return view.plan if view is not None else None


def _home_or_none(backbone: nn.Module) -> nn.Module:
    try:
        return _layer_home(backbone)[0]
    except LayerPlanError:
        return backbone


def apply_layer_plan(backbone: nn.Module, plan: LayerPlan | None) -> None:
    """Run `backbone`'s layers as `plan` says from the next forward on (None: natively). Only between optimizer
    steps: a gradient accumulated under one plan must not meet a backward under another."""
    home, name = _layer_home(backbone)
    physical = home._modules[name]
    if any(p.grad is not None for p in physical.parameters()):
        raise LayerPlanError("the layer plan may change only between optimizer steps (gradients are pending)")
    home.__dict__.pop(name, None)
    if plan is None:
        return
    if plan.layers != len(physical):
        raise LayerPlanError(f"the plan is for {plan.layers} layers; the backbone has {len(physical)}")
    _refuse_mixed_attention(home)
    # Set past nn.Module.__setattr__, which would register the view in place of the physical list.
    home.__dict__[name] = PlannedLayers(physical, plan)


def _refuse_mixed_attention(home: nn.Module) -> None:
    """A decoder whose layers attend differently (sliding-window next to full) needs a mask per visit; the
    native loop hands out one per position, so such a backbone cannot run a plan here."""
    types = getattr(getattr(home, "config", None), "layer_types", None)
    if types and len(set(types)) > 1:
        raise LayerPlanError(
            f"{type(home).__name__} mixes attention types by layer ({sorted(set(types))}); a layer "
            "plan runs only on backbones whose layers all attend alike"
        )


def freeze_skipped(backbone: nn.Module) -> None:
    """Layers the plan never visits get no gradient: freeze them, so neither the optimizer nor DDP waits on
    them."""
    plan = current_plan(backbone)
    if plan is None:
        return
    for index in plan.skipped:
        physical_layers(backbone)[index].requires_grad_(False)


def configure_plan(
    backbone: nn.Module, saved: Sequence[int] | None, wanted: Sequence[Any] | None
) -> list[int] | None:
    """Apply the plan a run asks for (`train.layer_plan`), else the one the folder was saved with; the plan to
    record in the model's config (None: native)."""
    spec = wanted if wanted is not None else saved
    if spec is None and current_plan(backbone) is None:
        return None  # native already: also for a backbone that could not run a plan
    plan = resolve_plan(spec, layer_count(backbone))
    apply_layer_plan(backbone, plan)
    return plan.to_json() if plan is not None else None


def materialise_plan(backbone: nn.Module) -> LayerPlan | None:
    """Rewrite `backbone` (a copy: it is changed in place) as a native stack that runs like its plan: skipped
    layers dropped, a repeated layer written out as copies, the config's layer count (and layer types) to
    match. Returns the plan it had (None: nothing to do). What a reader without plans (`laya.Agent`) can
    load."""
    plan = current_plan(backbone)
    if plan is None:
        return None
    home, name = _layer_home(backbone)
    physical = home._modules[name]
    apply_layer_plan(backbone, None)
    layers, seen = [], set()
    for index in plan.visits:
        layers.append(copy.deepcopy(physical[index]) if index in seen else physical[index])
        seen.add(index)
    for position, layer in enumerate(layers):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):  # the KV-cache slot a layer writes: its new position
                module.layer_idx = position
    setattr(home, name, nn.ModuleList(layers))
    config = getattr(backbone, "config", None)
    if config is not None:
        if getattr(config, "layer_types", None):
            config.layer_types = [config.layer_types[i] for i in plan.visits]
        config.num_hidden_layers = len(layers)
    return plan


def plan_manifest(plan: LayerPlan | None, form: str) -> dict[str, Any] | None:
    """What `manifest.json` says of an export's plan: its visits, the physical layer count, and the form
    written (`plan`: the physical layers and the plan in the config; `materialised`: a native stack that runs
    like it)."""
    if plan is None:
        return None
    return {"visits": plan.to_json(), "physical_layers": plan.layers, "form": form}
