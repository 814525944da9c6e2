"""The parallel inputs TSV reader on one rank: the compiled parser against ``float()``, the
single-rank path against an independent reader, and the input checks that need no ranks
(FIFOs, empty files, huge row ids, a file that changes between the two passes).

The same reader at 2 and 3 ranks: ``tests/test_tsv_parallel_mpi.py``.
"""

import os

import numpy as np
import pytest

from mpisdnn.cli import main
from mpisdnn.formats import _gz_segment
from mpisdnn.formats import tsv_parallel as tp
from mpisdnn.parallel import AgreedError

from .conftest import same_csr, self_comm
from .tsv_cases import VALUES, messy_file, reference


def _parse(text: bytes, ncols=1 << 20):
    from mpisdnn.formats import _tsv_kernels as K

    buf = np.frombuffer(text, dtype=np.uint8)
    cap = buf.size // 5 + 2
    rows, cols = np.empty(cap, np.int32), np.empty(cap, np.int32)
    vals = np.empty(cap, np.float32)
    bounds = np.array([0, ncols], np.int64)
    status, count, _, _ = K.parse_block(
        buf, buf.size, True, bounds, rows, cols, vals, np.empty(0, np.int64)
    )
    return status, rows[:count], cols[:count], vals[:count]


def test_compiled_parser_rounds_like_float():
    """Every value the fast path accepts is the float32 of ``float(text)``, bit for bit;
    anything else goes to the serial reader."""
    rng = np.random.default_rng(3)
    texts = list(VALUES[:11])
    for _ in range(3000):
        digits = "".join(str(d) for d in rng.integers(0, 10, int(rng.integers(1, 16))))
        point = int(rng.integers(0, len(digits) + 1))
        text = digits[:point] + "." + digits[point:] if rng.random() < 0.7 else digits
        if rng.random() < 0.5:
            text += f"e{int(rng.integers(-7, 8))}"  # within the exact powers of ten
        texts.append(("-" if rng.random() < 0.3 else "") + text)
    lines = "".join(f"{i + 1}\t7\t{t}\n" for i, t in enumerate(texts)).encode()
    status, rows, cols, vals = _parse(lines)
    assert status == 0 and rows.size == len(texts)
    expect = np.array([float(t) for t in texts], dtype=np.float64).astype(np.float32)
    assert np.array_equal(vals.view(np.int32), expect.view(np.int32))
    assert np.array_equal(rows, np.arange(len(texts))) and (cols == 6).all()
    for other in ("1e-30", "3.4028234e38", "1234567890123456", "nan", "inf", "1,5", "0x10"):
        assert _parse(f"1\t1\t{other}\n".encode())[0] == 1, other
    for other in ("1.0\t1\t1\n", "1\t1\n", "1\t1\t1\t1\n", "a\t1\t1\n", "0\t1\t1\n"):
        assert _parse(other.encode())[0] == 1, other


@pytest.mark.parametrize("block", [23, 64, 1 << 20])
def test_one_rank_equals_reference(tmp_path, monkeypatch, block):
    monkeypatch.setattr(tp, "BLOCK_BYTES", block)
    path = messy_file(tmp_path / "in.tsv", 31, 19, seed=block, crlf=block == 64, pad=2)
    with path.open("ab") as fh:  # one line longer than a block: the buffer grows for it
        fh.write(b"32\t19\t2" + b" " * 300 + b"\n")
    got = tp.read_images_parallel(self_comm(), path, 19)
    ref = reference(path, 19)
    got.y.indptr = got.y.indptr.astype(ref.indptr.dtype)
    assert same_csr(got.y, ref) and got.row_offset == 0
    assert got.stats["bytes"] == path.stat().st_size and got.stats["entries"] == ref.nnz


