import itertools

import numpy as np
import pytest

from mpisdnn.errors import UsageError
from mpisdnn.partition import (
    BATCHES_PER_STAGE,
    HEAD_LAYERS,
    MIN_BATCH_ROWS,
    MIN_GAIN,
    balanced_blocks,
    balanced_layers,
    default_batch_rows,
    even_blocks,
    head_layers,
    stage_layers,
    stage_layout,
    stage_offsets,
)


def _check_cover(offsets, n, nparts):
    assert offsets.shape == (nparts + 1,)
    assert offsets[0] == 0 and offsets[-1] == n
    assert (np.diff(offsets) >= 0).all()


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("nparts", [1, 2, 3, 7, 64])
def test_balanced_blocks_cover_and_balance_within_one_row(seed, nparts):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    w = rng.integers(0, 50, n) * (rng.random(n) < 0.8)
    off = balanced_blocks(w, nparts)
    _check_cover(off, n, nparts)
    total = w.sum()
    if total:
        per = np.add.reduceat(np.concatenate([w, [0]]), off[:-1]) * (np.diff(off) > 0)
        assert per.sum() == total
        assert np.all(np.abs(per - total / nparts) <= w.max())


def test_heavy_row_ends_the_block_whose_target_it_crosses():
    # Prefix weights 1, 2, 3, 103, ...: the half-way target 53 is crossed by the heavy row,
    # so it closes block 0 (never split, never moved to a block of its own).
    w = np.array([1, 1, 1, 100, 1, 1, 1])
    assert balanced_blocks(w, 2).tolist() == [0, 4, 7]
    # Three parts: both inner targets (35.3, 70.7) fall inside the heavy row, so the middle
    # block is empty rather than splitting it.
    assert balanced_blocks(w, 3).tolist() == [0, 4, 4, 7]
    # A heavy row first: block 0 is that row alone.
    assert balanced_blocks(np.array([100, 1, 1, 1, 1]), 2).tolist() == [0, 1, 5]


def test_more_parts_than_rows():
    w = np.array([3, 0, 5])
    off = balanced_blocks(w, 8)
    _check_cover(off, 3, 8)
    loads = [w[off[k] : off[k + 1]].sum() for k in range(8)]
    assert max(loads) <= w.max() and sum(loads) == w.sum()


def test_all_zero_weights_split_by_count():
    off = balanced_blocks(np.zeros(10), 3)
    assert off.tolist() == even_blocks(10, 3).tolist() == [0, 4, 7, 10]


def test_empty_input():
    assert balanced_blocks([], 3).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("bad", [[-1, 2], [np.nan, 1]])
def test_rejects_bad_weights(bad):
    with pytest.raises(ValueError):
        balanced_blocks(bad, 2)


def test_rejects_zero_parts():
    with pytest.raises(ValueError):
        balanced_blocks([1, 2], 0)


