"""The stage flow's wire format (:mod:`mpisdnn._handoff`) and report sections
(:mod:`mpisdnn.reporting.pipeline`), serially. The MPI hand-off itself is exercised by the
multi-rank tests of tests/test_pipeline.py (bit-identical to ``--stages 1``)."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn._handoff import pack, unpack
from mpisdnn.reporting.pipeline import dedup_section, pipeline_section, stage_events


def _round_trip(gid, m, state, neurons):
    buf = pack(gid, m, state)
    assert buf.dtype == np.uint8
    # a received buffer is a fresh array: unpack must not depend on the sender's objects
    g2, m2, s2 = unpack(buf.copy(), neurons)
    assert g2.dtype == np.int64 and np.array_equal(g2, gid)
    assert m2.shape == (gid.size, neurons)
    assert m2.indices.dtype == np.int32 and m2.data.dtype == np.float32
    assert np.array_equal(m2.indptr, m.indptr)
    assert np.array_equal(m2.indices, m.indices)
    assert m2.data.tobytes() == np.asarray(m.data, np.float32).tobytes()  # bit for bit
    return s2


def test_pack_round_trip_empty_batch():
    m = sp.csr_matrix((0, 16), dtype=np.float32)
    assert _round_trip(np.zeros(0, np.int64), m, None, 16) is None


def test_pack_round_trip_rows_and_merges():
    rng = np.random.default_rng(3)
    m = sp.random(50, 1024, density=0.3, format="csr", dtype=np.float32, random_state=4)
    m.data[:] = rng.choice([0.0625, 31.999998, 1e-30], m.nnz).astype(np.float32)
    gid = np.sort(rng.choice(2**40, 50, replace=False)).astype(np.int64)  # ids past 2**32
    state = rng.integers(-(2**62), 2**62, 17, dtype=np.int64)
    got = _round_trip(gid, m, state, 1024)
    assert np.array_equal(got, state)


def test_pack_round_trip_rows_without_non_zeros():
    m = sp.csr_matrix((5, 8), dtype=np.float32)
    assert _round_trip(np.arange(5, dtype=np.int64), m, None, 8) is None


def test_pipeline_section_busy_and_bubble():
    section = {"stages": 2, "data_groups": 2}
    busy = [1.0, 3.0, 2.0, 1.0]  # ranks 0, 2 are stage 0; 1, 3 stage 1
    got = pipeline_section(section, busy, 4.0, [10, 0, 20, 0], [5, 6, 7, 8])
    assert got["rank_stage"] == [0, 1, 0, 1]
    assert got["stage_busy_seconds"] == [2.0, 3.0]
    assert got["bubble_fraction"] == pytest.approx(1 - 7.0 / 16.0)
    assert got["rank_bytes_sent"] == [10, 0, 20, 0] and got["rank_weight_bytes"] == [5, 6, 7, 8]
    assert got["stages"] == 2 and got["data_groups"] == 2
    assert pipeline_section(section, busy, 0.0, [0] * 4, [0] * 4)["bubble_fraction"] == 0.0


def test_stage_events_in_layer_order():
    got = stage_events([[{"after_layer": 9}], [], [{"after_layer": 2}, {"after_layer": 12}]])
    assert [e["after_layer"] for e in got] == [2, 9, 12]


def test_dedup_section_sums_rows_and_takes_the_longest_check():
    got = dedup_section(True, [{4: [10, 3, 0.5]}, {4: [6, 2, 0.25], 8: [1, 1, 0.1]}, {}])
    assert got["enabled"] is True and got["within"] == "batch"
    assert got["checks"] == [
        {"after_layer": 4, "live_rows": 16, "distinct_rows": 5, "seconds": 0.5},
        {"after_layer": 8, "live_rows": 1, "distinct_rows": 1, "seconds": 0.1},
    ]
