"""The serving forward pass on packed tokens: a batch's sequences laid end to end, with no padding.

The padded pass (`forward.decision_logits`) runs every linear layer on batch x longest positions. Here the
embeddings, projections, feed-forward layers and norms run on [tokens, width] where every token is real, so a
pass costs what its tokens cost (12% fewer positions at concurrency 8 on the VADER requests, and one large
matrix product per layer instead of one per padded batch). Only attention pads: sequences sorted by length go
through it in chunks of similar length, each padded to its own longest. The last head layer runs at the option
markers only, as in the padded pass. The answer equals `decision_logits` up to float rounding (tests/model/
test_packed_forward.py), and a sequence's answer does not depend on its batch-mates (padding is never
attended).

    if packs(model):
        logits = packed_logits(model, parts)      # one [options] tensor per sequence, in the caller's order

It covers BERT-style encoders (absolute positions, post-norm layers: MiniLM and the BERT family) under the
Laya head; any other encoder keeps the padded pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertModel

from pipeline.families.forward_passes import autocast_context, length_batches
from pipeline.families.laya.sequences import Part
from pipeline.families.planned_layers import visited_layers

PACKED_PASS = 64  # sequences per pass: a concurrency-8 batch of 5-question requests (40) is one pass, 1.08x
# faster than passes of 16 (forward only, the VADER requests of bench_serve.py)
ATTENTION_CHUNK = 16  # sequences per attention call: similar lengths, little padding in the only padded step


@dataclass(frozen=True)
class Chunk:
    """Consecutive packed sequences that share one padded attention call."""

    start: int  # first packed token
    end: int
    slots: torch.Tensor  # each token's place in the chunk's [rows * width] grid
    keys: torch.Tensor  # [rows, 1, 1, width]: True at real tokens
    rows: int
    width: int
    marker_start: int  # first of the chunk's markers in packed marker order
    marker_end: int
    marker_slots: torch.Tensor  # each marker's place in the chunk's [rows * most_markers] grid
    most_markers: int


@dataclass(frozen=True)
class PackedBatch:
    """Sequences sorted longest first and laid end to end."""

    ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens], from 0 in each sequence
    sequence: torch.Tensor  # [tokens]: the packed sequence each token belongs to
    qtype: torch.Tensor  # [sequences]
    markers: torch.Tensor  # [markers]: packed token index of every option marker, sequence by sequence
    marker_counts: list[int]  # per packed sequence
    order: list[int]  # order[j]: the caller's index of packed sequence j
    chunks: list[Chunk]


def packs(model: nn.Module) -> bool:
    """Whether `model` (a Laya-layout DecisionModel) can run the packed pass."""
    encoder, head = getattr(model, "encoder", None), getattr(model, "head", None)
    return (
        type(encoder) is BertModel
        and getattr(encoder.config, "position_embedding_type", "absolute") == "absolute"
        and head is not None
        and all(isinstance(layer, nn.TransformerEncoderLayer) and layer.norm_first for layer in head.layers)
    )


def pack(parts: list[Part], device: torch.device, chunk: int = ATTENTION_CHUNK) -> PackedBatch:
    """The packed layout of `parts` (longest first, so each attention chunk holds similar lengths)."""
    order = length_batches([len(part) for part in parts], len(parts))[0]
    ordered = [parts[i] for i in order]
    lengths = torch.tensor([len(it) for it in ordered])
    starts = torch.cumsum(lengths, 0) - lengths
    sequence = torch.repeat_interleave(torch.arange(len(ordered)), lengths)
    positions = torch.arange(int(lengths.sum())) - starts[sequence]
    counts = [len(it.markers) for it in ordered]
    markers = torch.tensor([int(starts[j]) + m for j, it in enumerate(ordered) for m in it.markers])
    chunks, marker_start = [], 0
    for first in range(0, len(ordered), chunk):
        group = range(first, min(first + chunk, len(ordered)))
        chunks.append(_chunk(group, lengths, starts, counts, marker_start, device))
        marker_start = chunks[-1].marker_end
    return PackedBatch(
        ids=torch.tensor([t for it in ordered for t in it.ids], device=device),
        positions=positions.to(device),
        sequence=sequence.to(device),
        qtype=torch.tensor([it.qtype for it in ordered], device=device),
        markers=markers.to(device),
        marker_counts=counts,
        order=order,
        chunks=chunks,
    )


def _chunk(group: range, lengths, starts, counts: list[int], marker_start: int, device) -> Chunk:
    rows, width = len(group), int(lengths[group.start])  # longest first: the chunk's first is its longest
    most = max(counts[j] for j in group)
    slots = torch.cat([j * width + torch.arange(int(lengths[g])) for j, g in enumerate(group)])
    keys = torch.arange(width)[None, :] < lengths[group.start : group.stop, None]
    marker_slots = torch.cat([j * most + torch.arange(counts[g]) for j, g in enumerate(group)])
    start = int(starts[group.start])
    return Chunk(
        start=start,
        end=start + len(slots),
        slots=slots.to(device),
        keys=keys[:, None, None, :].to(device),
        rows=rows,
        width=width,
        marker_start=marker_start,
        marker_end=marker_start + len(marker_slots),
        marker_slots=marker_slots.to(device),
        most_markers=most,
    )


@torch.inference_mode()
def packed_logits(
    model: nn.Module, parts: list[Part], dtype: torch.dtype | None = None
) -> list[torch.Tensor]:
    """Option logits (fp32) per sequence in the caller's order; the encoder under autocast when `dtype` is
    given, the head in fp32, as `decision_logits` runs them."""
    device = next(model.parameters()).device
    batch = pack(parts, device)
    with autocast_context(device, dtype):
        hidden = encoder_states(model.encoder, batch)
    hidden = hidden.float() + model.type_emb(batch.qtype)[batch.sequence]
    layers = list(model.head.layers)
    for layer in layers[:-1]:
        hidden = head_layer(layer, hidden, batch)
    logits = model.scorer(head_layer(layers[-1], hidden, batch, at_markers=True)).squeeze(-1).float()
    packed = torch.split(logits, batch.marker_counts)
    out: list[torch.Tensor | None] = [None] * len(parts)
    for j, index in enumerate(batch.order):
        out[index] = packed[j]
    return out


def encoder_states(encoder: BertModel, batch: PackedBatch) -> torch.Tensor:
    """The BERT encoder's last hidden states [tokens, width] (its layer plan followed)."""
    embeddings = encoder.embeddings
    hidden = embeddings.LayerNorm(
        embeddings.word_embeddings(batch.ids)
        + embeddings.position_embeddings(batch.positions)
        + embeddings.token_type_embeddings.weight[0]  # one segment: token type 0, as the padded pass feeds
    )
    heads = encoder.config.num_attention_heads
    for layer in visited_layers(encoder):
        attention = layer.attention
        own = attention.self
        context = attend(own.query(hidden), own.key(hidden), own.value(hidden), heads, batch)
        hidden = attention.output.LayerNorm(attention.output.dense(context) + hidden)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(hidden))
        hidden = layer.output.LayerNorm(layer.output.dense(inner) + hidden)
    return hidden


