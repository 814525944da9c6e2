"""The parallel inputs TSV reader at any world size: the same rows, blocks and errors as one
reader of the whole file, and the same inference results as the HDF5 path.

Run as ``mpiexec -n K python -m mpi4py -m pytest --with-mpi -m mpi tests/test_tsv_parallel_mpi.py``
(the suite runs it at 2 and 3 ranks). Blocks of a few dozen bytes make every rank's range
many blocks, so lines also cross block boundaries, and rows arrive over many rounds.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.cli import main
from mpisdnn.formats import _gz_segment, read_inputs, write_inputs, write_triples
from mpisdnn.formats import _tsv_route as route
from mpisdnn.formats import tsv_parallel as tp
from mpisdnn.partition import balanced_blocks

from .conftest import random_inputs, random_network, run_infer, same_csr, world
from .tsv_cases import fixed_width_file, messy_file, reference

pytestmark = pytest.mark.mpi


@pytest.fixture
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(tp, "BLOCK_BYTES", 61)


def _shared_dir(comm, factory, name):
    return comm.bcast(factory.mktemp(name) if comm.rank == 0 else None)


def _whole(comm, block):
    parts = comm.allgather(block.y)
    return sp.vstack(parts, format="csr")


def _check(comm, path, neurons, rows=None, plain=None):
    block = tp.read_images_parallel(comm, path, neurons, rows)
    ref = reference(plain or path, neurons, rows)
    got = _whole(comm, block)
    got.indptr = got.indptr.astype(ref.indptr.dtype)
    assert same_csr(got, ref)
    assert np.array_equal(block.offsets, balanced_blocks(np.diff(ref.indptr), comm.size))
    assert block.row_offset == block.offsets[comm.rank]
    assert (block.g_rows, block.g_nnz) == (ref.shape[0], ref.nnz)
    return block


@pytest.mark.parametrize("crlf", [False, True])
def test_rows_equal_one_reader_wherever_the_ranges_cut(tmp_path_factory, tiny_blocks, crlf):
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "cuts")
    # leading blank lines shift every range boundary through all positions of a line
    for pad in range(0, 9):
        path = d / f"in{pad}.tsv"
        if comm.rank == 0:
            messy_file(path, 23, 17, seed=pad, crlf=crlf, pad=pad)
        comm.Barrier()
        _check(comm, path, 17)


@pytest.mark.parametrize("piece", [7, None])
@pytest.mark.parametrize("name", ["in.tsv.gz", "gzip-named.tsv"])
def test_gzip_inputs_equal_the_plain_read_at_any_rank_count(
    tmp_path_factory, monkeypatch, tiny_blocks, name, piece
):
    """A ``.tsv.gz`` (or a gzip file named ``.tsv``: told by its magic bytes) is read
    through the stream, each rank parsing its segment of the text in many tiny blocks
    (and with ``piece``, the inflater's pieces of 7 bytes: the segments' cuts fall
    inside them)."""
    import gzip

    if piece:
        monkeypatch.setattr(_gz_segment, "GZ_PIECE", piece)
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "gz")
    for pad in (0, 5):
        plain = d / f"plain{pad}.tsv"
        if comm.rank == 0:
            messy_file(plain, 23, 17, seed=pad + 40, pad=pad)
            (d / name).write_bytes(gzip.compress(plain.read_bytes()))
        comm.Barrier()
        block = _check(comm, d / name, 17, plain=plain)
        assert block.stats["bytes"] == plain.stat().st_size


def test_ranges_cut_exactly_at_line_starts(tmp_path_factory, tiny_blocks):
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "exact")
    path = d / "in.tsv"
    if comm.rank == 0:
        fixed_width_file(path, 40, 30, comm.size, seed=4)
    comm.Barrier()
    size = path.stat().st_size
    line = len(path.read_bytes().split(b"\n")[0]) + 1
    assert all((size * k // comm.size) % line == 0 for k in range(comm.size + 1))
    _check(comm, path, 30, rows=40)  # rows 38-40 may have no entries: they still count


def test_infer_from_tsv_is_bit_identical_to_hdf5(tmp_path_factory, tiny_blocks):
    from mpisdnn.sdnn.load import load_inputs

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "infer")
    net = random_network(48, 4, seed=5, density=0.2, negative=False, scale=1.0)
    y0 = random_inputs(61, 48, seed=6, density=0.2)
    if comm.rank == 0:
        write_triples(d / "in.tsv", y0)  # column order, like the official files
        write_inputs(d / "in.h5", y0)
    comm.Barrier()
    results = []
    for name in ("in.tsv", "in.h5"):
        y, r0, g_rows, _, offsets, _ = load_inputs(comm, d / name, 48)
        results.append((y, offsets, run_infer(net, y, comm, row_offset=r0, g_rows=g_rows)))
    (y1, o1, res1), (y2, o2, res2) = results
    assert same_csr(y1, y2) and np.array_equal(o1, o2)
    assert np.array_equal(res1.categories, res2.categories) and res1.categories.size
    assert res1.row_offset == res2.row_offset
    assert same_csr(sp.csr_matrix(res1.y_local), sp.csr_matrix(res2.y_local))


def _convert(comm, d, text, capsys, extra=(), name="in.tsv"):
    if comm.rank == 0:
        (d / name).write_bytes(text)
    comm.Barrier()
    argv = ["convert", "inputs", str(d / name), "--neurons", "8", "-o", str(d / "o.h5")]
    code = main([*argv, *extra], comm)
    err = capsys.readouterr().err.strip().splitlines() if comm.rank == 0 else []
    return code, err


def _lines(n, first_row=1):
    return [f"{first_row + i % 9}\t{1 + i // 9}\t1" for i in range(n)]


@pytest.mark.parametrize(
    "at,bad,expect",
    [
        (3, "4\tx\t1", "non-numeric field"),
        (40, "4\t9\t1", "column index 9 exceeds the size 8"),
        (57, "0\t2\t1", "positive 1-based integers"),
        (58, "3\t2\tnan", "value is nan"),
        (29, "3\t2\t-inf", "value is -inf"),
        (30, "3\t2\t1e39", "value 1e39 overflows float32"),  # issue 42 item 4
        (50, "3\t2", "expected 3 tab-separated columns"),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_bad_line_is_named_whichever_rank_reads_it(
    tmp_path_factory, capsys, tiny_blocks, at, bad, expect, gz
):
    import gzip

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "bad")
    lines = _lines(60)
    lines[at - 1] = bad
    text = ("\n".join(lines) + "\n").encode()
    name = "in.tsv.gz" if gz else "in.tsv"
    code, err = _convert(comm, d, gzip.compress(text) if gz else text, capsys, name=name)
    assert code == 2
    if comm.rank == 0:
        assert len(err) == 1 and f"{name}:{at}: " in err[0] and expect in err[0], err
        assert not (d / "o.h5").exists()


@pytest.mark.parametrize("gz", [False, True])
def test_duplicate_in_another_ranks_range_is_named(tmp_path_factory, capsys, tiny_blocks, gz):
    import gzip

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "dup")
    lines = _lines(60)
    lines[59] = lines[1]  # the first rank's line 2 again on the last line
    text = ("\n".join(lines) + "\n").encode()
    name = "in.tsv.gz" if gz else "in.tsv"
    code, err = _convert(comm, d, gzip.compress(text) if gz else text, capsys, name=name)
    assert code == 2
    if comm.rank == 0:
        assert len(err) == 1 and f"{name}:60: duplicate entry for row 2, column 1" in err[0], err
        assert not (d / "o.h5").exists()


def test_last_line_without_newline_is_read_with_one_warning(tmp_path_factory, capsys):
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "cut")
    lines = _lines(30)
    lines[-1] = "9\t8\t6"  # complete, no newline: read, and the warning says so
    code, err = _convert(comm, d, "\n".join(lines).encode(), capsys)
    assert code == 0
    if comm.rank == 0:
        assert err == [
            f"mpisdnn: warning: {d / 'in.tsv'}:30: last line has no newline: file cut short?"
        ]
        y, _ = read_inputs(d / "o.h5")
        assert y[8, 7] == 6.0 and y.nnz == 30


@pytest.mark.parametrize("gzipped", [False, True])
def test_last_line_cut_in_a_number_is_one_error(tmp_path_factory, capsys, gzipped):
    """Issue 42 item 11b: ``6.`` cut from ``6.25`` ran with only a warning."""
    import gzip

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, f"cutnum{gzipped}")
    lines = _lines(30)
    lines[-1] = "9\t8\t6."
    text = "\n".join(lines).encode()
    code, err = _convert(comm, d, gzip.compress(text) if gzipped else text, capsys)
    assert code == 2
    if comm.rank == 0:
        assert len(err) == 1 and "cut in the middle of a number" in err[0], err
        assert not (d / "o.h5").exists()


def test_conversion_output_is_the_same_at_every_rank_count(tmp_path_factory, monkeypatch):
    from mpisdnn.formats import hdf5

    from .conftest import self_comm

    monkeypatch.setattr(hdf5, "_CHUNK", 64)  # many chunks, several crossing rank blocks
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "bytes")
    y = random_inputs(200, 40, seed=8, density=0.15)
    if comm.rank == 0:
        write_triples(d / "in.tsv", y)
    comm.Barrier()
    argv = ["convert", "inputs", str(d / "in.tsv"), "--neurons", "40"]
    assert main([*argv, "-o", str(d / "p.h5")], comm) == 0
    if comm.rank == 0:
        assert main([*argv, "-o", str(d / "s.h5")], self_comm()) == 0
        assert (d / "p.h5").read_bytes() == (d / "s.h5").read_bytes()
        got, _ = read_inputs(d / "p.h5")
        assert same_csr(got, reference(d / "in.tsv", 40))
    comm.Barrier()


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_truncated_gzip_is_one_error_line(tmp_path_factory, capsys, cut):
    import gzip

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "gzcut")
    packed = gzip.compress(("\n".join(_lines(600)) + "\n").encode())
    code, err = _convert(comm, d, packed[: int(len(packed) * cut)], capsys, name="in.tsv.gz")
    assert code == 2
    if comm.rank == 0:
        assert len(err) == 1 and "in.tsv.gz: truncated gzip file" in err[0], err
        assert not (d / "o.h5").exists()


def _write(comm, d, name, lines):
    path = d / name
    if comm.rank == 0:
        path.write_text("".join(lines))
    comm.Barrier()
    return path


@pytest.mark.parametrize("shift", [1, 3])
def test_row_blocks_cutting_bands_and_values_differing_by_rank(
    tmp_path_factory, monkeypatch, tiny_blocks, shift
):
    """Row block boundaries inside bands of rows (bands of 2 or 8 rows: several boundaries
    in one band at 3 ranks), the first ranks' ranges all 1s and the last one's all 0.5
    (each rank's own values alike, the file's not: the values are routed): every rank's
    rows are one reader's."""
    monkeypatch.setattr(route, "BAND_SHIFT", shift)
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, f"bands{shift}")
    rng = np.random.default_rng(shift)
    y = sp.random(37, 24, density=0.35, random_state=rng, format="coo")
    order = np.lexsort((y.row, y.col))  # column order: every range holds every row
    lines = [f"{y.row[i] + 1}\t{y.col[i] + 1}\t{1 if y.col[i] < 18 else 0.5}\n" for i in order]
    routed = []
    real = route.alltoallv_array
    monkeypatch.setattr(route, "alltoallv_array", lambda *a: routed.append(a[1].dtype) or real(*a))
    block = _check(comm, _write(comm, d, "in.tsv", lines), 24)
    assert block.stats["uniform_value"] is False
    assert comm.size == 1 or np.dtype(np.int32) in routed  # the values go with the keys


