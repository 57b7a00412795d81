"""How sequences are grouped into forward passes: longest first, at most a batch size each, and with a padding
bound (another runtime's passes, never packed) no pass computes more than that share of padding."""

import random

import pytest

from pipeline.families.forward_passes import bounded_batches, length_batches


def padding(lengths: list[int], indices: list[int]) -> float:
    return 1 - sum(lengths[i] for i in indices) / (max(lengths[i] for i in indices) * len(indices))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("bound", [0.0, 0.05, 0.2])
def test_every_sequence_runs_once_and_no_pass_of_several_pads_beyond_the_bound(seed, bound):
    lengths = random.Random(seed).choices(range(3, 120), k=90)
    passes = bounded_batches(lengths, 16, bound)
    assert sorted(i for indices in passes for i in indices) == list(range(len(lengths)))
    assert all(len(indices) <= 16 for indices in passes)
    assert all(padding(lengths, indices) <= bound + 1e-12 for indices in passes if len(indices) > 1)
    flat = [lengths[i] for indices in passes for i in indices]
    assert flat == sorted(flat, reverse=True)  # longest first, as the unbounded passes


def test_equal_lengths_fill_whole_passes_and_no_bound_is_the_plain_grouping():
    assert [len(p) for p in bounded_batches([7] * 40, 16, 0.0)] == [16, 16, 8]
    lengths = [30, 4, 18, 18, 5, 29]
    assert bounded_batches(lengths, 4, None) == length_batches(lengths, 4)
    assert bounded_batches(lengths, 4, 0.05) == [[0, 5], [2, 3], [4], [1]]  # 5 and 4 together: 10% padding
    assert bounded_batches(lengths, 4, 0.1) == [[0, 5], [2, 3], [4, 1]]
