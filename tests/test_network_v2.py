"""Network layout v2: compact column-wise layers, memory-mapped reads, upgrade and conversion."""

import os

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.errors import InputError, ShapeError
from mpisdnn.formats import read_network, write_network
from mpisdnn.formats.hdf5 import read_network_meta
from mpisdnn.formats.network_v2 import map_layers
from mpisdnn.formats.tsv import read_weight_compact, write_triples
from mpisdnn.formats.weight_store import HDF5WeightStore, open_weight_store
from mpisdnn.generate import radixnet
from mpisdnn.generate.radixnet import radixnet_layers
from mpisdnn.weights import CompactLayer

from .conftest import random_network, run_cli


def _mixed_network():
    """Random layers (colptr + values + per-neuron bias) next to RadiX-Net layers (compact)."""
    rnd = random_network(1024, 2, seed=4)
    rad = radixnet(1024, 3, seed=1)
    from mpisdnn import Network

    bias = np.vstack([rnd.bias, rad.bias])
    return Network(rnd.layers + rad.layers, bias, 1024)


def _same_csr(a, b):
    return (
        a.shape == b.shape
        and np.array_equal(a.indptr, b.indptr)
        and np.array_equal(a.indices, b.indices)
        and np.array_equal(a.data, b.data)
        and a.dtype == b.dtype
        and a.indices.dtype == b.indices.dtype
    )


def test_v1_and_v2_read_identically(tmp_path):
    net = _mixed_network()
    write_network(tmp_path / "v1.h5", net, version=1)
    write_network(tmp_path / "v2.h5", net)
    assert read_network_meta(tmp_path / "v2.h5")["version"] == 2
    for kw in ({}, {"layers": 4}, {"layer_start": 1, "layer_stop": 4}):
        a, b = read_network(tmp_path / "v1.h5", **kw), read_network(tmp_path / "v2.h5", **kw)
        assert len(a) == len(b) and a.total_layers == b.total_layers
        assert a.layer_start == b.layer_start
        for x, y in zip(a.layers, b.layers):
            assert sp.isspmatrix_csr(y) and _same_csr(x, y)
        np.testing.assert_array_equal(a.bias, b.bias)
    # and both equal the network written (independent reference: the scipy matrices)
    full = read_network(tmp_path / "v2.h5")
    for x, y in zip(net.layers, full.layers):
        assert abs(x - y).max() == 0


def test_v2_is_compact_for_official_structure(tmp_path):
    write_network(tmp_path / "n.h5", radixnet(1024, 6, seed=0))
    with h5py.File(tmp_path / "n.h5") as f:
        g = f["layers/000001"]
        assert set(g) == {"rows"}  # no colptr, no values, no per-neuron bias
        assert g["rows"].dtype == np.uint16 and g["rows"].shape == (32 * 1024,)
        assert g["rows"].chunks is None and g["rows"].compression is None
        assert f["layer_info/per_col"][()].tolist() == [32] * 6
        assert np.all(f["layer_info/value"][()] == np.float32(0.0625))
        assert np.all(f["layer_info/bias"][()] == np.float32(-0.3))
    # 2 bytes per weight plus metadata (v1 held 8 bytes per weight in memory)
    assert os.path.getsize(tmp_path / "n.h5") < 6 * 32 * 1024 * 2 * 1.2


def test_mapped_layers_are_readonly_memmaps_of_the_file(tmp_path):
    net = _mixed_network()
    write_network(tmp_path / "n.h5", net)
    info, layers = map_layers(tmp_path / "n.h5", 1, 4)
    assert len(layers) == 3
    with h5py.File(tmp_path / "n.h5") as f:
        off = f["layers/000002/rows"].id.get_offset()
    first = layers[0]
    assert isinstance(first.rows, np.memmap) and not first.rows.flags.writeable
    assert first.rows.ctypes.data - info["map"].ctypes.data == off
    assert isinstance(first.values, np.memmap) and first.colptr is not None
    assert layers[1].colptr is None and layers[1].values is None and layers[1].per_col == 32
    for k, layer in enumerate(layers):
        assert _same_csr(layer.to_csr(), net.layers[1 + k].tocsr())
        np.testing.assert_array_equal(layer.bias, net.bias[1 + k])


