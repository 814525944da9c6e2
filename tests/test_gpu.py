"""The ``gpu`` backend on a real CUDA device (skipped without one).

The simulator tests (test_gpu_sim) prove indexing and semantics; these show what only a device
can: that concurrent warps do not race (results identical across launch shapes and repeated
runs), that the compiled arithmetic is exact at full size (official N=1024 network, 120
layers), that streamed weights and row batches agree with resident ones, and that the kernel
timer works. Run them with ``python -m pytest -m gpu tests/test_gpu.py``, and once under
``compute-sanitizer --tool racecheck`` / ``--tool memcheck`` (see docs/gpu.md).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

from .conftest import ROOT, SHARED, self_comm
from .gpu_cases import bits, check_group, mixed_network, ragged_inputs, set_network

pytestmark = pytest.mark.gpu


def _device_reason():
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "the CUDA simulator is on (these tests need a real device)"
    try:
        from numba import cuda

        if not cuda.is_available():
            return "no CUDA device or driver"
    except Exception as exc:  # noqa: BLE001 - numba-cuda missing or broken
        return f"numba-cuda unusable: {type(exc).__name__}"
    return None


@pytest.fixture(scope="module", autouse=True)
def _device():
    reason = _device_reason()
    if reason:
        pytest.skip(f"needs a CUDA GPU: {reason}")


@pytest.fixture(scope="module")
def official_dir(tmp_path_factory):
    """The official N=1024 network: from ../shared, or as scripts/gpu_carry.sh carries it to
    a device machine (.gpu/neuron1024.tar.gz)."""
    import tarfile

    for tar in (SHARED / "neuron1024.tar.gz", ROOT / ".gpu" / "neuron1024.tar.gz"):
        if tar.exists():
            out = tmp_path_factory.mktemp("official")
            with tarfile.open(tar) as t:
                t.extractall(out, filter="data")
            return out / "neuron1024"
    pytest.skip("official network not here (scripts/gpu_carry.sh carries it to a device)")


#: Launch knobs that pick each kernel path for a batch.
PATHS = ({}, {"tail_rows": 0, "split_rows": 0}, {"tail_rows": 0, "split_rows": 10**6})


def _gpu(**kw):
    from mpisdnn.backends.gpu import GpuBackend

    return GpuBackend(0, **kw)


@pytest.mark.parametrize("neurons", [64, 256, 1024])
def test_kernels_bit_identical_at_device_sizes(neurons):
    net = mixed_network(seed=neurons, neurons=neurons, layers=6, density=min(0.1, 32 / neurons))
    y0 = ragged_inputs(3000, neurons, seed=neurons, most=max(12, neurons // 16))
    # Each kernel path: the default (the tail kernel takes 3,000 rows at these sizes), the
    # group kernel alone, the split kernel.
    for kw in PATHS:
        check_group(_gpu(**kw), net, y0, 0, 6)
        check_group(_gpu(**kw), net, y0, 0, 6, prune=False)


def test_no_races_across_launch_shapes_and_repeats():
    """Different chunk sizes, block sizes and shared-memory stages schedule the warps
    differently; a race would show as a difference in some bit."""
    net = mixed_network(seed=3, neurons=512, layers=8, density=0.05)
    y0 = ragged_inputs(5000, 512, seed=3, most=40)
    from .gpu_cases import prepared

    results = []
    group = {"tail_rows": 0, "split_rows": 0}
    for kw in ({}, {"chunk_rows": 32, "warps": 1, **group}, {"chunk_rows": 256, "warps": 16,
               **group}, {"shared_entries": 64, **group}, {"tail_rows": 0}, {}):
        be = _gpu(**kw)
        out, keep, _ = be.run_layers(be.to_device(y0), prepared(be, net), 0, 8)
        results.append((keep, bits(be.to_host(out))))
    for keep, b in results[1:]:
        np.testing.assert_array_equal(keep, results[0][0])
        assert np.array_equal(b, results[0][1])


def test_streamed_weights_and_row_batches_match_resident():
    from mpisdnn import InferOptions, infer, reference_inference

    net = mixed_network(seed=5, neurons=256, layers=12, density=0.08)
    y0 = ragged_inputs(4000, 256, seed=5, most=30)
    ref = reference_inference(y0, net)
    for kw in ({}, {"weight_bytes": 0, "batch_rows": 1024}):
        res = infer(net, y0, self_comm(), options=InferOptions(backend="gpu", first_group=2),
                    backend=_gpu(**kw))
        assert np.array_equal(bits(res.y_local), bits(ref))


def test_official_network_120_layers(official_dir):
    """The official N=1024 network, all 120 layers, against the scipy reference."""
    from mpisdnn.formats import read_network_tsv
    from mpisdnn.generate import digit_images
    from mpisdnn.sdnn.reference import categories_of, reference_inference

    net = read_network_tsv(official_dir, layers=120)
    y0 = sp.csr_matrix(digit_images(2000, 1024, seed=21), dtype=np.float32)
    from mpisdnn import InferOptions, infer

    ref = reference_inference(y0, net)
    for kw in PATHS:
        res = infer(net, y0, self_comm(), options=InferOptions(backend="gpu"),
                    backend=_gpu(**kw))
        np.testing.assert_array_equal(res.categories, categories_of(ref))
        assert np.array_equal(bits(res.y_local), bits(ref))
        assert res.backend["kernel_seconds"] > 0 and res.backend["memory_bytes"] > 0


def test_numba_and_cupy_array_layers_agree():
    pytest.importorskip("cupy")
    from .gpu_cases import prepared

    net = mixed_network(seed=8, neurons=128, layers=4)
    y0 = ragged_inputs(700, 128, seed=8)
    got = []
    for prefer in (True, False):
        be = _gpu(prefer_cupy=prefer)
        out, _, _ = be.run_layers(be.to_device(y0), prepared(be, net), 0, 4)
        got.append((be.arrays.kind, bits(be.to_host(out))))
    assert {g[0] for g in got} == {"cupy", "numba"}
    assert np.array_equal(got[0][1], got[1][1])


def test_column_sets_at_device_size():
    """Strided, listed and official-form column sets at N=1024 with thousands of rows,
    through the group kernel and the split kernel."""
    net = set_network(seed=41, neurons=1024, layers=6, per=24)
    y0 = ragged_inputs(3000, 1024, seed=41, most=120)
    check_group(_gpu(), net, y0, 0, 6)
    check_group(_gpu(split_rows=10**6), net, y0, 0, 6, prune=False)


def test_dedup_keys_on_device_match_the_host_search():
    """The device hashes and the bit-for-bit check against the host search, with many
    repeated rows spread over several batches and every block of the hash grid busy."""
    from mpisdnn.sdnn.dedup import find_duplicates

    rng = np.random.default_rng(42)
    base = ragged_inputs(300, 1024, seed=42, most=200)
    y = sp.csr_matrix(base[rng.integers(0, 300, 20000)])
    be = _gpu(batch_rows=4096)
    dev = be.to_device(y)
    gid = np.arange(y.shape[0])
    np.testing.assert_array_equal(find_duplicates(be.row_view(dev), gid),
                                  find_duplicates(be.to_host(dev), gid))


def test_two_ranks_share_one_gpu_through_the_cli(tmp_path):
    """``mpiexec -n 2 mpisdnn infer --backend gpu --share-gpus``: two ranks on the one GPU,
    rows re-balanced between them, categories equal to the reference truth (exit 0 = PASS)."""
    import json

    from .conftest import run_cli

    net, inp, rep = tmp_path / "net.h5", tmp_path / "in.h5", tmp_path / "r.json"
    for args in (["generate", "network", "--neurons", 1024, "--layers", 24, "-o", net],
                 ["generate", "inputs", "--neurons", 1024, "--count", 4000, "--network", net,
                  "-o", inp]):
        p = run_cli(args, ranks=2, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    p = run_cli(["infer", "--network", net, "--inputs", inp, "--backend", "gpu", "--share-gpus",
                 "--report", rep, "--quiet"], ranks=2, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(rep.read_text())
    assert report["run"]["ranks"] == 2 and report["check"]["status"] == "PASS"
