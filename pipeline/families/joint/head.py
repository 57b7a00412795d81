"""Decision head on a causal LM (the joint family): a causal LM read for its last hidden states, never for its
vocabulary logits.

The second model family beside the Laya encoder models (`pipeline.families.laya_layout`). A batch from
`pipeline.families.joint.records.collate_records` goes through the LM's body (`backbone_body`) only;
`JointHead` turns the last hidden states into one logit per option. The LM's output projection is used as a
table, not a layer: the head gathers the rows of its weight for each option's tokens (a lexical prior), so no
[B, T, vocab] tensor is ever computed.

    lm = load_causal_lm("models/qwen3-0.6b", dtype=torch.bfloat16)
    model = JointDecisionModel(lm)
    loss = joint_loss(model(batch), batch, target)
"""

from __future__ import annotations

import math

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

    def forward(self, fields, field_pad, memory, memory_pad, groups: int = 1):
        """`groups` > 1: `fields` [B * groups, G, d] are groups that attend among themselves, and a row's
        groups together query its memory [B, T, d] (each query on its own, so the keys are projected once per
        row)."""
        x = self.self_norm(fields)
        fields = fields + self.self_attn(x, x, x, key_padding_mask=field_pad, need_weights=False)[0]
        x = self.cross_norm(fields)
        rows = x.reshape(memory.shape[0], groups * x.shape[1], x.shape[2])
        attended = self.cross_attn(rows, memory, memory, key_padding_mask=memory_pad, need_weights=False)[0]
        fields = fields + attended.reshape(fields.shape)
        return fields + self.ff(self.ff_norm(fields))


def _padded(sequences: list[tuple[int, ...]], device: torch.device, chunk: int = 256):
    """Batches (ids [B, T], mask [B, T]) on `device` of `chunk` sequences each, right-padded with 0."""
    for start in range(0, len(sequences), chunk):
        part = [torch.tensor(s, dtype=torch.int64) for s in sequences[start : start + chunk]]
        ids = nn.utils.rnn.pad_sequence(part, batch_first=True)
        mask = torch.arange(ids.shape[1])[None] < torch.tensor([len(s) for s in part])[:, None]
        yield ids.to(device), mask.to(device)


def _once_per_row(values: torch.Tensor, present: torch.Tensor, bound: int) -> torch.Tensor:
    """The values [B, T] (each below `bound`) where present, each value once per row that holds it."""
    row = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(values)
    return torch.unique((row * bound + values)[present]) % bound


