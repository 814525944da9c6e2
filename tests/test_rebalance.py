"""Re-balancing rows across ranks: the pure planning, and MPI runs where it must trigger."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn import Network
from mpisdnn.partition import balanced_blocks
from mpisdnn.sdnn import rebalance as rb
from mpisdnn.sdnn.options import DEFAULT_REBALANCE
from mpisdnn.sdnn.reference import reference_inference

from .conftest import run_infer, self_comm, world


def test_imbalance():
    assert rb.imbalance([1, 1, 1]) == 1.0
    assert rb.imbalance([0, 0, 4]) == 3.0
    assert rb.imbalance([]) == 1.0 and rb.imbalance([0, 0]) == 1.0


def test_destinations_split_the_global_order_evenly():
    weights = [np.ones(10), np.ones(0), np.ones(2)]  # 12 rows, rank 0 holds most
    dests = [rb.destinations(weights, r) for r in range(3)]
    assert dests[0][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert dests[1][0].tolist() == []
    assert dests[2][0].tolist() == [2, 2]
    assert all(after == 1.0 for _, after in dests)


def test_destinations_respect_weights_and_report_the_best_split():
    # One heavy row cannot be split: the predicted imbalance says so.
    weights = [np.array([100.0, 1.0]), np.array([1.0])]
    dest, after = rb.destinations(weights, 0)
    assert dest.tolist() == [0, 1] and after == pytest.approx(100 / 51)
    assert np.all(np.diff(dest) >= 0)


def test_home_destinations():
    home = np.array([0, 5, 5, 9, np.iinfo(np.int64).max])  # rank 1 owns no rows
    assert rb.home_destinations([0, 4, 5, 8, 9, 20], home).tolist() == [0, 0, 2, 2, 3, 3]


def lopsided_problem(rows=96, neurons=64, layers=6, seed=0):
    """Rows of the first half die in layer 1, the others live: an nnz-balanced split of Y0
    leaves the low ranks idle after the first layer group."""
    rng = np.random.default_rng(seed)
    half = neurons // 2
    dead = -rng.uniform(0.1, 0.5, (half, half))  # inputs < half only reach negative sums
    live = rng.uniform(0.0, 0.2, (half, half)) * (rng.random((half, half)) < 0.3)
    w = sp.csr_matrix(np.block([[dead, np.zeros((half, half))], [np.zeros((half, half)), live]]))
    net = Network([w.astype(np.float32)] * layers, np.full((layers, neurons), -0.05), neurons)
    y = np.zeros((rows, neurons), np.float32)
    mask = rng.random((rows, half)) < 0.3
    y[: rows // 2, :half][mask[: rows // 2]] = 1.0
    y[rows // 2 :, half:][mask[rows // 2 :]] = 2.0
    return net, sp.csr_matrix(y)


def test_lopsided_problem_is_lopsided():
    net, y0 = lopsided_problem()
    final = reference_inference(y0, net)
    alive = np.diff(final.indptr) > 0
    assert not alive[:48].any() and alive[48:].sum() > 30


# ----------------------------------------------------------------------------- MPI


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_rebalancing_triggers_and_changes_nothing(backend):
    comm = world()
    net, y0 = lopsided_problem()
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    res = run_infer(
        net,
        y0[r0:r1],
        comm,
        row_offset=r0,
        g_rows=y0.shape[0],
        backend=backend,
        rebalance_threshold=1.1,
        # a group boundary after every layer (the reference has one already, and refuses
        # --max-group as a flag with no effect)
        **({} if backend == "reference" else {"max_group": 1}),
    )
    serial = run_infer(net, y0, self_comm(), backend="reference", rebalance_threshold=0)
    y = sp.vstack(comm.allgather(res.y_local), format="csr")
    assert res.y_local.shape[0] == r1 - r0  # rows came back home
    assert (y != serial.y_local).nnz == 0
    assert res.categories.tolist() == serial.categories.tolist()
    assert res.layer_nnz == serial.layer_nnz
    if comm.size == 1:
        assert res.rebalances == []
        return
    # Rank 0 holds only dying rows: after layer 1 it is idle, so re-balancing must trigger.
    assert res.rebalances, "re-balancing did not trigger"
    first = res.rebalances[0]
    assert first["after_layer"] == 1 and first["rows_moved"] > 0
    assert first["before"] > 1.1 and first["after"] < first["before"]
    assert res.layer_imbalance[0] == pytest.approx(first["before"])
    assert res.layer_imbalance[1] < first["before"]


@pytest.mark.mpi
def test_threshold_zero_never_moves_rows_and_default_does():
    comm = world()
    net, y0 = lopsided_problem()
    off = balanced_blocks(np.diff(y0.indptr), comm.size)
    r0, r1 = int(off[comm.rank]), int(off[comm.rank + 1])
    kw = dict(row_offset=r0, g_rows=y0.shape[0], max_group=1)
    res = run_infer(net, y0[r0:r1], comm, rebalance_threshold=0, **kw)
    assert res.rebalances == [] and res.rebalance_threshold == 0.0
    default = run_infer(net, y0[r0:r1], comm, **kw)  # no threshold given
    assert default.rebalance_threshold == DEFAULT_REBALANCE
    if comm.size > 1:  # rank 0's rows all die after layer 1: the default must move rows
        assert default.rebalances
    assert default.categories.tolist() == res.categories.tolist()


def test_cli_reports_rebalancing(tmp_path):
    """``mpisdnn infer --rebalance-threshold`` end to end: 2 ranks, moves in the report."""
    import json

    from mpisdnn.formats import write_inputs, write_network

    from .conftest import run_cli

    net, y0 = lopsided_problem()
    write_network(tmp_path / "net.h5", net)
    truth = np.flatnonzero(np.diff(reference_inference(y0, net).indptr)) + 1
    write_inputs(tmp_path / "in.h5", y0, truth=truth)
    reports = {}
    for flag in ("1.1", "0"):
        rep = tmp_path / f"r{flag}.json"
        args = ["infer", "--network", tmp_path / "net.h5", "--inputs", tmp_path / "in.h5"]
        args += ["--rebalance-threshold", flag, "--max-group", "1", "--report", rep, "--quiet"]
        r = run_cli(args, ranks=2, timeout=120)
        assert r.returncode == 0, r.stderr
        reports[flag] = json.loads(rep.read_text())
    on, off = reports["1.1"], reports["0"]
    assert on["check"]["status"] == off["check"]["status"] == "PASS"
    assert on["rebalance"]["threshold"] == 1.1 and on["rebalance"]["events"]
    assert off["rebalance"]["events"] == []
    assert on["categories"]["sha1"] == off["categories"]["sha1"]
    assert len(on["ranks"]["peak_rss_bytes"]) == 2
    assert max(on["layers"]["work_imbalance"][1:]) < max(off["layers"]["work_imbalance"][1:])
