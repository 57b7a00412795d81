"""Token ids of the texts that come back row after row (a question's instructions, its options, the prompts),
kept so that a row tokenises its state and nothing else it has seen before.

    cache = TokenCache()
    ids = cache.tokens(tokenizer, texts, fresh=state_text)   # {text: ids}; only `fresh` and unseen texts run

Tokenising is per text (no text's ids depend on another in the same call), so ids from the cache equal ids
from one call over every text. The cost it saves is per call and per text, not per token: on the MiniLM
tokenizer one call over a 5-question request's 20 texts took 1.2 ms, one call over its state alone 0.09 ms,
against a whole joint-family answer of about 10 ms per request on ONNX Runtime or OpenVINO.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


def tokenize(tokenizer: Any, texts: list[str]) -> dict[str, list[int]]:
    """Token ids of each distinct text, in one batch call; special-token strings in user text stay text."""
    unique = list(dict.fromkeys(texts))
    # verbose=False: a state longer than the model is cut into windows later, not an indexing error to warn
    # of.
    encoded = tokenizer(unique, add_special_tokens=False, split_special_tokens=True, verbose=False)[
        "input_ids"
    ]
    return dict(zip(unique, encoded))


class TokenCache:
    """The ids of texts that repeat, least recently used dropped beyond `capacity` texts; one tokenizer's."""

    def __init__(self, capacity: int = 16384) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._tokenizer_id: int | None = None
        # A server's inference thread and an in-process caller may share a model.
        self._lock = threading.Lock()

    @property
    def kept(self) -> list[str]:
        """The texts whose ids are kept, least recently used first."""
        return list(self._ids)

    def tokens(self, tokenizer: Any, texts: list[str], fresh: str) -> dict[str, list[int]]:
        """Ids of every text: `fresh` (a state, seldom seen twice) and the texts not yet kept tokenised in one
        call, the others looked up; every text but `fresh` is kept."""
        with self._lock:
            if id(tokenizer) != self._tokenizer_id:  # another tokenizer's ids would be wrong ids
                self._ids.clear()
                self._tokenizer_id = id(tokenizer)
            distinct = list(dict.fromkeys(texts))
            missing = [text for text in distinct if text not in self._ids or text == fresh]
            found = tokenize(tokenizer, missing) if missing else {}
            out = {}
            for text in distinct:
                out[text] = found[text] if text in found else self._ids[text]
                if text != fresh:
                    self._ids[text] = out[text]
                    self._ids.move_to_end(text)
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)
            return out