def test_weight_store_v1_and_v2(tmp_path):
    net = _mixed_network()
    write_network(tmp_path / "v1.h5", net, version=1)
    write_network(tmp_path / "v2.h5", net)
    s1 = open_weight_store(tmp_path / "v1.h5", layers=4, layer_start=1)
    s2 = open_weight_store(tmp_path / "v2.h5", layers=4, layer_start=1)
    assert isinstance(s2, HDF5WeightStore)
    assert len(s1) == len(s2) == 3 and s2.layer_start == 1 and s2.total_layers == 4
    assert s1.edges == s2.edges == sum(w.nnz for w in net.layers[1:4])
    for k in range(3):
        a, b = s1.layer(k), s2.layer(k)
        assert _same_csr(a.to_csr(), b.to_csr())
        np.testing.assert_array_equal(a.bias, b.bias)
    s2.prefetch(0, 3)
    s2.release(0, 3)
    assert _same_csr(s2.layer(2).to_csr(), net.layers[3].tocsr())
    assert s2.weight_bytes() > 0


def test_streamed_generator_equals_in_memory_generator():
    net = radixnet(1024, 14, seed=9)
    for k, layer in enumerate(radixnet_layers(1024, 14, seed=9)):
        ref = CompactLayer.from_matrix(net.layers[k], net.bias[k])
        assert np.array_equal(layer.rows, ref.rows) and layer.rows.dtype == np.uint16
        assert layer.per_col == ref.per_col == 32 and layer.value == ref.value
        np.testing.assert_array_equal(layer.bias, net.bias[k])


def test_compact_tsv_reader_matches_csr(tmp_path):
    w = random_network(64, 1, seed=3).layers[0]
    write_triples(tmp_path / "w.tsv", w)
    layer = read_weight_compact(tmp_path / "w.tsv", 64, -0.1)
    ref = sp.csr_matrix(w)
    assert abs(layer.to_csr() - ref).max() < 1e-6 * abs(ref).max()
    # unsorted lines and a duplicate named by line
    (tmp_path / "u.tsv").write_text("2\t1\t1\n1\t1\t1\n1\t2\t1\n")
    assert read_weight_compact(tmp_path / "u.tsv", 2, 0).rows.tolist() == [0, 1, 0]
    (tmp_path / "d.tsv").write_text("2\t1\t1\n1\t1\t1\n2\t1\t3\n")
    with pytest.raises(InputError, match="d.tsv:3: duplicate"):
        read_weight_compact(tmp_path / "d.tsv", 2, 0)


def _corrupt(path, name, data):
    with h5py.File(path, "a") as f:
        del f[name]
        f[name] = data


@pytest.mark.parametrize(
    "name, data, words",
    [
        ("layers/000001/rows", np.arange(32 * 64, dtype=np.float32), "/layers/000001/rows"),
        ("layers/000001/rows", np.full(32 * 64, 70, dtype=np.uint16), "outside 0..63"),
        ("layers/000001/rows", np.zeros(32 * 64, dtype=np.uint16), "ascending"),
        ("layers/000002/rows", np.zeros(10, dtype=np.uint16), "/layers/000002/rows"),
        ("layer_info/nnz", np.array([5, 5], dtype=np.float64), "/layer_info/nnz"),
        ("layer_info/per_col", np.array([31, 32]), "/layer_info/per_col"),
        ("layer_info/bias", np.array([np.inf, 0], dtype=np.float32), "/layer_info/bias"),
    ],
)
def test_bad_v2_datasets_one_line(tmp_path, name, data, words):
    p = tmp_path / "n.h5"
    write_network(p, _small_radix())
    _corrupt(p, name, data)
    with pytest.raises(InputError) as err:
        read_network(p)
    assert words in str(err.value) and "\n" not in str(err.value)


def _small_radix():
    from mpisdnn import Network

    layers = [c.to_csr() for c in radixnet_layers(64, 2, seed=0)]
    return Network(layers, np.full((2, 64), -0.3, dtype=np.float32), 64)


