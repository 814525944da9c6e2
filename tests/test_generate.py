import numpy as np
import pytest

from mpisdnn.errors import UsageError
from mpisdnn.formats.tsv import read_weight_tsv
from mpisdnn.generate import base_layer, digit_images, radixnet


@pytest.mark.parametrize("k", range(1, 7))
def test_base_layers_equal_kron_formula(k):
    m = 64
    b = np.eye(m) + np.roll(np.eye(m), -(2 ** (k - 1)), axis=1)
    expected = np.kron(np.ones((16, 16)), b) * 0.0625
    np.testing.assert_array_equal(base_layer(1024, k).toarray(), expected.astype(np.float32))


def test_first_six_layers_equal_official_files(official_dir):
    net = radixnet(1024, 6, seed=123)
    for k in range(6):
        official = read_weight_tsv(official_dir / f"n1024-l{k + 1}.tsv", 1024)
        assert (official != net.layers[k]).nnz == 0, f"layer {k + 1} differs"


def test_official_later_blocks_are_row_remapped_base_layers(official_dir):
    """Checks the structural claim the generator relies on, on the official files."""
    base = [base_layer(1024, k).toarray() for k in range(1, 7)]
    for layer in (7, 13, 61):
        w = read_weight_tsv(official_dir / f"n1024-l{layer}.tsv", 1024).toarray()
        b = base[(layer - 1) % 6][:64]
        match = (w[:, None, :] == b[None, :, :]).all(axis=2)
        assert match.any(axis=1).all()
        assert np.bincount(match.argmax(axis=1), minlength=64).tolist() == [16] * 64


@pytest.mark.parametrize("neurons", [1024, 4096])
def test_generated_blocks_structure(neurons):
    m = neurons // 16
    depth = int(np.log2(m))
    net = radixnet(neurons, 2 * depth + 1, seed=7)
    assert len(net) == 2 * depth + 1
    for w in net.layers:
        assert (np.diff(w.indptr) == 32).all()
        assert (np.bincount(w.indices, minlength=neurons) == 32).all()
        assert np.all(w.data == np.float32(0.0625))
    base = [base_layer(neurons, k) for k in range(1, depth + 1)]
    # Block 0 is unmapped; block 1 remaps rows with one map for all its layers.
    for k in range(depth):
        assert (net.layers[k] != base[k]).nnz == 0
    assert (net.layers[depth] != base[0]).nnz > 0
    assert (net.layers[2 * depth] != base[0]).nnz > 0
    default_bias = {1024: -0.3, 4096: -0.35}[neurons]
    assert np.all(net.bias == np.float32(default_bias))


def test_generator_is_seeded():
    a, b, c = radixnet(1024, 13, seed=1), radixnet(1024, 13, seed=1), radixnet(1024, 13, seed=2)
    assert all((x != y).nnz == 0 for x, y in zip(a.layers, b.layers))
    assert any((x != y).nnz for x, y in zip(a.layers, c.layers))


@pytest.mark.parametrize("n", [1000, 48, 16 * 48])
def test_bad_neuron_counts(n):
    with pytest.raises(UsageError):
        radixnet(n, 3)


def test_images_density_and_correlation():
    y = digit_images(2000, 1024, seed=3)
    per_row = np.diff(y.indptr)
    assert 95 <= per_row.mean() <= 125  # official files: ~106 per row at N=1024
    assert per_row.min() > 0
    assert np.all(y.data == 1)
    # Spatially correlated strokes: an ink pixel's right neighbour is far more often ink than
    # the overall density would give for uniform noise.
    img = y[:200].toarray().reshape(200, 32, 32)
    both = (img[:, :, :-1] * img[:, :, 1:]).sum() / img[:, :, :-1].sum()
    assert both > 3 * per_row.mean() / 1024


def test_images_scale_four_times_per_size_step():
    a = digit_images(300, 1024, seed=9)
    b = digit_images(300, 4096, seed=9)
    assert b.nnz == 4 * a.nnz
    assert np.array_equal(digit_images(50, 1024, seed=1).indices, digit_images(50, 1024, 1).indices)


def test_images_bad_size():
    with pytest.raises(UsageError):
        digit_images(10, 1000)
