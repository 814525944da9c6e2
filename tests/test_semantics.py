"""Layer semantics of every CPU backend against the independent MATLAB-style implementation."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import backends

from .conftest import random_inputs, random_network, run_infer, self_comm
from .matlab_ref import categories, matlab_inference, matlab_layer_dense

BACKENDS = ["reference", "cpu"]


def _layer(name, y, w, b, ymax=32.0):
    be = backends.get(name)
    out = be.layer(be.to_device(sp.csr_matrix(y, dtype=np.float32)), be.to_device(w), b, ymax)
    return sp.csr_matrix(be.to_host(out))


@pytest.mark.parametrize("name", BACKENDS)
def test_bias_not_added_to_cancelled_zero(name):
    # Row 0 of Y*W is exactly 0 in column 0 (1*0.5 + 1*(-0.5)); a positive bias must not
    # resurrect it, while column 1 (non-zero) gets the bias.
    y = np.array([[1.0, 1.0]], dtype=np.float32)
    w = sp.csr_matrix(np.array([[0.5, 0.25], [-0.5, 0.25]], dtype=np.float32))
    out = _layer(name, y, w, np.array([0.7, 0.7], dtype=np.float32))
    assert out.toarray().tolist() == [[0.0, 1.2000000476837158]]
    assert out.nnz == 1  # no explicit zero stored


@pytest.mark.parametrize("name", BACKENDS)
def test_relu_clip_and_zero_drop(name):
    y = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [40.0, 0.0, 1.0]], dtype=np.float32)
    w = sp.csr_matrix(np.array([[1, -1, 0], [1, 0, 0], [0, 0, 1]], dtype=np.float32))
    b = np.float32(-0.5) * np.ones(3, np.float32)
    out = _layer(name, y, w, b).toarray()
    np.testing.assert_array_equal(out, matlab_layer_dense(y, w.toarray(), b))
    assert out[2, 0] == 32.0 and out[0, 1] == 0.0 and not out[1].any()
    assert _layer(name, y, w, b).nnz == np.count_nonzero(out)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_random_layers_match_matlab_semantics(name, seed):
    net = random_network(96, 6, seed=seed, density=0.06)
    y0 = random_inputs(50, 96, seed=seed + 10, density=0.15)
    expected = matlab_inference(y0, net.layers, net.bias)
    res = run_infer(net, y0, backend=name, comm=self_comm())
    np.testing.assert_allclose(res.y_local.toarray(), expected, rtol=1e-5, atol=1e-5)
    assert res.categories.tolist() == categories(expected).tolist()


@pytest.mark.parametrize("name", BACKENDS)
def test_every_row_dies_at_layer_one(name):
    net = random_network(32, 3, seed=1)
    net.bias[:] = -100.0
    res = run_infer(net, random_inputs(20, 32, seed=2), backend=name, comm=self_comm())
    assert res.categories.size == 0 and res.y_local.nnz == 0
    assert res.layer_nnz == [0, 0, 0] and res.y_local.shape == (20, 32)


@pytest.mark.parametrize("name", BACKENDS)
def test_empty_input_rows_and_single_layer(name):
    net = random_network(40, 1, seed=4, negative=False)
    y0 = random_inputs(12, 40, seed=5).tolil()
    y0[3, :] = 0
    y0[7, :] = 0
    y0 = y0.tocsr()
    res = run_infer(net, y0, backend=name, comm=self_comm())
    expected = matlab_inference(y0, net.layers, net.bias)
    np.testing.assert_allclose(res.y_local.toarray(), expected, rtol=1e-6)
    assert 4 not in res.categories and 8 not in res.categories


def test_cpu_batches_give_same_result_as_one_batch():
    net = random_network(64, 4, seed=8, density=0.1)
    y0 = random_inputs(80, 64, seed=9, density=0.2)
    one = run_infer(net, y0, backend="cpu", comm=self_comm())
    many = run_infer(net, y0, backend="cpu", comm=self_comm(), output_reserve=50)
    assert (one.y_local != many.y_local).nnz == 0


def test_unknown_backend():
    from mpisdnn.errors import BackendError

    with pytest.raises(BackendError, match="unknown backend"):
        backends.get("tpu")


def test_cpu_bit_identical_to_reference_on_challenge_structure():
    """Challenge-style data puts sums within rounding of the ReLU threshold; the fixed
    ascending summation order must make the fused kernel agree bit for bit."""
    from mpisdnn.generate import digit_images, radixnet

    net = radixnet(1024, 24, seed=2)
    y0 = digit_images(1500, 1024, seed=3)
    ref = run_infer(net, y0, backend="reference", comm=self_comm())
    cpu = run_infer(net, y0, backend="cpu", comm=self_comm())
    assert (ref.y_local != cpu.y_local).nnz == 0
    assert ref.categories.tolist() == cpu.categories.tolist()
    assert ref.layer_nnz == cpu.layer_nnz


def test_gpu_launch_knobs_are_validated():
    """A launch knob out of range is one clear error, raised before CUDA is touched; an
    unknown knob is a TypeError (no silently ignored keyword)."""
    from mpisdnn.backends.gpu import GpuBackend, GpuLaunch
    from mpisdnn.errors import UsageError

    with pytest.raises(UsageError, match="gpu chunk_rows must be a positive integer, got 0"):
        GpuBackend(0, chunk_rows=0)
    with pytest.raises(UsageError, match="gpu split_rows must be an integer >= 0, got -1"):
        GpuLaunch(split_rows=-1)
    with pytest.raises(UsageError, match="gpu warps must be a positive integer"):
        GpuLaunch(warps=2.5)
    with pytest.raises(TypeError):
        GpuBackend(0, chunk=64)
    zero = GpuLaunch(weight_bytes=0, split_rows=0)  # 0 means "stream all" / "never split"
    assert (zero.weight_bytes, zero.split_rows, zero.chunk_rows) == (0, 0, None)


@pytest.mark.parametrize("dense", [0.0, 2.0])
@pytest.mark.parametrize("uniform", [True, False])
def test_reference_on_a_store_equals_the_network_bit_for_bit(uniform, dense, monkeypatch):
    """The reference on a WeightStore computes ``(W^T Y^T)^T`` from the column-wise arrays
    as they lie (the sampled-row check of 65536 x 1920 spent 412 s converting whole layers
    to CSR); the result is the in-memory Network's ``Y @ W``, bit for bit (a RadiX-Net:
    fixed count per column, one value; random: variable counts, mixed-sign values, so
    cancellations and the bias-only-on-non-zeros rule are exercised)."""
    from mpisdnn.generate import digit_images, radixnet
    from mpisdnn.sdnn import reference as R
    from mpisdnn.sdnn.reference import reference_inference
    from mpisdnn.weights import CompactLayer, as_store

    monkeypatch.setattr(R, "_DENSE_SHARE", dense)  # 0: every layer dense; 2: every one sparse

    if uniform:
        net, y = radixnet(1024, 6, seed=1), digit_images(100, 1024, 3, 0)
    else:
        net = random_network(256, 6, seed=11, scale=2.0)
        y = random_inputs(40, 256, seed=4)
    want = reference_inference(y, net)
    got = reference_inference(y, as_store(net))
    assert want.nnz > 0
    assert np.array_equal(want.indptr, got.indptr) and np.array_equal(want.indices, got.indices)
    assert np.array_equal(want.data.view(np.uint32), got.data.view(np.uint32))
    layer = CompactLayer.from_matrix(net.layers[1], net.bias[1])
    assert (layer.transpose_csr() != layer.to_csr().T).nnz == 0
