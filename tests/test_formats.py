import re

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.errors import InputError, ShapeError
from mpisdnn.formats import (
    read_categories,
    read_images_tsv,
    read_inputs,
    read_inputs_meta,
    read_network,
    read_network_tsv,
    write_categories,
    write_inputs,
    write_network,
    write_triples,
)
from mpisdnn.formats.tsv import read_triples, read_weight_tsv
from mpisdnn.generate import radixnet

from .conftest import random_inputs, random_network


def _write(path, text):
    path.write_text(text)
    return path


def test_tsv_roundtrip(tmp_path):
    w = random_network(64, 1, seed=1).layers[0]
    write_triples(tmp_path / "w.tsv", w)
    back = read_weight_tsv(tmp_path / "w.tsv", 64)
    assert (abs(back - w) > 1e-6 * abs(w).max()).nnz == 0
    assert back.indices.dtype == np.int32


def test_official_style_lines_parse(tmp_path):
    p = _write(tmp_path / "a.tsv", "1\t1\t6.250000e-02\n65\t1\t6.250000e-02\n3\t4\t1\n")
    r, c, v = read_triples(p, 100, 100)
    assert r.tolist() == [0, 64, 2] and c.tolist() == [0, 0, 3]
    assert v.tolist() == [0.0625, 0.0625, 1.0]


def test_crlf_and_trailing_blank_line_accepted(tmp_path):
    p = _write(tmp_path / "a.tsv", "1\t2\t1\r\n2\t1\t1\r\n\n")
    r, c, v = read_triples(p, 2, 2)
    assert r.tolist() == [0, 1]


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("1\t1\t1\n2\t2\n", 2, "expected 3"),
        ("1\t1\t1\n2\t2\t1\t4\n", 2, "expected 3"),
        ("1\t2\t3 4\n5\t6\n", 1, "expected 3"),
        ("1\t1\t1\n2\tx\t1\n", 2, "non-numeric"),
        ("1\t1\t1\n0\t1\t1\n", 2, "positive 1-based"),
        ("1\t1\t1\n1\t-3\t1\n", 2, "positive 1-based"),
        ("1\t1\t1\n1.5\t1\t1\n", 2, "positive 1-based"),
        ("1\t1\t1\n1\t1\t1\n9\t1\t1\n", 3, "exceeds"),
        ("1\t1\tnan\n", 1, "finite"),
        ("1\t1\t1\n2\t2\tinf\n", 2, "finite"),
    ],
)
def test_malformed_tsv_names_file_and_line(tmp_path, text, line, words):
    p = _write(tmp_path / "bad.tsv", text)
    with pytest.raises(InputError) as err:
        read_triples(p, 8, 8)
    msg = str(err.value)
    assert f"bad.tsv:{line}:" in msg and words in msg
    assert "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_triples(tmp_path / "nope.tsv")


def test_duplicate_entries_rejected(tmp_path):
    p = _write(tmp_path / "d.tsv", "1\t1\t1\n1\t1\t2\n")
    with pytest.raises(InputError, match="duplicate"):
        read_weight_tsv(p, 4)


def _tsv_network(tmp_path, neurons=64, layers=3):
    net = radixnet(neurons, layers)
    d = tmp_path / f"neuron{neurons}"
    for k, w in enumerate(net.layers):
        write_triples(d / f"n{neurons}-l{k + 1}.tsv", w)
    return net, d


def test_network_tsv_dir_reads_all_layers_and_bias(tmp_path):
    net, d = _tsv_network(tmp_path, 1024, 3)
    back = read_network_tsv(d)
    assert len(back) == 3 and back.neurons == 1024
    assert np.all(back.bias == np.float32(-0.3))
    for a, b in zip(net.layers, back.layers):
        assert (a != b).nnz == 0
    assert len(read_network_tsv(d, layers=2)) == 2


def test_network_tsv_missing_layer_named(tmp_path):
    _, d = _tsv_network(tmp_path, 64, 3)
    (d / "n64-l2.tsv").unlink()
    with pytest.raises(InputError, match="n64-l2.tsv: missing layer file"):
        read_network_tsv(d, layers=3, bias=-0.3)


