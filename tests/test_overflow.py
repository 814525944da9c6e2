"""float32 overflow of a layer's sums (issue 42 item 4): refused before any layer runs, with
one line on every rank count, through the API and the CLI; just under the bound the
backends agree bit for bit (docs/reliability.md, "float32 overflow").

Before the refusal, weights of +-3e38 gave ``inf - inf = NaN``: the reference backend kept
the NaN in Y (MATLAB's ``Z(Z<0)=0`` leaves it), the cpu kernel dropped it (``NaN > 0`` is
false), and the final Y differed.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import InferOptions, Network, infer
from mpisdnn._checks import F32_MAX, layer_weight_bound, overflow_text
from mpisdnn.errors import MpisdnnError
from mpisdnn.formats import write_inputs, write_network
from mpisdnn.weights import CompactLayer

from .conftest import run_cli, self_comm
from .matlab_ref import matlab_inference

N = 64
PER_COL = 13


def _columns(n=N, per_col=PER_COL, seed=1):
    """A 0/1 pattern with exactly ``per_col`` inputs per output neuron (CSC order)."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([np.sort(rng.choice(n, per_col, replace=False)) for _ in range(n)])
    ptr = np.arange(n + 1) * per_col
    return sp.csc_matrix((np.ones(rows.size, np.float32), rows, ptr), shape=(n, n))


def _network(w, n=N, per_col=PER_COL, layers=2, at=0):
    """``layers`` layers: layer ``at`` holds weights +-w alternating (MATLAB sums them in
    ascending input order), the others the identity; bias -0.3."""
    mats = []
    for k in range(layers):
        if k == at:
            m = _columns(n, per_col).tocsr()
            m.sort_indices()
            m.data[:] = np.float32(w)
            m.data[1::2] *= -1
        else:
            m = sp.identity(n, format="csr", dtype=np.float32)
        mats.append(m)
    return Network(mats, np.full((layers, n), -0.3, np.float32), n)


def _inputs(rows=40, top=1.0, seed=2):
    y = sp.random(rows, N, density=0.3, format="csr", random_state=seed, dtype=np.float32)
    y.data[:] = 1.0
    y.data[-1] = np.float32(top)  # the largest input in the last row (rank 1's at 2 ranks)
    return y


def _infer(net, y, backend):
    return infer(net, y, self_comm(), options=InferOptions(backend=backend))


def test_weight_bound_is_the_largest_column_sum():
    w = sp.csc_matrix(np.array([[1, 0, -4], [-2, 0, 0], [3, 0, 1]], dtype=np.float32))
    layer = CompactLayer.from_matrix(w, np.zeros(3, np.float32))
    assert layer.values is not None and layer.colptr is not None  # the general form
    assert layer_weight_bound(layer) == (6.0, 4.0, 3)  # column 0: 1 + 2 + 3
    # the official form: one value, a fixed count per column, no pass over any value
    official = CompactLayer.from_matrix(_columns() * np.float32(0.0625), np.zeros(N))
    assert official.values is None and official.colptr is None
    assert layer_weight_bound(official) == (0.0625 * PER_COL, 0.0625, PER_COL)
    assert overflow_text(1, (F32_MAX / 2, 1.0, 2), 1.0, 0.0) is None
    assert "layer 3:" in overflow_text(3, (F32_MAX / 2, 1.0, 2), 2.0, 0.0)
    # what is not finite is named (was "weights up to ... can overflow ... inputs not finite")
    assert "the inputs hold a NaN or an infinite value" in overflow_text(
        1, (1.0, 1.0, 1), float("inf"), 0.0)  # fmt: skip
    assert "a weight is NaN or infinite" in overflow_text(
        1, (float("nan"), float("nan"), 1), 1.0, 0.0)  # fmt: skip
    assert "a bias is NaN or infinite" in overflow_text(2, (1.0, 1.0, 1), 1.0, float("nan"))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_overflowing_weights_are_refused_by_every_backend(backend):
    net = _network(3e38)
    with pytest.raises(MpisdnnError) as err:
        _infer(net, _inputs(), backend)
    assert str(err.value) == (
        f"layer 1: weights up to 3e+38 with {PER_COL} per neuron can overflow float32 (inputs "
        f"up to 1, biases up to 0.3): the backends' results would not be defined"
    )


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_large_inputs_with_ordinary_weights_are_refused(backend):
    net = _network(1.0, per_col=40)
    with pytest.raises(MpisdnnError, match=r"^layer 1: .* \(inputs up to 1e\+37, "):
        _infer(net, _inputs(top=1e37), backend)
    # the same inputs on a layer after the first: its inputs are clipped to ymax (32)
    _infer(_network(1.0, per_col=40, at=1), _inputs(top=1e37), backend)