class LexicalChannel(nn.Module):
    """A bag of the state's tokens, and with `bigrams` of its adjacent token pairs, scored against each
    option's final field: a word-level path beside the backbone's features, learned from the training rows
    alone.

    A frozen sentence encoder's states keep the gist and lose the words; on State of the Union passages (who
    said it, and when) a bag of single tokens added +0.025 accuracy on a validation split of training
    addresses (mean of two seeds, `benchmarks/bench_head_levers.py`) and +0.027 on `bench_quality.py`'s
    held-out addresses. With `bigrams` (`train.lexicon: tfidf`) the bag is TF-IDF's: `fit` learns the training
    rows' most frequent token pairs (a pair they never had is left out, as TF-IDF leaves out a word it never
    saw) and weighs each entry by its inverse document frequency. That lifted those passages from 0.663 /
    0.685 to 0.703 / 0.700 (seeds 0 / 1) and cost VADER 0.015 (docs/results.md). Without `fit` every token
    weighs 1 and no pair is known: the bag of single tokens (`tokens`, the default).

    Its option projection starts at zero, so a fresh head scores as it would without it. In training,
    `dropout` of the bag's entries are left out.
    """

    NO_PAIR = torch.iinfo(torch.int64).max  # an unused slot of `pairs`, greater than every real pair's key

    def __init__(self, vocabulary: int, width: int, dim: int = 128, dropout: float = 0.3, bigrams: int = 0):
        super().__init__()
        self.dropout, self.vocabulary = dropout, vocabulary
        self.table = nn.Embedding(vocabulary + bigrams, dim)
        nn.init.normal_(self.table.weight, std=0.1)
        self.option = nn.Linear(width, dim)
        nn.init.zeros_(self.option.weight)
        nn.init.zeros_(self.option.bias)
        self.register_buffer("idf", torch.ones(vocabulary + bigrams))
        # The known pairs' keys (first * vocabulary + second), sorted; pair i is row vocabulary + i of the
        # table.
        self.register_buffer("pairs", torch.full((bigrams,), self.NO_PAIR, dtype=torch.int64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A head saved before the weights had neither: every token weighs 1 and no pair is known, as it was
        # trained.
        state_dict.setdefault(prefix + "idf", torch.ones_like(self.idf))
        state_dict.setdefault(prefix + "pairs", self.pairs.clone())
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def entries(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The bag's entries [B, E] (rows of the table) and which are present [B, E]: each attended token,
        then each pair of adjacent attended tokens that is a known pair."""
        ids, live = self._tokens(input_ids, attention_mask)
        if not len(self.pairs) or ids.shape[1] < 2:
            return ids, live
        keys, both = self._adjacent(ids, live)
        slot = torch.searchsorted(self.pairs, keys).clamp(max=len(self.pairs) - 1)
        known = (self.pairs[slot] == keys) & both
        pair_rows = (self.vocabulary + slot).masked_fill(~known, 0)
        return torch.cat([ids, pair_rows], 1), torch.cat([live, known], 1)

    def _tokens(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids with every token outside the bag set to 0, and which tokens are in it (attended, in
        vocabulary)."""
        live = attention_mask.bool() & (input_ids < self.vocabulary)
        return input_ids.masked_fill(~live, 0), live

    def _adjacent(self, ids: torch.Tensor, live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each adjacent pair's key (first * vocabulary + second) [B, T - 1], and whether both tokens are in
        the bag."""
        return ids[:, :-1] * self.vocabulary + ids[:, 1:], live[:, :-1] & live[:, 1:]

    @torch.no_grad()
    def fit(self, sequences: list[tuple[int, ...]]) -> None:
        """Learn the pairs and the weights from the training rows' state token ids: the `bigrams` pairs that
        most rows hold (of those in two rows or more), and per entry idf = ln((1 + n) / (1 + df)) + 1,
        scikit-learn's smooth idf, or 0 for an entry no training row holds."""
        self.pairs.fill_(self.NO_PAIR)
        if not sequences:
            return
        batches = list(
            _padded(sequences, self.idf.device)
        )  # read twice: the pairs, then the rows holding each entry
        if len(self.pairs):
            pairs = [self._distinct_pairs(*batch) for batch in batches]
            keys, rows = torch.unique(torch.cat(pairs), return_counts=True)
            frequent = torch.argsort(rows, descending=True, stable=True)[: len(self.pairs)]
            chosen = keys[frequent[rows[frequent] >= 2]].sort().values
            self.pairs[: len(chosen)] = chosen
        df = sum(self._entry_rows(*batch) for batch in batches)
        self.idf.copy_((torch.log((1.0 + len(sequences)) / (1.0 + df)) + 1.0).masked_fill(df == 0, 0.0))

    def _distinct_pairs(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Every adjacent token pair's key, once per row that holds it."""
        keys, both = self._adjacent(*self._tokens(ids, mask))
        return _once_per_row(keys, both, self.vocabulary**2)

    def _entry_rows(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[table rows]: how many of the batch's rows hold each entry."""
        entries, present = self.entries(ids, mask)
        return torch.bincount(_once_per_row(entries, present, len(self.idf)), minlength=len(self.idf)).float()

    def bag(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, dim]: the entries' rows weighed by their idf, over the root of the sum of the squared weights:
        TF-IDF's l2 norm where no entry repeats (a repeated one adds its square once per time, the norm heads
        before `fit` had, so they score as they did)."""
        rows, present = self.entries(input_ids, attention_mask)
        weights = present.float() * self.idf[rows]
        if self.training and self.dropout:
            weights = weights * (torch.rand_like(weights) >= self.dropout)
        weights = weights / weights.square().sum(1, keepdim=True).sqrt().clamp(min=1e-12)
        # embedding_bag sums the weighted rows without the [B, E, dim] gather a long state's thousands of
        # entries cost
        return F.embedding_bag(rows, self.table.weight, per_sample_weights=weights, mode="sum")

    def forward(self, batch: dict, options: torch.Tensor) -> torch.Tensor:
        """[B, Q, K] logits from the batch's state tokens and the final option fields [B, Q, K, width]."""
        bag = self.bag(batch["input_ids"], batch["attention_mask"])
        return torch.einsum("bqkd,bd->bqk", self.option(options), bag)


class JointHead(nn.Module):
    """Scores every option of every question of a row jointly from the LM's last hidden states, in fp32.

    Fields [global, questions..., options...] are pooled from the memory (the hidden states projected to
    `width`), then refined by `layers` blocks of self-attention among fields and cross-attention to the
    memory. With `lexicon` (a vocabulary size; 0: none), a `LexicalChannel` on the state's tokens adds to each
    logit. `isolated`: each question's fields (the global field, its own and its options') attend among
    themselves only, so a question's answer depends on it and the state alone, never on the row's other
    questions.
    """

    def __init__(
        self,
        hidden_size: int,
        width: int = 256,
        heads: int = 4,
        layers: int = 2,
        chunk: int = 2048,
        dropout: float = 0.0,
        read_layers: int = 1,
        lexicon: int = 0,
        isolated: bool = False,
        bigrams: int = 0,
    ):
        super().__init__()
        self.chunk, self.read_layers, self.isolated = chunk, read_layers, isolated
        self.lexical = LexicalChannel(lexicon, width, bigrams=bigrams) if lexicon else None
        # The memory is the backbone's last `read_layers` hidden states side by side, each normalised on its
        # own. With several, the norm has no affine of its own: the projection after it would absorb one
        # anyway.
        self.memory_norm = nn.LayerNorm(hidden_size, elementwise_affine=read_layers == 1)
        self.memory_proj = nn.Linear(hidden_size * read_layers, width)
        self.prior_norm = nn.LayerNorm(hidden_size)
        self.prior_proj = nn.Linear(hidden_size, width)
        self.type_emb = nn.Embedding(N_QUESTION_TYPES, width)
        self.blocks = nn.ModuleList(_FieldBlock(width, heads, dropout) for _ in range(layers))
        self.out_norm = nn.LayerNorm(width)
        self.scorer = nn.Sequential(nn.Linear(2 * width, width), nn.GELU(), nn.Linear(width, 1))

    def forward(
        self,
        hidden: torch.Tensor,
        batch: dict,
        prior_weight: torch.Tensor,
        field_hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, Q, K] from hidden states [B, T, H] and the output-embedding weight [V, H].

        With the fields apart, `hidden` is the state's and `field_hidden` [U, Tq, H] holds each distinct field
        sequence of the batch (`batch["field_index"]` says which one a row reads); the spans index those.
        """
        if "field_spans" in batch:
            memory, global_vec, questions, options = self._isolated_pools(hidden, field_hidden, batch)
        elif field_hidden is None:
            memory, global_vec, questions, options = self._memory_and_pools(hidden, batch)
        else:
            memory, global_vec, questions, options = self._apart_pools(hidden, field_hidden, batch)
        questions = questions + self.type_emb(batch["qtype"].clamp(0, N_QUESTION_TYPES - 1))
        options = options + self._lexical_prior(batch, prior_weight)
        if self.isolated:
            return self._isolated_logits(memory, global_vec, questions, options, batch)
        b, q, k, d = options.shape
        valid = _valid_options(batch)
        # Only real options become fields (a noul question padded to a score's five levels would add three).
        order = torch.argsort((~valid).reshape(b, q * k).to(torch.int8), dim=1, stable=True)
        order = order[:, : int(valid.reshape(b, -1).sum(1).max())]
        packed = options.reshape(b, q * k, d).gather(1, order[..., None].expand(-1, -1, d))
        fields = torch.cat([global_vec[:, None], questions, packed], dim=1)
        # The global field is never padding, so no row's self-attention has every key masked.
        real = valid.reshape(b, q * k).gather(1, order)
        field_pad = ~torch.cat([valid.new_ones(b, 1), batch["question_mask"].bool(), real], 1)
        memory_pad = ~batch["attention_mask"].bool()
        for block in self.blocks:
            fields = block(fields, field_pad, memory, memory_pad)
        fields = self.out_norm(fields)
        unpacked = (
            fields.new_zeros(b, q * k, d)
            .scatter(1, order[..., None].expand(-1, -1, d), fields[:, 1 + q :])
            .reshape(b, q, k, d)
        )
        logits = self._score(fields[:, 1 : 1 + q], unpacked)
        if self.lexical is not None:
            logits = logits + self.lexical(batch, unpacked)
        return logits.masked_fill(~valid, PAD_LOGIT)

    def _isolated_logits(self, memory, global_vec, questions, options, batch: dict) -> torch.Tensor:
        """[B, Q, K]: each question's fields [global, question, options] refined apart from every other
        question's, each group attending to its row's memory (padded options and questions are masked
        keys)."""
        b, q, k, d = options.shape
        valid = _valid_options(batch)
        fields = torch.cat([global_vec[:, None, None].expand(b, q, 1, d), questions[:, :, None], options], 2)
        field_pad = ~torch.cat([valid.new_ones(b, q, 1), batch["question_mask"].bool()[..., None], valid], 2)
        memory_pad = ~batch["attention_mask"].bool()
        fields, field_pad = fields.reshape(b * q, k + 2, d), field_pad.reshape(b * q, k + 2)
        for block in self.blocks:
            fields = block(fields, field_pad, memory, memory_pad, groups=q)
        fields = self.out_norm(fields).reshape(b, q, k + 2, d)
        logits = self._score(fields[:, :, 1], fields[:, :, 2:])
        if self.lexical is not None:
            logits = logits + self.lexical(batch, fields[:, :, 2:])
        return logits.masked_fill(~valid, PAD_LOGIT)

    def field_vectors(self, field_hidden: torch.Tensor, batch: dict) -> torch.Tensor:
        """[U, d]: each isolated field sequence's pooled field (the mean of its span), before any attention; a
        function of the sequence alone, so a server can cache it per question text."""
        spans = (batch["field_spans"][:, None],)
        _, (_, pooled) = self._pooled(field_hidden, batch["field_attention_mask"].bool(), spans)
        return pooled[:, 0]

    def _isolated_pools(self, hidden: torch.Tensor, field_hidden: torch.Tensor | None, batch: dict):
        """Questions isolated: the state's memory and mean; each question's and option's field from its own
        sequence (given pooled as `field_vectors` where a cache had them)."""
        memory, (state_mean,) = self._pooled(hidden, batch["attention_mask"].bool(), ())
        vectors = batch.get("field_vectors")
        if vectors is None:
            vectors = self.field_vectors(field_hidden, batch)
        return memory, state_mean[:, 0], vectors[batch["question_field"]], vectors[batch["option_field"]]

    def _score(self, questions: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        """[B, Q, K] from the final question [B, Q, d] and option [B, Q, K, d] fields: each option scored
        beside its own question."""
        pair = torch.cat([options, questions[:, :, None].expand(-1, -1, options.shape[2], -1)], dim=-1)
        return self.scorer(pair).squeeze(-1)

    def _memory_and_pools(self, hidden: torch.Tensor, batch: dict):
        """The projected memory [B, T, d] and the global, question and option means (fields in the
        sequence)."""
        b = hidden.shape[0]
        spans = (batch["question_spans"], batch["option_spans"].flatten(1, 2))
        memory, means = self._pooled(hidden, batch["attention_mask"].bool(), spans)
        q, k = batch["option_mask"].shape[1:]
        return memory, means[0][:, 0], means[1], means[2].reshape(b, q, k, -1)

    def _apart_pools(self, hidden: torch.Tensor, field_hidden: torch.Tensor, batch: dict):
        """Fields apart: the state's memory and mean; question and option means pooled once per distinct field
        sequence (rows that share one share its spans), then handed to each row that reads it."""
        index = batch["field_index"]
        first = torch.zeros(field_hidden.shape[0], dtype=torch.long, device=index.device)
        first.scatter_reduce_(
            0, index, torch.arange(len(index), device=index.device), "amin", include_self=False
        )
        spans = (batch["question_spans"][first], batch["option_spans"][first].flatten(1, 2))
        memory, (state_mean,) = self._pooled(hidden, batch["attention_mask"].bool(), ())
        _, (_, questions, options) = self._pooled(field_hidden, batch["field_attention_mask"].bool(), spans)
        q, k = batch["option_mask"].shape[1:]
        return memory, state_mean[:, 0], questions[index], options[index].reshape(len(index), q, k, -1)

    def _pooled(self, hidden: torch.Tensor, attended: torch.Tensor, spans: tuple[torch.Tensor, ...]):
        """The projected hidden states [N, T, d] and the means over all attended tokens and over each span
        set, one chunk at a time: a running sum and count per field, so any chunk size gives the same
        means."""
        t = hidden.shape[1]
        sums, counts, pieces = [0.0] * (1 + len(spans)), [0.0] * (1 + len(spans)), []
        for start in range(0, t, self.chunk):
            end = min(start + self.chunk, t)
            projected = self._project_chunk(hidden[:, start:end])
            pieces.append(projected)
            for i, mask in enumerate(_chunk_masks(attended[:, start:end], start, spans)):
                sums[i] = sums[i] + torch.einsum("bnc,bcd->bnd", mask, projected)
                counts[i] = counts[i] + mask.sum(-1, keepdim=True)
        means = [total / count.clamp(min=1.0) for total, count in zip(sums, counts)]
        return torch.cat(pieces, dim=1), means

    def _project_chunk(self, chunk: torch.Tensor) -> torch.Tensor:
        """[B, C, d] fp32 from a chunk of hidden states in any dtype.

        Only this chunk is ever cast to fp32. When gradients flow into the backbone, the projection is
        recomputed in the backward pass (checkpoint), so the fp32 copies and normalised activations are not
        kept for it either.
        """
        if torch.is_grad_enabled() and chunk.requires_grad:
            return checkpoint(self._project, chunk, use_reentrant=False)
        # A frozen backbone's states: the projection's input is all its backward keeps, so nothing to
        # recompute.
        return self._project(chunk)

    def _project(self, chunk: torch.Tensor) -> torch.Tensor:
        layers = chunk.float().unflatten(-1, (self.read_layers, -1))  # each layer normalised on its own
        return self.memory_proj(self.memory_norm(layers).flatten(-2))

    def _lexical_prior(self, batch: dict, prior_weight: torch.Tensor) -> torch.Tensor:
        """[B, Q, K, d]: the mean output-embedding row of each option's tokens, normalised and projected."""
        mask = batch["option_token_mask"].bool()
        tokens = batch["option_tokens"].masked_fill(~mask, 0)  # padding ids may lie outside the vocabulary
        rows = F.embedding(tokens, prior_weight).float()  # [B, Q, K, L, H]: gathered rows, not a projection
        weights = mask.float()[..., None]
        mean = (rows * weights).sum(-2) / weights.sum(-2).clamp(min=1.0)
        return self.prior_proj(self.prior_norm(mean))


class HeadEnsemble(nn.Module):
    """Heads trained apart on the same backbone's hidden states, answering together: each question's
    probabilities are the mean of theirs (its logits their log, so a softmax gives that mean back).

    The heads differ where training made them differ (`train.lexicon: both` trains a `tokens` and a `tfidf`
    head); they read the same layers, so the backbone runs once for all of them and only the heads' cost is
    paid again. On State of the Union passages from new addresses the two together scored 0.715 where the
    better head alone scored 0.703 and the other 0.663 (docs/results.md, "Two heads together").
    """

    def __init__(self, members: list[JointHead]):
        super().__init__()
        if len({(m.read_layers, m.isolated) for m in members}) != 1:
            raise ValueError("an ensemble's heads must read the same layers and isolate questions alike")
        self.members = nn.ModuleList(members)
        first = members[0]
        self.read_layers, self.isolated, self.chunk = first.read_layers, first.isolated, first.chunk

    def forward(
        self,
        hidden: torch.Tensor,
        batch: dict,
        prior_weight: torch.Tensor,
        field_hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, Q, K]: the log of the members' mean probabilities; padded options get -1e4."""
        vectors = batch.get("field_vectors")
        parts = [None] * len(self.members) if vectors is None else vectors.split(self._widths(), -1)
        logp = []
        for member, part in zip(self.members, parts):
            own = batch if part is None else {**batch, "field_vectors": part}  # this member's cached fields
            logp.append(F.log_softmax(member(hidden, own, prior_weight, field_hidden), dim=-1))
        mean = torch.logsumexp(torch.stack(logp), 0) - math.log(len(logp))
        return mean.masked_fill(~_valid_options(batch), PAD_LOGIT)

    def field_vectors(self, field_hidden: torch.Tensor, batch: dict) -> torch.Tensor:
        """[U, members * d]: each member's pooled fields side by side (a server caches them per question
        text)."""
        return torch.cat([member.field_vectors(field_hidden, batch) for member in self.members], -1)

    def _widths(self) -> list[int]:
        return [member.memory_proj.out_features for member in self.members]


def by_windows(
    run, input_ids: torch.Tensor, attention_mask: torch.Tensor, window: int | None
) -> torch.Tensor:
    """`run(ids, mask)`'s hidden states [B, T, H] of states laid out as `records.windowed_state` lays them:
    each `window` tokens a sequence of its own, read in one pass with the other rows' windows (windows that
    are all padding are not run), then put back side by side. `window` None, or a batch that fits one: one
    plain pass."""
    b, t = input_ids.shape
    if window is None or t <= window:
        return run(input_ids, attention_mask)
    count = -(-t // window)
    ids = F.pad(input_ids, (0, count * window - t)).reshape(b * count, window)
    mask = F.pad(attention_mask, (0, count * window - t)).reshape(b * count, window)
    live = mask.bool().any(1)
    width = int(mask.sum(1).max())  # each window is right-padded: none is longer than this
    hidden = run(ids[live, :width], mask[live, :width])
    out = hidden.new_zeros(b * count, window, hidden.shape[-1])
    out[live, :width] = hidden
    return out.reshape(b, count * window, -1)[:, :t]


class JointDecisionModel(nn.Module):
    """A backbone (a causal LM, plain or peft-wrapped, or an encoder) and a `JointHead` (or a `HeadEnsemble`
    of them) on its last hidden states.

    `state_window`: the state's sequence is windows of this many tokens, each read on its own (`by_windows`);
    None (the default): one sequence.
    """

    def __init__(self, lm: nn.Module, head: JointHead | HeadEnsemble | None = None):
        super().__init__()
        self.lm = lm
        self.head = head if head is not None else JointHead(vocabulary_table(lm).shape[1])
        self.state_window: int | None = None  # set with the layout (`layout.set_state_windows`)

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits [B, Q, K]; padded options get -1e4.

        A batch that carries the backbone's hidden states (`state_hidden`, and `field_hidden` with the fields
        apart: features of a frozen backbone computed once) goes to the head without a backbone pass.
        """
        if "state_hidden" in batch:
            hidden, fields = batch["state_hidden"], batch.get("field_hidden")
        else:
            hidden = self.state_hidden_states(batch["input_ids"], batch["attention_mask"])
            fields = None
            if "field_input_ids" in batch and "field_vectors" not in batch:
                fields = self.hidden_states(batch["field_input_ids"], batch["field_attention_mask"])
        # The head runs in fp32 even inside the backbone's autocast: under CPU bf16 autocast its many small
        # matrices ran 1.5x slower (measured: 147 vs 92 ms per 64-row batch), and its logits stay exact.
        with torch.autocast(hidden.device.type, enabled=False):
            return self.head(hidden, batch, vocabulary_table(self.lm), fields)

    def state_hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """`hidden_states` of the states' sequences, window by window (`state_window`)."""
        return by_windows(self.hidden_states, input_ids, attention_mask, self.state_window)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """What the head reads: the backbone's last hidden states [B, T, H], or its last `read_layers` layers'
        side by side [B, T, read_layers * H]."""
        # use_cache=False: a training or scoring pass never decodes, so a KV cache is only memory.
        many = self.head.read_layers > 1
        out = backbone_body(self.lm)(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_hidden_states=many
        )
        return (
            torch.cat(out.hidden_states[-self.head.read_layers :], dim=-1) if many else out.last_hidden_state
        )


def joint_loss(
    logits: torch.Tensor,
    batch: dict,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    brier_weight: float = 0.0,
    ordinal_weight: float = 0.0,
) -> torch.Tensor:
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