def test_one_value_is_placed_once_with_its_bits(tmp_path_factory, monkeypatch, tiny_blocks):
    """A file whose values are all ``-0`` (the bits of -0.0, not 0.0): nothing but keys is
    routed, and every entry has those bits."""
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "negzero")
    lines = [f"{r}\t{c}\t-0\n" for c in range(1, 13) for r in range(1, 20) if (r * c) % 3]
    routed = []
    real = route.alltoallv_array
    monkeypatch.setattr(route, "alltoallv_array", lambda *a: routed.append(a[1].dtype) or real(*a))
    block = _check(comm, _write(comm, d, "in.tsv", lines), 12)
    assert block.stats["uniform_value"] is True
    assert (block.y.data.view(np.int32) == np.float32(-0.0).view(np.int32)).all()
    assert np.dtype(np.int32) not in routed  # keys (and _plan's counts), never the values
    assert block.stats["sent_bytes"] % 4 == 0


@pytest.mark.parametrize("where", ["rows", "columns"])
def test_rows_or_columns_past_16_bits(tmp_path_factory, tiny_blocks, where):
    """Row ids or columns past 65536: wide keys on the wire, blocks of small rows widened
    for it (kept narrow), the same rows as one reader."""
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, f"wide{where}")
    lines = [f"{r}\t{c}\t{r % 3 + 1}\n" for c in range(1, 9) for r in range(1, 12)]
    neurons = 8
    if where == "rows":
        lines += ["70001\t3\t2\n", "70002\t8\t1\n"]
    else:
        neurons = 70000
        lines += ["5\t65537\t2\n", "11\t70000\t1\n"]
    _check(comm, _write(comm, d, "in.tsv", lines), neurons)


