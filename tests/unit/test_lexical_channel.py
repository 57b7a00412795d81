"""The joint head's lexical channel as a bag of words: which token pairs it learns from the training rows, and
that its bag weighs what it holds as scikit-learn's TF-IDF does (smooth idf, l2 norm) on rows without a
repeated entry."""

from itertools import pairwise

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import TfidfVectorizer

from pipeline.families.joint.head import LexicalChannel

VOCABULARY = 20
ROWS = [(2, 5, 6, 7, 3), (2, 5, 6, 3), (2, 5, 6, 9, 3), (2, 8, 7, 3), (2, 7, 8, 5, 3)]


def _pair(first: int, second: int) -> int:
    return first * VOCABULARY + second


def _channel(bigrams: int, rows=ROWS) -> LexicalChannel:
    channel = LexicalChannel(VOCABULARY, width=4, dim=3, bigrams=bigrams).eval()
    channel.fit(rows)
    return channel


def _batch(rows) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows) + 2  # right padding with id 0, which the mask leaves out
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    return ids, (ids != 0).long()


def test_the_pairs_are_those_in_two_rows_or_more_most_frequent_first_sorted():
    # (2, 5) and (5, 6) are in three rows, (7, 3) in two, every other pair in one
    channel = _channel(bigrams=8)
    known = [int(k) for k in channel.pairs if k != LexicalChannel.NO_PAIR]
    assert known == sorted([_pair(2, 5), _pair(5, 6), _pair(7, 3)])
    assert (channel.pairs[len(known) :] == LexicalChannel.NO_PAIR).all()  # free slots never match
    fewer = _channel(bigrams=2)  # room for two: those in the most rows
    assert fewer.pairs.tolist() == [_pair(2, 5), _pair(5, 6)]


def _entries(row, channel) -> list[str]:
    known = {int(k) for k in channel.pairs}
    pairs = [f"{a}_{b}" for a, b in pairwise(row) if _pair(a, b) in known]
    return [str(t) for t in row] + pairs


def test_the_weights_and_the_bag_are_scikit_learns_tfidf_of_the_same_entries():
    channel = _channel(bigrams=8)
    vectorizer = TfidfVectorizer(analyzer=lambda row: _entries(row, channel), smooth_idf=True, norm="l2")
    tfidf = vectorizer.fit_transform(ROWS).toarray()
    names = vectorizer.get_feature_names_out()
    rows_of = {}
    for name in names:
        first, _, second = name.partition("_")
        rows_of[name] = (
            int(first)
            if not second
            else VOCABULARY + int(torch.searchsorted(channel.pairs, _pair(int(first), int(second))))
        )
    for name, idf in zip(names, vectorizer.idf_):
        assert channel.idf[rows_of[name]].item() == pytest.approx(idf, rel=1e-6), name
    assert channel.idf[1].item() == 0.0  # a token no training row holds weighs nothing, as TF-IDF drops it
    table = channel.table.weight.detach().numpy()
    expected = tfidf @ table[[rows_of[n] for n in names]]
    with torch.no_grad():
        bag = channel.bag(*_batch(ROWS)).numpy()
    np.testing.assert_allclose(bag, expected, rtol=1e-5, atol=1e-6)


def test_before_fit_the_bag_is_the_single_tokens_over_the_root_of_their_count():
    channel = LexicalChannel(VOCABULARY, width=4, dim=3, bigrams=8).eval()
    ids, mask = _batch([(2, 5, 5, 3), (2, 30, 3)])  # 30 is past the vocabulary: left out
    with torch.no_grad():
        bag = channel.bag(ids, mask)
    rows = channel.table.weight.detach()
    torch.testing.assert_close(bag[0], (rows[2] + 2 * rows[5] + rows[3]) / 2.0)
    torch.testing.assert_close(bag[1], (rows[2] + rows[3]) / 2**0.5)


def test_a_repeated_entry_counts_once_per_occurrence_in_the_sum_and_in_the_norm():
    channel = _channel(bigrams=8)
    with torch.no_grad():
        bag = channel.bag(*_batch([(9, 8, 9)]))
    rows, idf = channel.table.weight.detach(), channel.idf
    expected = (2 * idf[9] * rows[9] + idf[8] * rows[8]) / (2 * idf[9] ** 2 + idf[8] ** 2).sqrt()
    torch.testing.assert_close(bag[0], expected)


def test_a_pair_split_by_padding_or_unknown_is_not_in_the_bag():
    channel = _channel(bigrams=8)
    with torch.no_grad():
        both = channel.bag(*_batch([(2, 5)]))
        alone = channel.bag(*_batch([(2,), (5,)]))
    rows, idf = channel.table.weight.detach(), channel.idf
    pair = VOCABULARY + int(torch.searchsorted(channel.pairs, _pair(2, 5)))
    weights = torch.stack([idf[2], idf[5], idf[pair]])
    expected = (weights[:, None] * rows[[2, 5, pair]]).sum(0) / weights.norm()
    torch.testing.assert_close(both[0], expected)
    torch.testing.assert_close(alone[0], rows[2])  # one entry: its row, whatever its weight
    entries, present = channel.entries(*_batch([(5, 2)]))  # (5, 2) is no known pair
    assert entries[present].tolist() == [5, 2]


def test_fit_on_no_rows_leaves_no_pairs_and_an_empty_bag():
    channel = _channel(bigrams=4, rows=[])
    assert (channel.pairs == LexicalChannel.NO_PAIR).all() and (channel.idf == 1).all()