def test_just_under_the_bound_runs_and_the_backends_agree_bit_for_bit():
    # Any partial sum is below float32's largest value: 13 weights of w, inputs of 1.
    w = np.float32(F32_MAX / PER_COL * (1 - 1e-5))
    net, y = _network(w), _inputs()
    got = {be: _infer(net, y, be).y_local.toarray() for be in ("reference", "cpu")}
    np.testing.assert_array_equal(got["cpu"], got["reference"])
    np.testing.assert_array_equal(got["cpu"], matlab_inference(y, net.layers, net.bias))
    assert np.isfinite(got["cpu"]).all() and (got["cpu"] == np.float32(31.7)).any()
    # one rounding step above: refused
    with pytest.raises(MpisdnnError, match="can overflow float32"):
        _infer(_network(np.float32(F32_MAX / PER_COL * 1.0001)), y, "cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("overflow")
    write_network(d / "big.h5", _network(3e38, layers=3, at=1))
    write_network(d / "ok.h5", _network(1.0, per_col=40, layers=3, at=0))
    write_inputs(d / "in.h5", _inputs())
    write_inputs(d / "in_big.h5", _inputs(top=1e37))
    return d


@pytest.mark.parametrize(
    "ranks, net, inputs, extra, expect",
    [
        (1, "big.h5", "in.h5", [], "layer 2: weights up to 3e+38 with 13 per neuron"),
        (2, "big.h5", "in.h5", [], "layer 2: weights up to 3e+38 with 13 per neuron"),
        # only rank 1 holds the large input: every rank refuses together
        (2, "ok.h5", "in_big.h5", [], "layer 1: weights up to 1 with 40 per neuron"),
        # stage 1 alone holds layer 2: the stages agree
        (2, "big.h5", "in.h5", ["--stages", "2", "--stage-head", "0"], "layer 2: "),
    ],
    ids=["weights-1rank", "weights-2ranks", "inputs-on-rank1", "stages"],
)
def test_cli_refuses_with_one_line(files, ranks, net, inputs, extra, expect):
    r = run_cli(
        ["infer", "--network", files / net, "--inputs", files / inputs, *extra],
        ranks=ranks,
        timeout=120,
    )
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(err) == 1 and err[0].startswith("mpisdnn: error: " + expect), r.stderr
    assert err[0].endswith(": the backends' results would not be defined"), err[0]
    assert ("(inputs up to 1e+37," in err[0]) == (inputs == "in_big.h5"), err[0]


@pytest.mark.parametrize("at", [0, 1], ids=["layer1-before-the-run", "layer2-as-read"])
def test_streamed_v1_network_is_checked_without_a_second_read(tmp_path, at):
    # A v1 file larger than --weight-memory is streamed: global layer 1 is checked before
    # the run (it sees Y0), later layers as the stream reads them; one line either way.
    write_network(tmp_path / "v1.h5", _network(3e38, layers=3, at=at), version=1)
    write_inputs(tmp_path / "in.h5", _inputs())
    args = ["--network", tmp_path / "v1.h5", "--inputs", tmp_path / "in.h5"]
    r = run_cli(["infer", *args, "--weight-memory", "1K"], ranks=1, timeout=120)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(err) == 1, r.stderr
    assert err[0].startswith(f"mpisdnn: error: layer {at + 1}: weights up to 3e+38"), err[0]


def test_a_large_ymax_is_bounded_layer_by_layer():
    # ymax = 1e37 with 40 weights of 1 per neuron: 40 x ymax would overflow, but the inputs
    # of layer 2 are at most 40 x 1 + 0.3 and those of layer 3 40 x 40.3 + 0.3: it runs.
    one = _network(1.0, per_col=40, layers=1)
    net = Network(one.layers * 3, np.full((3, N), -0.3, np.float32), N, ymax=1e37)
    got = {be: _infer(net, _inputs(), be).y_local.toarray() for be in ("reference", "cpu")}
    np.testing.assert_array_equal(got["cpu"], got["reference"])
    assert got["cpu"].max() > 32  # not clipped at the usual 32