@pytest.mark.parametrize("ymax", [np.nan, -1.0, 0.0])
def test_bad_ymax_rejected(tmp_path, ymax):
    for version in (1, 2):
        p = tmp_path / f"n{version}.h5"
        write_network(p, _small_radix(), version=version)
        with h5py.File(p, "a") as f:
            f.attrs["ymax"] = ymax
        with pytest.raises(InputError, match="ymax"):
            read_network(p)


def test_truncated_v2_file(tmp_path):
    p = tmp_path / "n.h5"
    write_network(p, radixnet(1024, 4, seed=0))
    raw = p.read_bytes()
    for cut in (len(raw) // 2, len(raw) - 100):
        (tmp_path / "t.h5").write_bytes(raw[:cut])
        with pytest.raises(InputError) as err:
            read_network(tmp_path / "t.h5")
        assert "t.h5" in str(err.value) and "\n" not in str(err.value)


def test_cli_bad_v2_file_one_line(tmp_path):
    p = tmp_path / "n.h5"
    write_network(p, radixnet(1024, 2, seed=0))
    raw = p.read_bytes()
    (tmp_path / "t.h5").write_bytes(raw[: len(raw) // 2])
    res = run_cli(["convert", "network", tmp_path / "t.h5", "-o", tmp_path / "o.h5"])
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpisdnn: error:") and "t.h5" in err[0]
    assert not (tmp_path / "o.h5").exists()


def test_layer_slice_errors(tmp_path):
    write_network(tmp_path / "n.h5", radixnet(1024, 3, seed=0))
    with pytest.raises(ShapeError):
        read_network(tmp_path / "n.h5", layer_start=2, layer_stop=5)


@pytest.mark.parametrize("version", [1, 2])
def test_signed_zeros_keep_their_bits_in_the_file(tmp_path, version):
    """Weights ``0, -0, 0`` and a bias ``-0, 0, 0, 0``: v2 took each for one value by
    ``==`` (``-0.0 == 0.0``) and wrote every weight as ``+0.0`` and every bias as ``-0.0``
    (``CompactLayer.from_matrix`` and ``NetworkWriter``); the file holds what was given."""
    from mpisdnn import Network

    w = sp.csr_matrix((np.array([0.0, -0.0, 0.0], np.float32), ([0, 1, 2], [0, 0, 1])),
                      shape=(4, 4))  # fmt: skip
    bias = np.array([[-0.0, 0.0, 0.0, 0.0]], np.float32)
    write_network(tmp_path / "z.h5", Network([w], bias, 4), version=version)
    got = read_network(tmp_path / "z.h5")
    assert got.layers[0].data.view(np.uint32).tolist() == [0, 1 << 31, 0]
    assert got.bias.view(np.uint32).tolist() == [[1 << 31, 0, 0, 0]]
    layer = CompactLayer.from_matrix(w, bias[0])
    assert layer.values is not None and layer.values.view(np.uint32).tolist() == [0, 1 << 31, 0]


def _written_files(tmp_path):
    """A v2 network, a v1 network and an inputs file as mpisdnn writes them now."""
    from mpisdnn.formats import write_inputs

    net = random_network(32, 3, seed=7, density=0.2)
    write_network(tmp_path / "v2.h5", net)
    write_network(tmp_path / "v1.h5", net, version=1)
    y = sp.random(40, 32, density=0.3, format="csr", random_state=1, dtype=np.float32)
    write_inputs(tmp_path / "in.h5", y, truth=[1, 2])
    return [tmp_path / "v2.h5", tmp_path / "v1.h5", tmp_path / "in.h5"]


def test_files_are_written_with_checksummed_metadata_and_no_global_heap(tmp_path):
    """HDF5's default formats (superblock 0, no checksums) and h5py's variable-length string
    attributes (kept in the global heap, never checksummed): of the 21,896 one-byte damages
    of a 22 KB network file, 2 made the HDF5 library crash (SIGSEGV) and 3 loop for ever
    (in the global heap's header). Files are now written in the 1.8-1.10 formats, whose
    metadata is checksummed (superblock version >= 2), with fixed-length text attributes (no
    ``GCOL`` collection): every one of the 11,148 damages of the same network is a line."""
    for path in _written_files(tmp_path):
        raw = path.read_bytes()
        assert raw[:8] == b"\x89HDF\r\n\x1a\n" and raw[8] >= 2, (path, raw[8])
        assert b"GCOL" not in raw, path
        with h5py.File(path, "r") as f:
            assert isinstance(f.attrs["format"], bytes)  # fixed length: read back as bytes


def _every_array(path):
    """What the readers give of ``path``: every layer's CSR and bias, or the inputs."""
    from mpisdnn.formats import read_inputs

    if path.name.startswith("in"):
        y, truth = read_inputs(path)
        return [y.indptr, y.indices, y.data, truth]
    store = open_weight_store(path)
    return [a for k in range(len(store)) for a in (store.layer(k).to_csr().toarray(),
                                                   np.asarray(store.layer(k).bias))]  # fmt: skip


def test_damaged_metadata_is_one_line(tmp_path):
    """A flipped byte inside each object header (checksummed now) is one line from every
    reader, or harmless (an object the reader does not open): h5py's ``KeyError`` and
    ``RuntimeError`` ("incorrect metadata checksum") were internal errors before."""
    from mpisdnn.errors import MpisdnnError

    lines = 0
    for path in _written_files(tmp_path):
        raw = path.read_bytes()
        want = _every_array(path)
        headers = [i for i in range(len(raw)) if raw.startswith(b"OHDR", i)]
        assert len(headers) >= 3, path
        for at in headers:
            bad = bytearray(raw)
            bad[at + 8] ^= 0xFF
            (tmp_path / f"{path.stem}-bad.h5").write_bytes(bytes(bad))
            try:
                got = _every_array(tmp_path / f"{path.stem}-bad.h5")
            except MpisdnnError as exc:
                assert "-bad.h5" in str(exc) and "\n" not in str(exc)
                lines += 1
            else:
                assert all(np.array_equal(a, b) for a, b in zip(got, want)), (path, at)
    assert lines >= 6


def test_a_named_type_or_a_group_in_place_of_a_dataset_is_one_line(tmp_path):
    """Where a damaged (or foreign) file has a committed datatype or a group under a
    dataset's name, ``dset.shape`` was an ``AttributeError`` (an internal error)."""
    net = random_network(32, 2, seed=7, density=0.2)
    for name, what in (("layer_info/per_col", "type"), ("layer_info/nnz", "group"),
                       ("layers/000001", "dataset")):  # fmt: skip
        write_network(tmp_path / "n.h5", net)
        with h5py.File(tmp_path / "n.h5", "a") as f:
            del f[name]
            if what == "type":
                f[name] = np.dtype("int64")
            elif what == "group":
                f.create_group(name)
            else:
                f[name] = np.zeros(3)
        kind = "group" if name == "layers/000001" else "dataset"
        with pytest.raises(InputError, match=f"/{name} is not a {kind}"):
            open_weight_store(tmp_path / "n.h5")


def test_an_attribute_with_a_newline_or_of_the_wrong_shape_is_one_line(tmp_path):
    """A format attribute ``"mpisdnn.ne\\nwork"`` (one damaged byte) gave an error of two
    lines; a ``version`` attribute ``[1, 2]`` an internal error (a ``TypeError``)."""
    net = random_network(32, 2, seed=7, density=0.2)
    cases = (("format", "mpisdnn.ne\nwork", '"mpisdnn.ne\\nwork"'),
             ("version", np.array([1, 2]), "unsupported layout version"))
    for key, value, words in cases:
        write_network(tmp_path / "n.h5", net)
        with h5py.File(tmp_path / "n.h5", "a") as f:
            f.attrs[key] = value
        res = run_cli(["convert", "network", tmp_path / "n.h5", "-o", tmp_path / "o.h5"])
        err = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(err) == 1 and words in err[0], err