def test_network_tsv_wrong_shape(tmp_path):
    _, d = _tsv_network(tmp_path, 64, 2)
    _write(d / "n64-l2.tsv", "1\t65\t0.0625\n")
    with pytest.raises(InputError, match="n64-l2.tsv:1: column index 65 exceeds the size 64"):
        read_network_tsv(d, bias=-0.3)


@pytest.mark.parametrize("text", ["", "\n\n", "  \n"])
def test_an_empty_layer_file_is_refused_by_every_layer_reader(tmp_path, text):
    """A layer file cut to nothing was read as a layer of zeros (every row then died, with
    exit 0): the serial CSR reader, the compact reader and the command line refuse it."""
    import re

    from mpisdnn.formats.tsv import read_weight_compact

    from .conftest import run_cli

    _, d = _tsv_network(tmp_path, 64, 3)
    _write(d / "n64-l2.tsv", text)
    words = "n64-l2.tsv: no weights (an empty layer file: cut short?)"
    with pytest.raises(InputError, match=re.escape(words)):
        read_network_tsv(d, bias=-0.3)
    with pytest.raises(InputError, match="no weights"):
        read_weight_compact(d / "n64-l2.tsv", 64, -0.3)
    r = run_cli(["convert", "network", d, "--bias", "-0.3", "-o", tmp_path / "n.h5"])
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(err) == 1 and words in err[0], r.stderr
    assert not (tmp_path / "n.h5").exists()


def test_network_dir_without_layers(tmp_path):
    with pytest.raises(InputError, match="no n"):
        read_network_tsv(tmp_path)


def test_images_and_categories(tmp_path):
    y = random_inputs(30, 64, seed=3)
    write_triples(tmp_path / "img.tsv", y)
    back = read_images_tsv(tmp_path / "img.tsv", 64, rows=30)
    assert (back != y).nnz == 0
    # without ``rows`` the count is the largest row id: the last row is kept (mutant
    # tsv-last-row of scripts/mutation.py)
    assert y[29].nnz > 0
    back = read_images_tsv(tmp_path / "img.tsv", 64)
    assert back.shape == (30, 64) and (back != y).nnz == 0
    write_categories(tmp_path / "c.tsv", [3, 1, 7])
    assert read_categories(tmp_path / "c.tsv").tolist() == [1, 3, 7]
    _write(tmp_path / "bad.tsv", "1\n2\nx\n")
    with pytest.raises(InputError, match="bad.tsv:3"):
        read_categories(tmp_path / "bad.tsv")
    _write(tmp_path / "zero.tsv", "1\n0\n")
    with pytest.raises(InputError, match="zero.tsv:2"):
        read_categories(tmp_path / "zero.tsv")
    # "UTF-8 with BOM": the inputs reader read such a file, the truth reader refused it
    # ("expected one positive integer per line, got '\ufeff3'")
    (tmp_path / "bom.tsv").write_bytes(b"\xef\xbb\xbf3\n1\n7\n")
    assert read_categories(tmp_path / "bom.tsv").tolist() == [1, 3, 7]
    (tmp_path / "bom-img.tsv").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "img.tsv").read_bytes())
    assert (read_images_tsv(tmp_path / "bom-img.tsv", 64) != y).nnz == 0

    # a no-break space is shown: the message said "non-numeric field: '150\t45\t1'"
    (tmp_path / "nbsp.tsv").write_bytes(b"\xc2\xa0150\t45\t1\n")
    with pytest.raises(InputError, match=re.escape("non-numeric field: '\\xa0150\\t45\\t1'")):
        read_images_tsv(tmp_path / "nbsp.tsv", 64)


def test_message_fields_show_what_prints_as_nothing():
    """Edge-list messages quote a field with its blanks and invisible characters written
    out, printable text (any script) as it is."""
    from mpisdnn.formats.projection.text import show

    assert show("Zürich 東京\t\xa0\ufeff\0x\x7f") == "'Zürich 東京\\t\\xa0\\ufeff\\0x\\x7f'"
    assert show(b"a\xffb") == "'a\ufffdb'"


