"""The helper's warm-up of a one-rank first ``infer`` run (:mod:`mpisdnn.sdnn.warm`) against a
real run of the same network: it must compile the very specialisations of the layer loop's
kernels that the run then calls, or the first run compiles them twice and the helper has
cost a core for nothing. Also the order the run takes its own warm-up in beside a helper."""

import numpy as np
import pytest

from mpisdnn import InferOptions, infer, kernel_cache
from mpisdnn.backends import _kernels as K
from mpisdnn.formats import hdf5
from mpisdnn.sdnn import warm
from mpisdnn.sdnn.load import load_network
from mpisdnn.sdnn.session import InferPlan

from .conftest import SHARED, random_inputs, random_network, self_comm
from .tsv_cases import kernel_types, uncovered

#: The layer loop's kernels the cpu backend calls (through the module, so a spy sees them).
KERNELS = ("tile_group", "pull_rows", "push_group", "push_scratch")


def _network(tmp_path, kind):
    if kind in ("v2", "v1-streamed"):
        path = tmp_path / "net.h5"
        hdf5.write_network(path, random_network(96, 4, seed=3), version=2 if kind == "v2" else 1)
        return path
    tar = SHARED / "neuron1024.tar.gz"
    if not tar.exists():
        pytest.skip(f"official data not present at {SHARED}")
    return tar


@pytest.mark.parametrize("kind", ["v2", "archive", "v1-streamed"])
def test_warm_up_compiles_what_a_run_of_the_network_calls(tmp_path, monkeypatch, kind):
    path = _network(tmp_path, kind)
    # v1-streamed: weights that do not fit weight_memory, read in blocks while the loop runs
    opts = InferOptions(weight_memory=4096 if kind == "v1-streamed" else None)
    opts = opts.resolved(self_comm())
    plan = InferPlan(network=str(path), inputs="unused", options=opts)
    assert warm.warms_up(plan)
    got = kernel_types(monkeypatch, lambda: warm.warm_up(plan), K, KERNELS)

    def run():
        net = load_network(self_comm(), path, 3, weight_memory=opts.weight_memory)
        assert (type(net).__name__ == "StreamingStore") == (kind == "v1-streamed")
        y = random_inputs(40, net.neurons, seed=5, density=0.2)
        infer(net, y, self_comm(), options=opts)

    real = kernel_types(monkeypatch, run, K, KERNELS)
    assert "tile_group" in real
    assert not uncovered(real, got)


def test_no_helper_for_runs_whose_loop_it_cannot_foresee():
    opts = InferOptions()
    assert not warm.warms_up(InferPlan(network="n", inputs="i", options=opts.replace(
        backend="reference")))  # fmt: skip
    assert not warm.warms_up(InferPlan(network="n", inputs="i", stages=2, options=opts))
    assert not warm.warms_up(InferPlan(resume="d", options=opts))


def test_a_helped_run_takes_its_warm_up_from_the_last_step(monkeypatch):
    """Beside a helper that runs the steps from the first (the tile kernel, the longest),
    the run compiles the others first and reaches the helper's kernel last."""
    done = []
    steps = [lambda i=i: done.append(i) for i in range(4)]
    kernel_cache.in_turn(steps, 0)
    assert done == [0, 1, 2, 3]
    monkeypatch.setitem(kernel_cache._config, "helped", False)
    kernel_cache.helped_turns()
    done.clear()
    kernel_cache.in_turn(steps, 0)
    assert done == [3, 2, 1, 0]
    kernel_cache.helped_turns(False)
    done.clear()
    kernel_cache.in_turn(steps, 1)
    assert done == [1, 2, 3, 0]


def test_one_rank_infer_starts_the_helper_on_a_first_run_only(tmp_path, monkeypatch):
    from mpisdnn import _aside
    from mpisdnn.cli import main
    from mpisdnn.formats import write_inputs

    net, y = tmp_path / "net.h5", tmp_path / "y.h5"
    hdf5.write_network(net, random_network(64, 2, seed=1))
    write_inputs(y, random_inputs(12, 64, seed=2))
    calls = []

    class Fake:
        def close(self):
            calls.append("closed")

    monkeypatch.setitem(kernel_cache._config, "helped", False)
    monkeypatch.setattr(_aside, "start", lambda target, *a: calls.append((target, a)) or Fake())
    monkeypatch.setattr(_aside, "spare_cpus", lambda: 1)
    real_in_turn, helped = kernel_cache.in_turn, []

    def in_turn(steps, rank):
        helped.append(kernel_cache._config["helped"])
        real_in_turn(steps, rank)

    monkeypatch.setattr(kernel_cache, "in_turn", in_turn)
    for cached in (True, False):
        monkeypatch.setattr(warm, "kernels_cached", lambda c=cached: c)
        calls.clear()
        helped.clear()
        assert main(["infer", "--network", str(net), "--inputs", str(y), "--quiet"]) == 0
        assert helped and all(h is not cached for h in helped)  # the loop's warm-up
        if cached:
            assert calls == []
            continue
        (target, (plan,)), closed = calls
        assert target == "mpisdnn.sdnn.warm:warm_up" and closed == "closed"
        assert plan.network == str(net) and plan.options.weight_memory is not None
        assert not kernel_cache._config["helped"]  # the run's own order again, after it


def test_warm_up_of_an_archive_reads_its_first_member_only(tmp_path, monkeypatch):
    """The official archives list their layers in no order, so layer 1 can be near the end
    of a 17 GB ``neuron65536.tar.gz``: the helper takes the first layer file it meets (any
    layer gives the kernels the same types) and reads nothing after it."""
    from mpisdnn.formats import archive
    from mpisdnn.formats.archive_write import network_archive

    net = random_network(64, 3, seed=7, negative=False)
    path = tmp_path / "neuron64.tar.gz"
    with network_archive(path, 64, threads=1) as out:
        for k in (3, 1, 2):  # archive order is not layer order
            out.add(k, net.layers[k - 1])
    first = archive.read_first_layer(path, bias=-0.3)
    assert len(first) == 1 and first.neurons == 64
    got = first.layer(0).to_csr()
    whole = archive.read_network_archive(path, bias=-0.3).layers[2].tocsr()
    assert (got != whole).nnz == 0 and got.dtype == whole.dtype  # layer 3, as a run reads it
    assert abs(got - net.layers[2]).max() < 1e-6  # as written (to the text's digits)
    bias = first.layer(0).bias
    assert bias.shape == (64,) and (bias == np.float32(-0.3)).all()

    seen = []
    members = archive.tar_members

    def spy(stream, source):
        for name, reader in members(stream, source):
            seen.append(name)
            yield name, reader

    monkeypatch.setattr(archive, "tar_members", spy)
    opts = InferOptions().resolved(self_comm())
    warm.warm_up(InferPlan(network=str(path), inputs="unused", bias=-0.3, options=opts))
    assert [n for n in seen if archive.layer_number(n)] == ["neuron64/n64-l3.tsv"]