@pytest.mark.parametrize("nparts", [2, 3, 4, 6, 12])
def test_prefix_sums_landing_on_a_target_split_there(nparts):
    """Equal weights that divide evenly give equal blocks; a block starts at the first row
    whose prefix sum reaches its target (ties: the earlier row), so no block ends up one
    row heavier than needed (the ``searchsorted(..., side="right")`` mutant of
    scripts/mutation.py split 12 equal rows on 2 ranks as 7 + 5)."""
    n = 12
    assert balanced_blocks(np.ones(n), nparts).tolist() == list(range(0, n + 1, n // nparts))
    # ties with uneven weights: [3, 1 | 2, 2] is the split that balances (4 + 4, not 6 + 2)
    assert balanced_blocks([3, 1, 2, 2], 2).tolist() == [0, 2, 4]
    # trailing weightless rows after a target reached exactly go to the next block
    assert balanced_blocks([1, 0, 0, 1], 2).tolist() == [0, 1, 4]


def _bottleneck(work, offsets):
    return max(sum(work[a:b]) for a, b in zip(offsets[:-1], offsets[1:]))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("nparts", [1, 2, 3, 4])
def test_balanced_layers_minimise_the_busiest_stage(seed, nparts):
    """Against every split by brute force: the busiest stage is as light as it can be,
    every stage holds a layer, the stages cover the layers in order."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(nparts, 11))
    work = (rng.pareto(1.5, n) * (rng.random(n) < 0.9)).tolist()
    off = balanced_layers(work, nparts)
    _check_cover(off, n, nparts)
    assert (np.diff(off) >= 1).all()
    if sum(work) > 0:
        best = min(
            _bottleneck(work, [0, *cuts, n])
            for cuts in itertools.combinations(range(1, n), nparts - 1)
        )
        assert _bottleneck(work, off) == pytest.approx(best, rel=1e-12)


def test_balanced_layers_on_a_pruned_profile():
    # Work piles up in the first layers (rows die early): an even split would give the
    # first of 2 stages 89 % of it; balanced, the stages differ by less than one layer.
    work = [38, 38, 36, 28, 16, 7.5, 4, 2.5] + [6] * 8 + [0.75] * 104
    off = balanced_layers(work, 2)
    assert off.tolist() == [0, 4, 120]
    assert balanced_layers(work, 3).tolist()[:2] == [0, 2]


def test_balanced_layers_fall_back_to_even():
    assert balanced_layers([0, 0, 0, 0], 2).tolist() == [0, 2, 4]
    assert balanced_layers([5, 1], 3).tolist() == even_blocks(2, 3).tolist()
    assert balanced_layers([], 2).tolist() == [0, 0, 0]
    with pytest.raises(ValueError):
        balanced_layers([1, -1], 2)
    with pytest.raises(ValueError):
        balanced_layers([1.0], 0)


# -- the stage flow's split (mpisdnn infer --stages S) ----------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_stage_layers_cover_the_layers_to_run_without_gap(seed):
    rng = np.random.default_rng(seed)
    first = int(rng.integers(0, 50))
    stop = first + int(rng.integers(0, 200))
    for stages in (1, 2, 3, 5, 8, 13):
        got = [stage_layers(s, stages, first, stop) for s in range(stages)]
        assert got[0][0] == first and got[-1][1] == stop
        assert all(a[1] == b[0] for a, b in zip(got[:-1], got[1:]))
        sizes = [k1 - k0 for k0, k1 in got]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("stages", [2, 3, 4, 8])
@pytest.mark.parametrize("total", [1, 7, 120, 480, 1920])
def test_default_head_keeps_every_rank_within_one_and_a_half_shares(stages, total):
    nh = head_layers(stages, 0, total)
    assert 0 <= nh <= HEAD_LAYERS
    # a rank holds the head and its slice of the rest: at most 1.5x its even share
    held = nh + -(-(total - nh) // stages)
    assert held <= 1.5 * total / stages + 1
    assert head_layers(1, 0, total) == 0  # one stage: every layer is data-parallel


def test_stage_layout_and_head_refuse_with_a_usage_error():
    with pytest.raises(UsageError, match="multiple of 4"):
        stage_layout(6, 4)
    with pytest.raises(UsageError, match="--stages must be >= 1"):
        stage_layout(4, 0)
    for asked in (-1, 121, True, 2.0):
        with pytest.raises(UsageError, match="--stage-head"):
            head_layers(2, 0, 120, asked)


@pytest.mark.parametrize("rows", [0, 1, 255, 256, 257, 10_000, 60_000])
@pytest.mark.parametrize("stages", [1, 2, 3, 8])
def test_default_batch_rows_gives_at_least_the_aimed_batches(rows, stages):
    batch = default_batch_rows(rows, stages)
    assert batch >= 1
    assert batch >= min(MIN_BATCH_ROWS, max(1, rows))
    if rows >= MIN_BATCH_ROWS * BATCHES_PER_STAGE * stages:
        assert -(-rows // batch) == BATCHES_PER_STAGE * stages


def _worst(profile, first, offsets):
    cum = np.concatenate(([0.0], np.cumsum(profile)))
    return max(cum[b - first] - cum[a - first] for a, b in zip(offsets[:-1], offsets[1:]))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_stage_offsets_never_worse_than_even(seed, stages):
    rng = np.random.default_rng(seed)
    first = int(rng.integers(0, 10))
    n = int(rng.integers(stages, 60))
    profile = rng.pareto(1.2, n) * (rng.random(n) < 0.8)
    got = stage_offsets(profile, stages, first, first + n)
    even = [stage_layers(s, stages, first, first + n)[0] for s in range(stages)] + [first + n]
    assert got[0] == first and got[-1] == first + n and len(got) == stages + 1
    assert all(a <= b for a, b in zip(got[:-1], got[1:]))
    if got != even:  # a move only when it gains more than MIN_GAIN
        assert _worst(profile, first, got) < (1 - MIN_GAIN) * _worst(profile, first, even)
    else:
        balanced = (balanced_layers(profile, stages) + first).tolist()
        assert _worst(profile, first, balanced) >= (1 - MIN_GAIN) * _worst(profile, first, even)


@pytest.mark.parametrize("nparts", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("cost", [0.0, 0.5, 2.0])
def test_prefix_segments_give_every_part_the_same_time(nparts, cost):
    """Part r inflates the text up to its segment's end (``cost`` a byte) and parses its
    segment (1 a byte): every part takes the same time; the segments cover [0, 1] in
    order."""
    from mpisdnn.partition import prefix_segments

    s = prefix_segments(nparts, cost)
    # (the late parts of a costly inflate get next to nothing: they only inflate)
    assert s.shape == (nparts + 1,) and s[0] == 0 and s[-1] == 1 and np.all(np.diff(s) >= 0)
    times = cost * s[1:] + np.diff(s)
    assert np.allclose(times, times[0])
    if nparts == 2 and cost == 0.5:
        assert np.allclose(s, [0, 0.6, 1])
    with pytest.raises(ValueError):
        prefix_segments(0, cost)