def test_rows_without_entries_count(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("2\t1\t1\n5\t3\t0.5\n")
    got = tp.read_images_parallel(self_comm(), path, 4, rows=8)
    assert got.y.shape == (8, 4) and got.g_rows == 8 and got.y.nnz == 2
    assert tp.read_images_parallel(self_comm(), path, 4).g_rows == 5


@pytest.mark.parametrize("flag", ["inputs", "truth"])
def test_fifo_is_refused_not_waited_on(tmp_path, capsys, flag):
    fifo = tmp_path / "pipe.tsv"
    os.mkfifo(fifo)
    (tmp_path / "in.tsv").write_text("1\t1\t1\n")
    src = fifo if flag == "inputs" else tmp_path / "in.tsv"
    argv = ["convert", "inputs", str(src), "--neurons", "4", "-o", str(tmp_path / "o.h5")]
    if flag == "truth":
        argv += ["--truth", str(fifo)]
    assert main(argv, self_comm()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{fifo}: not a regular file" in err[0], err


def test_fifo_inputs_and_truth_refused_by_infer_loaders(tmp_path):
    from mpisdnn.sdnn.load import load_inputs, load_truth

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(AgreedError, match="not a regular file"):
        load_inputs(self_comm(), fifo, 8)
    with pytest.raises(AgreedError, match="not a regular file"):
        load_truth(self_comm(), fifo)


def test_empty_file_is_refused_even_with_rows(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_bytes(b"")
    with pytest.raises(AgreedError, match=r"in.tsv: no entries: empty file \(0 bytes\)"):
        tp.read_images_parallel(self_comm(), path, 4, rows=3)


def test_row_id_past_int32_is_named(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("1\t1\t1\n3\t2\t1\n2147483648\t1\t1\n")
    with pytest.raises(AgreedError, match=r"in.tsv:3: row index 2147483648 is beyond"):
        tp.read_images_parallel(self_comm(), path, 4)


def test_truth_without_final_newline_warns_once(tmp_path, capsys):
    from mpisdnn.sdnn.load import load_truth

    path = tmp_path / "truth.tsv"
    path.write_text("3\n17")
    assert load_truth(self_comm(), path).tolist() == [3, 17]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mpisdnn: warning: {path}:2: last line has no newline: file cut short?"]


def test_one_pass_keeps_equal_values_once_and_sorts_any_order(tmp_path, monkeypatch):
    """The file is parsed once; a block of equal values is kept as one value, but 0 and -0
    (equal, different bits) are not equal values; rows written in any column order come
    out sorted."""
    monkeypatch.setattr(tp, "BLOCK_BYTES", 40)
    lines = [f"{r}\t{c}\t1\n" for c in (9, 3) for r in (2, 1)]  # all 1s; columns descending
    zeros = [(r, c, "-0" if (r + c) % 3 else "0") for c in (4, 5, 6, 7) for r in (1, 2, 3)]
    lines += [f"{r}\t{c}\t{v}\n" for r, c, v in zeros]
    lines += ["1\t1\t2.5\n", "3\t8\t1\n"]
    path = tmp_path / "in.tsv"
    path.write_text("".join(lines))
    calls = []
    real = tp._blocks
    monkeypatch.setattr(tp, "_blocks", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = tp.read_images_parallel(self_comm(), path, 9)
    ref = reference(path, 9)
    assert len(calls) == 1
    assert np.array_equal(got.y.indptr, ref.indptr) and np.array_equal(got.y.indices, ref.indices)
    assert got.y.data.view(np.int32).tolist() == ref.data.view(np.int32).tolist()
    assert got.y.data.view(np.int32)[9] == np.float32(-0.0).view(np.int32)  # row 2, col 5


def test_repeated_chunks_are_written_as_their_own_bytes(tmp_path, monkeypatch):
    """Chunks with the bytes of the chunk before reuse its compressed bytes; HDF5's own
    filter reads every chunk back exactly (all-1 values, then 0 and -0: equal, not alike)."""
    import h5py

    from mpisdnn.formats import hdf5

    monkeypatch.setattr(hdf5, "_CHUNK", 16)
    lines = [f"{r}\t{c}\t1\n" for c in range(1, 33) for r in range(1, 13)]  # 24 chunks
    lines += [f"{r}\t{c}\t{'-0' if r == 14 else '0'}\n" for r in (13, 14) for c in range(1, 17)]
    path = tmp_path / "in.tsv"
    path.write_text("".join(lines))
    argv = ["convert", "inputs", str(path), "--neurons", "32", "-o", str(tmp_path / "o.h5")]
    assert main(argv, self_comm()) == 0
    ref = reference(path, 32)
    with h5py.File(tmp_path / "o.h5", "r") as f:
        g = f["features"]
        assert g["data"].chunks == (16,)
        assert np.array_equal(g["indptr"][:], ref.indptr)
        assert np.array_equal(g["indices"][:], ref.indices)
        assert g["data"][:].view(np.int32).tolist() == ref.data.view(np.int32).tolist()


def test_repeated_value_text_is_parsed_as_its_own_value():
    """The parser reuses the last value when a line's value text repeats it: a text that
    only starts like the last one (``1`` then ``10``, ``1.5`` then ``1.5e1``), trailing
    blanks, lines in the general form (blanks, CR) between strict ones all get
    ``float(text)``."""
    texts = ["1", "1", "10", "1", "1.5", "1.5", "1.5e1", "1.5 ", "1.5", "-1", "1", "0.0625",
             "6.250000e-02", "6.250000e-02", "6.250000e-0", "6.250000e-02", "1.", "1"]  # fmt: skip
    forms = ["{r}\t{c}\t{t}\n", "{r} {c} {t}\n", " {r}\t\t{c}\t{t}\r\n", "{r}\t{c}\t{t}  \n"]
    lines = "".join(
        forms[i % len(forms) if i % 3 else 0].format(r=i + 1, c=5, t=t) for i, t in enumerate(texts)
    )
    status, rows, cols, vals = _parse(lines.encode())
    assert status == 0 and rows.size == len(texts)
    expect = np.array([float(t) for t in texts], dtype=np.float32)
    assert np.array_equal(vals.view(np.int32), expect.view(np.int32))


@pytest.mark.parametrize(
    "case", ["official", "shuffled", "values", "spaces", "no_newline", "duplicate", "gap"]
)
def test_layer_parser_equals_the_general_path(case):
    """``archive.parse_layer`` (the strict layer parser) gives the layer the general path
    (``parse_block`` + ``compact_from_triples``) gives, for official text and for text it
    must hand over (out of order, mixed values, blanks, no last newline, a repeat)."""
    from mpisdnn.errors import InputError
    from mpisdnn.formats import archive, tsv

    rng = np.random.default_rng(len(case))
    n = 16
    rows = np.concatenate([np.sort(rng.choice(n, 3, replace=False)) for _ in range(n)])
    cols = np.repeat(np.arange(n), 3)
    if case == "gap":  # a column without entries: colptr, not a fixed count
        keep = cols != 5
        rows, cols = rows[keep], cols[keep]
    vals = ["6.250000e-02"] * rows.size
    if case == "values":
        vals = [f"{v:.6e}" for v in rng.normal(size=rows.size)]
    order = np.arange(rows.size)
    if case == "shuffled":
        rng.shuffle(order)
    sep = " " if case == "spaces" else "\t"
    lines = [f"{rows[i] + 1}{sep}{cols[i] + 1}{sep}{vals[i]}" for i in order]
    if case == "duplicate":
        lines.insert(7, lines[3])
    text = "\n".join(lines) + ("" if case == "no_newline" else "\n")
    buf = np.frombuffer(text.encode(), np.uint8)
    if case == "duplicate":
        with pytest.raises(InputError, match=r"x\.tsv:8: duplicate entry"):
            archive.parse_layer(buf, "x.tsv", n, -0.3)
        return
    got = archive.parse_layer(buf, "x.tsv", n, -0.3)
    r, c, v = tsv._triples("x.tsv", text.encode(), n, n, 0)
    ref = tsv.compact_from_triples("x.tsv", text.encode(), r, c, v, n, -0.3)
    for name in ("neurons", "per_col", "value"):
        assert getattr(got, name) == getattr(ref, name), name
    for name in ("rows", "colptr", "values", "bias"):
        a, b = getattr(got, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert got.to_csr().nnz == rows.size


def test_owner_cuts_partition_cut_bands_stably():
    """``owner_cuts`` against a numpy stable sort by owner: bands of 4 rows, boundaries on
    band starts, inside bands, several in one band, empty row blocks, past the last row;
    values per entry move with their keys."""
    from mpisdnn.formats import _tsv_kernels as K

    rng = np.random.default_rng(7)
    for trial in range(200):
        shift = 2
        rows = np.sort(rng.integers(0, 40, int(rng.integers(0, 60))), kind="stable")
        rng.shuffle(rows)
        bands = np.zeros(40 // 4 + 2, np.int64)
        order = np.argsort(rows >> shift, kind="stable")  # the kept grouping
        rows = rows[order]
        np.add.at(bands, (rows >> shift) + 1, 1)
        np.cumsum(bands, out=bands)
        cols = rng.integers(0, 1 << 16, rows.size)
        keys = ((rows.astype(np.uint32) << 16) | cols.astype(np.uint32)).astype(np.uint32)
        bits = rng.integers(-(2**31), 2**31, rows.size).astype(np.int32)
        inner = np.sort(rng.integers(0, 45, int(rng.integers(1, 6))))
        offsets = np.concatenate(([0], inner, [max(45, int(inner[-1]))])).astype(np.int64)
        owner = np.searchsorted(offsets, rows, side="right") - 1
        expect = np.argsort(owner, kind="stable")
        cuts = np.empty(offsets.size, np.int64)
        tk, tb = np.empty(keys.size, np.uint32), np.empty(keys.size, np.int32)
        got_keys, got_bits = keys.copy(), bits.copy()
        K.owner_cuts(got_keys, got_bits, bands, shift, offsets, cuts, tk, tb)
        assert np.array_equal(got_keys, keys[expect]), trial
        assert np.array_equal(got_bits, bits[expect]), trial
        runs = np.searchsorted(owner[expect], np.arange(offsets.size), side="left")
        assert np.array_equal(cuts, runs), trial


def test_mixed_values_and_one_value_at_one_rank(tmp_path, monkeypatch):
    """Blocks of 1s, then one block with 2.5: the values are placed; a file of 1s only:
    one value, filled once; both equal one reader."""
    monkeypatch.setattr(tp, "BLOCK_BYTES", 40)
    lines = [f"{r}\t{c}\t1\n" for c in range(1, 9) for r in (3, 1, 2)]
    for name, extra in (("mixed", ["2\t9\t2.5\n"]), ("ones", ["2\t9\t1\n"])):
        path = tmp_path / f"{name}.tsv"
        path.write_text("".join(lines + extra))
        got = tp.read_images_parallel(self_comm(), path, 9)
        ref = reference(path, 9)
        assert np.array_equal(got.y.indptr, ref.indptr)
        assert np.array_equal(got.y.indices, ref.indices)
        assert got.y.data.view(np.int32).tolist() == ref.data.view(np.int32).tolist()
        assert got.stats["uniform_value"] is (name == "ones")


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 20])
def test_gzip_segment_is_the_lines_starting_in_its_range(tmp_path, monkeypatch, piece):
    """A rank's segment of a gzip file's text (:class:`_gz_segment.GzSegment`) is exactly
    the lines that start in ``[begin, end)``, as ``line_range`` cuts the plain file; the
    newlines before it are counted, and the text's size and last bytes reach the share
    when the segment runs into the end (always for the last rank's, ``end`` ``None``).
    Pieces of 1-64 bytes put every cut, newline and line across the inflater's pieces;
    lines of 0-40 bytes (blank ones too), with or without a last newline."""
    import gzip

    from mpisdnn.formats import tsv

    monkeypatch.setattr(_gz_segment, "GZ_PIECE", piece)
    rng = np.random.default_rng(piece)
    for trial in range(12):
        lines = [b"x" * int(k) for k in rng.integers(0, 40, int(rng.integers(1, 30)))]
        text = b"\n".join(lines) + (b"\n" if trial % 2 else b"")
        plain, path = tmp_path / "t.tsv", tmp_path / "t.tsv.gz"
        plain.write_bytes(text)
        path.write_bytes(gzip.compress(text))
        cuts = sorted(int(c) for c in rng.integers(0, len(text) + 3, 2))
        for begin, end in [(cuts[0], cuts[1]), (cuts[0], None), (0, None), (0, cuts[1])]:
            share = tp._Share(os.fspath(path), begin, end, gz=True, estimate=len(text))
            lo, hi = tsv.line_range(plain, begin, len(text) if end is None else end)
            with share.open() as seg:
                got = bytearray()
                buf = bytearray(int(rng.integers(1, 50)))
                while k := seg.readinto(buf):
                    got += buf[:k]
                assert bytes(got) == text[lo:hi], (begin, end, lo, hi)
                assert (seg.start, seg.lines_before) == (lo, text[:lo].count(b"\n"))
            if end is None:  # the last rank's: it always reads to the end
                assert share.text_bytes == len(text) and share.tail == text[-64:]
            elif hi < len(text):  # stopped before the end: the inflater stopped too
                assert share.tail is None and share.text_bytes == 0
            elif share.tail is not None:  # ran into the end (no newline after its line)
                assert share.text_bytes == len(text) and share.tail == text[-64:]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("neurons", [64, 70000])
def test_warmup_calls_the_kernels_in_the_types_of_a_real_read(tmp_path, monkeypatch, gz,
                                                             neurons):  # fmt: skip
    """The reader's warm-up (``warmup_steps``: what a first run's ranks compile before the
    read) passes every kernel exactly the types the read passes it: else the read would
    compile again, inside the load, and the warm-up would have compiled for nothing."""
    from mpisdnn.formats.gz import gzip_writer

    from .tsv_cases import kernel_types, uncovered

    if neurons > 1 << 16:  # a few entries in the columns past 2**16 (64-bit keys)
        rng = np.random.default_rng(5)
        rows, cols = rng.integers(1, 300, 400), rng.integers(1, neurons + 1, 400)
        pairs = sorted(set(zip(cols.tolist(), rows.tolist())))
        path = tmp_path / "in.tsv"
        path.write_text("".join(f"{r}\t{c}\t1\n" for c, r in pairs))
    else:
        path = messy_file(tmp_path / "in.tsv", rows=300, neurons=neurons, seed=5)
    if gz:
        with open(path, "rb") as src, gzip_writer(str(path) + ".gz", threads=1) as dst:
            dst.write(src.read())
        path = str(path) + ".gz"
    wide = neurons > 1 << 16
    warm = kernel_types(monkeypatch, lambda: [s() for s in tp.warmup_steps(1, gz, wide)])
    read = kernel_types(monkeypatch, lambda: tp.read_images_parallel(self_comm(), path, neurons))
    assert {"parse_block", "band_counts", "band_scatter", "place_keys", "sort_rows"} <= set(read)
    assert not uncovered(read, warm)
    assert "owner_cuts" not in warm  # one rank: no exchange, nothing compiled for it


def test_row_sort_is_stable_and_equals_numpys_at_every_run_boundary():
    """``sort_pairs`` (the hand-written sort of ``sort_rows``): keys ascending, the values
    moved with them, equal keys in their order (their values say which came first)."""
    from mpisdnn._sort_kernels import sort_pairs
    from mpisdnn.formats import _tsv_kernels as K

    rng = np.random.default_rng(11)
    for n in [0, 1, 2, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 4097]:
        keys = rng.integers(0, max(1, n // 4), n).astype(np.int32)
        vals = np.arange(n, dtype=np.float32)  # the original order
        order = np.argsort(keys, kind="stable")
        want_k, want_v = keys[order], vals[order]
        sort_pairs(keys, vals)
        assert np.array_equal(keys, want_k) and np.array_equal(vals, want_v), n
    indptr = np.array([0, 3, 3, 7], np.int64)
    indices = np.array([5, 1, 3, 9, 2, 9, 0], np.int32)
    data = np.arange(7, dtype=np.float32)
    assert tuple(K.sort_rows(indptr, indices, data)) == (2, 9)  # row 2 holds column 9 twice
    assert indices[:3].tolist() == [1, 3, 5] and data[:3].tolist() == [1, 2, 0]