@pytest.mark.parametrize("version", [1, 2])
def test_hdf5_network_roundtrip_and_slices(tmp_path, version):
    net = random_network(48, 5, seed=2)
    write_network(tmp_path / "n.h5", net, version=version)
    full = read_network(tmp_path / "n.h5")
    assert len(full) == 5 and full.neurons == 48
    for a, b in zip(net.layers, full.layers):
        assert (a != b).nnz == 0
    np.testing.assert_array_equal(full.bias, net.bias)
    part = read_network(tmp_path / "n.h5", layer_start=2, layer_stop=4)
    assert part.layer_start == 2 and len(part) == 2 and part.total_layers == 5
    # every layer of the slice (v1: mutant hdf5-layer-slice of scripts/mutation.py)
    for got, want in zip(part.layers, net.layers[2:4]):
        assert (got != want).nnz == 0
    np.testing.assert_array_equal(part.bias, net.bias[2:4])
    head = read_network(tmp_path / "n.h5", layers=3)
    assert len(head) == 3
    with pytest.raises(ShapeError, match="asked for 9 layers"):
        read_network(tmp_path / "n.h5", layers=9)


def test_hdf5_inputs_roundtrip_row_blocks(tmp_path):
    y = random_inputs(40, 32, seed=5)
    write_inputs(tmp_path / "i.h5", y, truth=[2, 5])
    meta = read_inputs_meta(tmp_path / "i.h5")
    assert meta["rows"] == 40 and meta["neurons"] == 32 and meta["has_truth"]
    blk, truth = read_inputs(tmp_path / "i.h5", 10, 25)
    assert (blk != y[10:25]).nnz == 0 and truth.tolist() == [2, 5]
    empty, _ = read_inputs(tmp_path / "i.h5", 7, 7)
    assert empty.shape == (0, 32)


def test_truncated_hdf5(tmp_path):
    net = random_network(32, 2, seed=1)
    write_network(tmp_path / "n.h5", net)
    raw = (tmp_path / "n.h5").read_bytes()
    (tmp_path / "t.h5").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="t.h5"):
        read_network(tmp_path / "t.h5")


def test_foreign_hdf5(tmp_path):
    import h5py

    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["a"] = np.arange(3)
    with pytest.raises(InputError, match="not an mpisdnn.network file"):
        read_network(tmp_path / "x.h5")
    with pytest.raises(InputError, match="not an mpisdnn.inputs file"):
        read_inputs(tmp_path / "x.h5")


def test_inputs_file_given_as_network(tmp_path):
    write_inputs(tmp_path / "i.h5", random_inputs(4, 8, seed=0))
    with pytest.raises(InputError, match="not an mpisdnn.network"):
        read_network(tmp_path / "i.h5")


def test_hdf5_missing_dataset(tmp_path):
    import h5py

    write_network(tmp_path / "n.h5", random_network(16, 2, seed=0), version=1)
    with h5py.File(tmp_path / "n.h5", "a") as f:
        del f["bias"]
    with pytest.raises(InputError, match="/bias is missing"):
        read_network(tmp_path / "n.h5")
    write_network(tmp_path / "v2.h5", random_network(16, 2, seed=0))
    with h5py.File(tmp_path / "v2.h5", "a") as f:
        del f["layers/000002/bias"]
    with pytest.raises(InputError, match="/layers/000002/bias is missing"):
        read_network(tmp_path / "v2.h5")


def test_writer_leaves_no_partial_file(tmp_path, monkeypatch):
    import mpisdnn.formats.hdf5 as h

    net = random_network(16, 2, seed=0)
    monkeypatch.setattr(h, "_COMPRESSION", {"compression": "nope-not-a-filter"})
    with pytest.raises((ValueError, OSError)):
        write_network(tmp_path / "n.h5", net, version=1)
    assert list(tmp_path.iterdir()) == []


def test_official_file_reads_fast(official_dir):
    import time

    t = time.perf_counter()
    net = read_network_tsv(official_dir, layers=120)
    dt = time.perf_counter() - t
    assert len(net) == 120 and net.edges == 120 * 32768
    assert all(np.all(w.data == np.float32(0.0625)) for w in net.layers)
    assert sp.isspmatrix_csr(net.layers[0])
    print(f"read 120 official layers in {dt:.2f} s")


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_byte_ranges_cover_the_file_once(tmp_path, parts):
    from mpisdnn.formats.tsv import read_triples_range

    w = random_network(50, 1, seed=parts, density=0.3).layers[0]
    write_triples(tmp_path / "w.tsv", w)
    size = (tmp_path / "w.tsv").stat().st_size
    cuts = [size * k // parts for k in range(parts + 1)]
    got = [read_triples_range(tmp_path / "w.tsv", a, b, 50, 50) for a, b in zip(cuts, cuts[1:])]
    full = read_triples(tmp_path / "w.tsv", 50, 50)
    for k in range(3):
        np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), full[k])


