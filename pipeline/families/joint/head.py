"""Decision head on a decoder LLM: a causal LM read for its last hidden states, never for its vocabulary logits.

The second model family beside the Laya encoder models (`pipeline.families.laya.layout`). A batch from
`pipeline.families.joint.records.collate_records` goes through the LM's body (`backbone_body`) only; `JointHead` turns the
last hidden states into one logit per option. The LM's output projection is used as a table, not a layer: the
head gathers the rows of its weight for each option's tokens (a lexical prior), so no [B, T, vocab] tensor is
ever computed.

    lm = load_causal_lm("models/qwen3-0.6b", dtype=torch.bfloat16)
    model = JointDecisionModel(lm)
    loss = joint_loss(model(batch), batch, target)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipeline.data.contract import QUESTION_TYPES, SCORE_TYPE_ID
from pipeline.families.joint.backbone import backbone_body, vocabulary_table

PAD_LOGIT = -1e4
N_QUESTION_TYPES = len(QUESTION_TYPES)


def _span_membership(positions: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """[..., C] float: 1 where a position lies in the span [start, end) of [..., 2]."""
    start, end = spans[..., :1], spans[..., 1:]
    return ((positions >= start) & (positions < end)).float()


def _valid_options(batch: dict) -> torch.Tensor:
    """[B, Q, K] bool: real options of real questions."""
    return batch["option_mask"].bool() & batch["question_mask"].bool()[..., None]


def _chunk_masks(live: torch.Tensor, start: int, spans: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Pooling weights [B, N, C] for a chunk starting at `start`: all attended tokens, then each span set.

    Spans are cut to attended tokens, so a span never pools padding whatever the collator wrote.
    """
    live = live.float()[:, None]
    positions = torch.arange(start, start + live.shape[-1], device=live.device)
    return [live, *(_span_membership(positions, s) * live for s in spans)]


class _FieldBlock(nn.Module):
    """Pre-norm block: fields attend to each other, then to the memory, then a feed-forward."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.self_norm = nn.LayerNorm(width)
        self.self_attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.cross_norm = nn.LayerNorm(width)
        self.cross_attn = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.ff_norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * width, width)
        )

    def forward(self, fields, field_pad, memory, memory_pad):
        x = self.self_norm(fields)
        fields = fields + self.self_attn(x, x, x, key_padding_mask=field_pad, need_weights=False)[0]
        x = self.cross_norm(fields)
        fields = (
            fields + self.cross_attn(x, memory, memory, key_padding_mask=memory_pad, need_weights=False)[0]
        )
        return fields + self.ff(self.ff_norm(fields))


class JointHead(nn.Module):
    """Scores every option of every question of a row jointly from the LM's last hidden states, in fp32.

    Fields [global, questions..., options...] are pooled from the memory (the hidden states projected to
    `width`), then refined by `layers` blocks of self-attention among fields and cross-attention to the memory.
    """

    def __init__(self, hidden_size: int, width: int = 256, heads: int = 4, layers: int = 2, chunk: int = 2048,
                 dropout: float = 0.0):  # fmt: skip
        super().__init__()
        self.chunk = chunk
        self.memory_norm = nn.LayerNorm(hidden_size)
        self.memory_proj = nn.Linear(hidden_size, width)
        self.prior_norm = nn.LayerNorm(hidden_size)
        self.prior_proj = nn.Linear(hidden_size, width)
        self.type_emb = nn.Embedding(N_QUESTION_TYPES, width)
        self.blocks = nn.ModuleList(_FieldBlock(width, heads, dropout) for _ in range(layers))
        self.out_norm = nn.LayerNorm(width)
        self.scorer = nn.Sequential(nn.Linear(2 * width, width), nn.GELU(), nn.Linear(width, 1))

    def forward(self, hidden: torch.Tensor, batch: dict, prior_weight: torch.Tensor) -> torch.Tensor:
        """Logits [B, Q, K] from hidden states [B, T, H] and the output-embedding weight [V, H]."""
        memory, global_vec, questions, options = self._memory_and_pools(hidden, batch)
        questions = questions + self.type_emb(batch["qtype"].clamp(0, N_QUESTION_TYPES - 1))
        options = options + self._lexical_prior(batch, prior_weight)
        b, q, k, d = options.shape
        valid = _valid_options(batch)
        fields = torch.cat([global_vec[:, None], questions, options.reshape(b, q * k, d)], dim=1)
        # The global field is never padding, so no row's self-attention has every key masked.
        field_pad = ~torch.cat([valid.new_ones(b, 1), batch["question_mask"].bool(), valid.reshape(b, -1)], 1)
        memory_pad = ~batch["attention_mask"].bool()
        for block in self.blocks:
            fields = block(fields, field_pad, memory, memory_pad)
        return self._score(self.out_norm(fields), q, k).masked_fill(~valid, PAD_LOGIT)

    def _score(self, fields: torch.Tensor, q: int, k: int) -> torch.Tensor:
        """[B, Q, K] from the final fields: each option scored beside its own question."""
        b, _, d = fields.shape
        questions, options = fields[:, 1 : 1 + q], fields[:, 1 + q :].reshape(b, q, k, d)
        pair = torch.cat([options, questions[:, :, None].expand(-1, -1, k, -1)], dim=-1)
        return self.scorer(pair).squeeze(-1)

    def _memory_and_pools(self, hidden: torch.Tensor, batch: dict):
        """The projected memory [B, T, d] and the global, question and option means, one chunk at a time.

        Pooling is a running sum and count per field, so any chunk size gives the same means.
        """
        b, t, _ = hidden.shape
        attended = batch["attention_mask"].bool()
        spans = (batch["question_spans"], batch["option_spans"].flatten(1, 2))
        sums, counts, pieces = [0.0] * 3, [0.0] * 3, []
        for start in range(0, t, self.chunk):
            end = min(start + self.chunk, t)
            projected = self._project_chunk(hidden[:, start:end])
            pieces.append(projected)
            for i, mask in enumerate(_chunk_masks(attended[:, start:end], start, spans)):
                sums[i] = sums[i] + torch.einsum("bnc,bcd->bnd", mask, projected)
                counts[i] = counts[i] + mask.sum(-1, keepdim=True)
        means = [total / count.clamp(min=1.0) for total, count in zip(sums, counts)]
        q, k = batch["option_mask"].shape[1:]
        return torch.cat(pieces, dim=1), means[0][:, 0], means[1], means[2].reshape(b, q, k, -1)

    def _project_chunk(self, chunk: torch.Tensor) -> torch.Tensor:
        """[B, C, d] fp32 from a chunk of hidden states in any dtype.

        Only this chunk is ever cast to fp32. Under autograd the projection is recomputed in the backward
        pass (checkpoint), so the fp32 copies and normalised activations are not kept for it either.
        """
        if torch.is_grad_enabled():
            return checkpoint(self._project, chunk, use_reentrant=False)
        return self._project(chunk)

    def _project(self, chunk: torch.Tensor) -> torch.Tensor:
        return self.memory_proj(self.memory_norm(chunk.float()))

    def _lexical_prior(self, batch: dict, prior_weight: torch.Tensor) -> torch.Tensor:
        """[B, Q, K, d]: the mean output-embedding row of each option's tokens, normalised and projected."""
        mask = batch["option_token_mask"].bool()
        tokens = batch["option_tokens"].masked_fill(~mask, 0)  # padding ids may lie outside the vocabulary
        rows = F.embedding(tokens, prior_weight).float()  # [B, Q, K, L, H]: gathered rows, not a projection
        weights = mask.float()[..., None]
        mean = (rows * weights).sum(-2) / weights.sum(-2).clamp(min=1.0)
        return self.prior_proj(self.prior_norm(mean))


