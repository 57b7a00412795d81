"""A server's cache of isolated field vectors: a question's (or option's) field sequence pooled once per
model.

cache = FieldCache()
batch["field_vectors"] = cache.fill(model, batch, distinct_field_keys(records), device)
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from pipeline.families.joint.records import FieldKey

PASS = 256


class FieldCache:
    """Pooled field vectors of isolated field sequences, least recently used dropped first.

    A field vector is a function of its sequence and the model's frozen weights, so a server computes each
    question's (and option's) once; the state is all a repeated question costs.
    """

    def __init__(self, capacity: int = 8192):
        self.capacity, self.vectors, self.weights = capacity, OrderedDict(), None
        # A server's inference thread and an in-process caller may share a model.
        self._lock = threading.Lock()

    def fill(
        self, model, batch: dict, keys: list[FieldKey], device: torch.device, encoder=None
    ) -> torch.Tensor:
        """[U, d] vectors of the batch's field sequences (`keys`: `distinct_field_keys` of its records, in the
        batch's order): cached ones looked up, the others computed and kept (their hidden states by `encoder`,
        another runtime's pass of `model.hidden_states`, when given)."""
        with self._lock:
            self._forget_if_changed(model, encoder)
            return self._fill(model, batch, keys, device, encoder or model.hidden_states)

    def _fill(self, model, batch: dict, keys: list[FieldKey], device: torch.device, encoder) -> torch.Tensor:
        missing = [i for i, key in enumerate(keys) if key not in self.vectors]
        # A pass of at most PASS sequences: a request of 64 questions with 255 options each has 16,384 of
        # them.
        for start in range(0, len(missing), PASS):
            part = missing[start : start + PASS]
            for i, vector in zip(part, self._computed(model, batch, part, device, encoder)):
                self.vectors[keys[i]] = vector
        for key in keys:
            self.vectors.move_to_end(key)
        vectors = torch.stack([self.vectors[key] for key in keys])
        # Evicted after the lookup: one request may hold more sequences than the capacity.
        while len(self.vectors) > self.capacity:
            self.vectors.popitem(last=False)
        return vectors.to(device)

    @staticmethod
    def _computed(model, batch: dict, rows: list[int], device: torch.device, encoder) -> torch.Tensor:
        part = {
            name: batch[name][rows].to(device)
            for name in ("field_input_ids", "field_attention_mask", "field_spans")
        }
        hidden = encoder(part["field_input_ids"], part["field_attention_mask"]).to(device)
        with torch.autocast(device.type, enabled=False):  # the head's pooling in fp32, as in its forward pass
            return model.head.field_vectors(hidden, part).float().cpu()

    def _forget_if_changed(self, model, encoder) -> None:
        """Drop every vector when any weight changed since they were computed (an optimizer step, a load: each
        in-place update bumps a tensor's version counter), or when another runtime computes them (a parity
        check compares the runtimes' own vectors, never one's cached for the other)."""
        weights = (sum(p._version for p in model.parameters()), id(encoder))
        if weights != self.weights:
            self.vectors.clear()
            self.weights = weights
