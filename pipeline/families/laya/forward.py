"""The decision forward pass used by training and scoring, and length-grouped scoring.

`decision_logits` computes the same option logits per sequence as laya's `DecisionModel.forward` (a test holds
them equal in fp32) but runs only what the loss needs: the encoder (under autocast when asked), then the head
in fp32, and not the act head, whose output no loss here uses. `item_logits` gathers them per decision, across
the sequences of a decision whose options did not fit one.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.families.base import EncoderRun
from pipeline.families.forward_passes import autocast_context, length_batches
from pipeline.families.laya.items import Item, collate_parts, item_parts, join_logits
from pipeline.families.runtimes.onnx_encoder import EncoderPass
from pipeline.scoring.calibration import softmax

MASKED_LOGIT = -1e4


def decision_logits(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    dtype: torch.dtype | None = None,
    encoder: EncoderRun | None = None,
):
    """Option logits [sequences, markers] in fp32, masked options at -1e4; `encoder` (another runtime's pass
    of `encoder_pass(model)`) in place of the model's own encoder when given."""
    device = batch["input_ids"].device
    attention_mask = batch["attention_mask"]
    with autocast_context(device, dtype):
        if encoder is None:
            hidden = model.encoder(
                input_ids=batch["input_ids"], attention_mask=attention_mask
            ).last_hidden_state
        else:
            hidden = encoder(batch["input_ids"], attention_mask).to(device)
    hidden = hidden.float() + model.type_emb(batch["qtype"])[:, None, :]
    index = batch["marker_pos"].clamp(min=0)[:, :, None].expand(-1, -1, hidden.size(-1))
    layers = list(model.head.layers) if model.head is not None else []
    padding = ~attention_mask.bool()
    for layer in layers[:-1]:
        hidden = layer(hidden, src_key_padding_mask=padding)
    if layers and layers[-1].norm_first:
        at_markers = last_layer_at(layers[-1], hidden, padding, index)
    else:
        at_markers = torch.gather(
            layers[-1](hidden, src_key_padding_mask=padding) if layers else hidden, 1, index
        )
    logits = model.scorer(at_markers).squeeze(-1).float()
    return logits.masked_fill(~batch["marker_mask"], MASKED_LOGIT)


def encoder_pass(model: torch.nn.Module) -> EncoderPass:
    """The Laya model's encoder as `(input_ids, attention_mask) -> last hidden states` (what an ONNX export
    holds)."""
    return EncoderPass(
        model.encoder, lambda ids, mask: model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    )


def last_layer_at(
    layer: torch.nn.TransformerEncoderLayer, hidden: torch.Tensor, padding: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """A pre-norm encoder layer's output at the gathered positions only (the option markers the scorer reads).

    Keys and values still come from every token, so this equals the full layer at those positions, but the
    query, output and feed-forward projections run on a few positions instead of the whole sequence.
    """
    normed = layer.norm1(hidden)
    queries = torch.gather(normed, 1, index)
    attended = layer.self_attn(queries, normed, normed, key_padding_mask=padding, need_weights=False)[0]
    x = torch.gather(hidden, 1, index) + layer.dropout1(attended)
    return x + layer.dropout2(layer.linear2(layer.dropout(layer.activation(layer.linear1(layer.norm2(x))))))


def item_logits(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each item's option logits [items, options] from its sequences' (`decision_logits`, in `items.collate`'s
    batch), masked options at -1e4; for items of one sequence each, the same values as `logits`."""
    return logits.reshape(-1)[batch["options"]].masked_fill(~batch["option_mask"], MASKED_LOGIT)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-item cross-entropy against a target distribution over each item's own options."""
    log_probs = torch.log_softmax(logits.masked_fill(~mask, MASKED_LOGIT), -1)
    return -(target * log_probs * mask).sum(-1)


@torch.no_grad()
def score_items(
    model: torch.nn.Module,
    items: list[Item],
    pad_id: int,
    device: torch.device,
    batch_size: int = 32,
    dtype: torch.dtype | None = None,
    progress: bool = False,
    logits: bool = False,
) -> list[np.ndarray]:
    """Option probabilities (or raw logits) for each item, in the caller's order; eager, no-grad, sequences
    grouped by length. An item of several sequences gets one softmax over all its options."""
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    parts = item_parts(items)
    results: list[np.ndarray | None] = [None] * len(parts)
    batches = length_batches([len(part) for part in parts], batch_size)
    for indices in tqdm(batches, desc="scoring", unit="batch", disable=not progress, leave=False):
        batch = {k: v.to(device) for k, v in collate_parts([parts[i] for i in indices], pad_id).items()}
        scores = decision_logits(model, batch, dtype).cpu().numpy()
        for row, index in enumerate(indices):
            results[index] = scores[row, : len(parts[index].markers)]
    model.train(was_training)
    joined = join_logits(items, results)
    return joined if logits else [softmax(z) for z in joined]