def test_rank_without_rows(tmp_path_factory, tiny_blocks):
    """One row for all ranks: the others own no rows (empty CSR), yet route their parts."""
    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "onerow")
    lines = [f"1\t{c}\t{1 + c % 2}\n" for c in range(1, 31)]
    block = _check(comm, _write(comm, d, "in.tsv", lines), 30)
    sizes = comm.allgather(block.y.shape[0])
    assert sum(sizes) == 1 and max(sizes) == 1


def test_gzip_whose_trailer_understates_the_text(tmp_path_factory, monkeypatch, tiny_blocks):
    """Two gzip members, the last one 40 % of the text: its trailer's ISIZE (what the ranges
    and the kept keys' arenas are planned from: not under a quarter of the first bytes'
    ratio, so it is believed) says far less than the text, so the last rank's arena runs
    short and its later blocks take their own maps; the rows are still one reader's."""
    import gzip

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "members")
    plain, path = d / "plain.tsv", d / "in.tsv.gz"
    if comm.rank == 0:
        messy_file(plain, 23, 17, seed=9)
        text = plain.read_bytes()
        cut = text.index(b"\n", len(text) * 6 // 10) + 1
        path.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    comm.Barrier()
    taken = []
    real = route.Arena.take
    monkeypatch.setattr(
        route.Arena, "take", lambda self, n: taken.append(real(self, n)) or taken[-1]
    )
    _check(comm, path, 17, plain=plain)
    # the plan's text is 40 % of it: the last rank parses most, part in its own maps
    seen = comm.allgather((any(t is not None for t in taken), any(t is None for t in taken)))
    assert any(a for a, _ in seen) and any(b for _, b in seen)


@pytest.mark.parametrize("gz", [False, True])
def test_warmup_covers_the_kernels_of_every_ranks_read(tmp_path_factory, monkeypatch, gz):
    """What a first run's ranks compile before the read (``warmup_steps`` at this rank
    count) is what each rank's read then calls, type for type, the exchange's and a gzip
    skip's kernels included; and on the ranks that warm up before the read (all but rank
    0, ``sdnn.load``) every warmed kernel is one the read uses."""
    from mpisdnn.formats.gz import gzip_writer

    from .tsv_cases import kernel_types, uncovered

    comm = world()
    d = _shared_dir(comm, tmp_path_factory, "warm")
    path = d / ("in.tsv.gz" if gz else "in.tsv")
    if comm.rank == 0:
        messy_file(d / "in.tsv", rows=40 * comm.size, neurons=64, seed=9)
        if gz:
            with open(d / "in.tsv", "rb") as src, gzip_writer(str(path), threads=1) as dst:
                dst.write(src.read())
    comm.barrier()
    warm = kernel_types(monkeypatch, lambda: [s() for s in tp.warmup_steps(comm.size, gz)])
    read = kernel_types(monkeypatch, lambda: tp.read_images_parallel(comm, str(path), 64))
    assert not uncovered(read, warm)
    if comm.rank > 0:
        assert set(warm) <= set(read)