def head_layer(
    layer: nn.TransformerEncoderLayer, hidden: torch.Tensor, batch: PackedBatch, at_markers: bool = False
) -> torch.Tensor:
    """A pre-norm head layer on packed tokens; with `at_markers`, its output at the option markers only (keys
    and values still from every token, so it equals the full layer there)."""
    attention, width = layer.self_attn, hidden.size(-1)
    normed = layer.norm1(hidden)
    weight, bias = attention.in_proj_weight, attention.in_proj_bias
    keys = F.linear(normed, weight[width : 2 * width], bias[width : 2 * width])
    values = F.linear(normed, weight[2 * width :], bias[2 * width :])
    if at_markers:
        hidden, normed = hidden[batch.markers], normed[batch.markers]
    queries = F.linear(normed, weight[:width], bias[:width])
    attended = attend(queries, keys, values, attention.num_heads, batch, at_markers)
    hidden = hidden + attention.out_proj(attended)
    return hidden + layer.linear2(layer.activation(layer.linear1(layer.norm2(hidden))))


def attend(queries, keys, values, heads: int, batch: PackedBatch, at_markers: bool = False) -> torch.Tensor:
    """Scaled dot-product attention of packed queries (every token's, or with `at_markers` every marker's)
    over their own sequence's keys, one padded call per chunk; packed output in the queries' order."""
    out = torch.empty_like(queries)
    for chunk in batch.chunks:
        grid_keys = _grid(keys[chunk.start : chunk.end], chunk.slots, chunk.rows, chunk.width, heads)
        grid_values = _grid(values[chunk.start : chunk.end], chunk.slots, chunk.rows, chunk.width, heads)
        if at_markers:
            span, slots, width = (
                slice(chunk.marker_start, chunk.marker_end),
                chunk.marker_slots,
                chunk.most_markers,
            )
        else:
            span, slots, width = slice(chunk.start, chunk.end), chunk.slots, chunk.width
        grid_queries = _grid(queries[span], slots, chunk.rows, width, heads)
        attended = F.scaled_dot_product_attention(grid_queries, grid_keys, grid_values, attn_mask=chunk.keys)
        out[span] = attended.transpose(1, 2).reshape(chunk.rows * width, -1)[slots]
    return out


def _grid(packed: torch.Tensor, slots: torch.Tensor, rows: int, width: int, heads: int) -> torch.Tensor:
    """Packed [n, d] into the padded [rows, heads, width, d / heads] layout attention takes (zeros at
    padding)."""
    grid = packed.new_zeros(rows * width, packed.size(-1))
    grid[slots] = packed
    return grid.view(rows, width, heads, -1).transpose(1, 2)