def test_bad_line_in_a_later_byte_range_named_by_file_line(tmp_path):
    from mpisdnn.formats.tsv import read_triples_range

    lines = [f"{r}\t1\t1" for r in range(1, 30)]
    lines[24] = "25\t1\tabc"
    p = _write(tmp_path / "b.tsv", "\n".join(lines) + "\n")
    size = p.stat().st_size
    with pytest.raises(InputError, match=r"b.tsv:25: non-numeric"):
        read_triples_range(p, size // 2, size)
    assert read_triples_range(p, 0, size // 3)[0].size > 0


def test_space_separated_files_still_parse(tmp_path):
    p = _write(tmp_path / "s.tsv", "1 2 0.5\n3  1  2\n")
    r, c, v = read_triples(p, 3, 3)
    assert r.tolist() == [0, 2] and c.tolist() == [1, 0] and v.tolist() == [0.5, 2.0]


def test_numpy_fallback_without_pyarrow_gives_same_triples(tmp_path, monkeypatch):
    import mpisdnn.formats._tsv_text as text_grammar

    w = random_network(40, 1, seed=8, density=0.2).layers[0]
    write_triples(tmp_path / "w.tsv", w)
    fast = read_triples(tmp_path / "w.tsv", 40, 40)
    monkeypatch.setattr(text_grammar, "_arrow_parse", lambda text: None)
    slow = read_triples(tmp_path / "w.tsv", 40, 40)
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


def test_integer_lines_match_python_formatting():
    """The one integer-line formatter (TSV inputs and projection text) writes what Python's
    ``str`` writes: signs, zeros, the int64 extremes, two or three columns, any separator."""
    from mpisdnn.formats._tsv_write import format_int_lines, format_lines

    big = np.iinfo(np.int64).max
    rows = np.array([0, 7, -3, big, -big, 10, 1000000007], np.int64)
    cols = np.array([1, -40, 0, 9, 12, -1, 99], np.int64)
    vals = np.array([-5, 0, 123, -big, big, 100, 6], np.int64)
    want3 = "".join(f"{r},{c},{v}\n" for r, c, v in zip(*(a.tolist() for a in (rows, cols, vals))))
    assert format_int_lines(rows, cols, vals, ",") == want3.encode()
    want2 = "".join(f"{r} {c}\n" for r, c in zip(rows.tolist(), cols.tolist()))
    assert format_int_lines(rows, cols, None, " ") == want2.encode()
    assert format_lines(rows[:2], cols[:2], b"0.5") == b"0\t1\t0.5\n7\t-40\t0.5\n"
    assert format_int_lines(rows[:0], cols[:0], vals[:0]) == b""


@pytest.mark.parametrize("big,line", [("9007199254740993", 3), ("99999999999999999999999", 3),
                                      ("2147483648", 3), ("1e300", 3)])  # fmt: skip
def test_categories_past_the_row_limit_are_refused_naming_the_line(tmp_path, big, line):
    """A truth file is read as float64: 2**53 + 1 came back as 2**53, a row id of 23 digits
    wrapped to -2**63 (with a RuntimeWarning), both as categories of a PASS or FAIL; past
    the rows a run can have (``MAX_ROWS``) it is one line now."""
    (tmp_path / "t.tsv").write_text(f"1\n\n{big}\n4\n")
    with pytest.raises(InputError, match=rf"t.tsv:{line}: category '{big}' is beyond the "
                                         r"largest supported row count 2147483647"):  # fmt: skip
        read_categories(tmp_path / "t.tsv")
    (tmp_path / "ok.tsv").write_text("2147483647\n1\n")
    assert read_categories(tmp_path / "ok.tsv").tolist() == [1, 2147483647]