class JointDecisionModel(nn.Module):
    """A backbone (a causal LM, plain or peft-wrapped, or an encoder) and a `JointHead` on its last hidden states."""

    def __init__(self, lm: nn.Module, head: JointHead | None = None):
        super().__init__()
        self.lm = lm
        self.head = head if head is not None else JointHead(vocabulary_table(lm).shape[1])

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits [B, Q, K]; padded options get -1e4."""
        # use_cache=False: a training or scoring pass never decodes, so a KV cache is only memory.
        out = backbone_body(self.lm)(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        )
        return self.head(out.last_hidden_state, batch, vocabulary_table(self.lm))

    def head_parameters(self) -> list[nn.Parameter]:
        """The head's parameters (for an optimizer group of their own, e.g. a higher learning rate)."""
        return list(self.head.parameters())


def joint_loss(logits: torch.Tensor, batch: dict, target: torch.Tensor, label_smoothing: float = 0.0,
                 brier_weight: float = 0.0, ordinal_weight: float = 0.0) -> torch.Tensor:  # fmt: skip
    """Soft cross-entropy over each question's own options, mean over real questions, plus optional terms.

    `label_smoothing` mixes the target with the uniform distribution over the question's options (for the
    cross-entropy only); `brier_weight` adds the squared error of the softmax against the target;
    `ordinal_weight` adds, for score questions, the squared gap between the expected levels of the softmax and
    of the target, in units of the scale's span (levels - 1), averaged over the score questions.
    """
    valid = _valid_options(batch)
    real = valid.any(-1)
    logp = F.log_softmax(logits.float().masked_fill(~valid, PAD_LOGIT), dim=-1)
    target = target.float() * valid
    n_options = valid.sum(-1, keepdim=True).clamp(min=1)
    smoothed = (1 - label_smoothing) * target + label_smoothing * valid / n_options
    loss = _mean_over(-(smoothed * logp).sum(-1), real)
    probs = logp.exp() * valid
    if brier_weight:
        loss = loss + brier_weight * _mean_over(((probs - target) ** 2).sum(-1), real)
    if ordinal_weight:
        loss = loss + ordinal_weight * _ordinal_term(
            probs, target, n_options, real & (batch["qtype"] == SCORE_TYPE_ID)
        )
    return loss


def _ordinal_term(probs, target, n_options, score_questions) -> torch.Tensor:
    levels = torch.arange(probs.shape[-1], device=probs.device, dtype=probs.dtype)
    gap = ((probs - target) * levels).sum(-1) / (n_options.squeeze(-1) - 1).clamp(min=1)
    return _mean_over(gap**2, score_questions)


def _mean_over(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` holds; 0 (still in the graph) when nothing does."""
    return (values * mask).sum() / mask.sum().clamp(min=1)
