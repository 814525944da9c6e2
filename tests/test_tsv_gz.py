"""Serial readers on files as published: gzip (by magic bytes, any name), archives of layers,
and the issue-42 refusals (float32 overflow, ids past float64, a last line cut in a number)."""

import gzip

import numpy as np
import pytest

from mpisdnn.errors import InputError
from mpisdnn.formats import tsv

from .conftest import SHARED


def test_gzip_named_tsv_is_read_not_called_non_numeric(tmp_path):
    text = b"1\t1\t1\n2\t3\t0.5\n"
    (tmp_path / "plain.tsv").write_bytes(text)
    (tmp_path / "gz.tsv").write_bytes(gzip.compress(text))
    a = tsv.read_triples(tmp_path / "plain.tsv")
    b = tsv.read_triples(tmp_path / "gz.tsv")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_gzip_truth_file_is_read(tmp_path):
    (tmp_path / "t.tsv.gz").write_bytes(gzip.compress(b"3\n1\n7\n"))
    assert tsv.read_categories(tmp_path / "t.tsv.gz").tolist() == [1, 3, 7]


def test_truncated_gzip_is_one_line(tmp_path):
    raw = gzip.compress(b"".join(b"%d\t1\t1\n" % i for i in range(1, 5000)))
    (tmp_path / "t.tsv.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="truncated gzip file"):
        tsv.read_triples(tmp_path / "t.tsv.gz")


@pytest.mark.parametrize("value", ["1e39", "-3.5e38"])
def test_float32_overflow_is_refused_like_inf(tmp_path, value):
    """Issue 42 item 4: ``1e39`` passed the finiteness check and became inf."""
    (tmp_path / "w.tsv").write_text(f"1\t1\t0.5\n2\t2\t{value}\n")
    with pytest.raises(InputError, match=rf"w.tsv:2: value {value} overflows float32"):
        tsv.read_triples(tmp_path / "w.tsv")
    with pytest.raises(InputError, match="overflows float32"):
        tsv.read_weight_compact(tmp_path / "w.tsv", 4, -0.3)


def test_id_past_float64_is_too_large_not_not_positive(tmp_path):
    """Issue 42 item 12: a 40 MiB row id was refused as "must be positive" (here 400
    digits: past float64's range as well)."""
    (tmp_path / "i.tsv").write_text("1\t1\t1\n" + "7" * 400 + "\t1\t1\n")
    with pytest.raises(InputError, match=r"i.tsv:2: row index 7{24}\.\.\. is too large"):
        tsv.read_triples(tmp_path / "i.tsv")


def test_last_line_cut_in_a_number_is_refused_complete_one_is_read(tmp_path):
    (tmp_path / "cut.tsv").write_bytes(b"1\t1\t1\n2\t2\t6.")
    with pytest.raises(InputError, match="cut in the middle of a number"):
        tsv.read_triples(tmp_path / "cut.tsv")
    (tmp_path / "ok.tsv").write_bytes(b"1\t1\t1\n2\t2\t6")
    assert tsv.read_triples(tmp_path / "ok.tsv")[2].tolist() == [1.0, 6.0]


def test_official_archive_reads_as_its_unpacked_directory(official_dir):
    """neuron1024.tar.gz as published (members not in layer order) gives the directory's
    network, layer for layer."""
    from mpisdnn.formats.archive import read_network_archive

    a = read_network_archive(SHARED / "neuron1024.tar.gz", layers=120)
    b = tsv.read_network_tsv(official_dir, layers=120)
    assert len(a) == len(b) == 120 and a.neurons == b.neurons == 1024
    for x, y in zip(a.layers, b.layers):
        assert (x != y).nnz == 0
    assert np.array_equal(a.bias, b.bias)


@pytest.mark.parametrize("name", ["y.tsv.gz", "y.tsv"])
def test_written_tsv_gz_is_gzip_and_reads_back(tmp_path, name):
    """``write_triples`` gzips a ``.gz`` name (as ``sparse-images-{N}.tsv.gz`` is published)
    and only that: the standard library inflates it to the plain text, which reads back as
    the matrix."""
    import scipy.sparse as sp

    from mpisdnn.formats.gz import is_gzip

    y = sp.random(300, 64, density=0.1, format="csr", random_state=3, dtype=np.float32)
    y.data[:] = 1
    tsv.write_triples(tmp_path / name, y)
    tsv.write_triples(tmp_path / "plain", y)
    raw = (tmp_path / name).read_bytes()
    assert is_gzip(tmp_path / name) == name.endswith(".gz")
    text = gzip.decompress(raw) if name.endswith(".gz") else raw
    assert text == (tmp_path / "plain").read_bytes()
    back = tsv.read_images_tsv(tmp_path / name, 64)
    assert (back != y).nnz == 0 and back.shape == y.shape


def test_text_size_estimate_exact_for_one_member_and_near_the_ratio_past_4_gib(tmp_path):
    """The plan's text size: a one-member file under 4 GiB gives its trailer's ISIZE; for a
    file whose text passes 4 GiB (a sparse file here: a zeros stream's first bytes, the rest
    a hole, the trailer at 1 GiB) the multiple of 2**32 added brings the estimate nearest
    the first bytes' ratio, and the estimate still ends in the trailer's ISIZE."""
    import gzip

    from mpisdnn.formats.gz import _zlib, text_size_estimate

    text = b"12\t345\t1\n" * 50_000
    one = tmp_path / "one.tsv.gz"
    one.write_bytes(gzip.compress(text))
    assert text_size_estimate(one) == len(text)
    head = gzip.compress(bytes(1 << 24), 9)[: 1 << 14]
    big = tmp_path / "big.gz"
    with open(big, "wb") as fh:
        fh.write(head)
        fh.seek((1 << 30) - 4)
        fh.write((123_456).to_bytes(4, "little"))
    d = _zlib().decompressobj(31)  # the library the estimate uses: its input step differs
    ratio = len(d.decompress(head, 64 * len(head))) / (len(head) - len(d.unconsumed_tail))
    est = text_size_estimate(big, sample=len(head))  # the hole after it is no gzip data
    assert est % 2**32 == 123_456 and est > 2**32
    assert abs(est - ratio * (1 << 30)) <= 2**31


def test_text_size_estimate_of_many_members_follows_the_ratio(tmp_path):
    """Members of 64 KiB of text (as ``bgzip`` writes them), the last one short: the last
    trailer's ISIZE says little, so the estimate is the first bytes' ratio times the file
    (within a factor 2 of the text here), not the last member's size."""
    import gzip

    from mpisdnn.formats.gz import text_size_estimate

    rng = np.random.default_rng(5)
    text = "".join(f"{r}\t{c}\t1\n" for r, c in rng.integers(1, 60000, (200_000, 2))).encode()
    step = 1 << 16
    path = tmp_path / "members.tsv.gz"
    path.write_bytes(b"".join(gzip.compress(text[i : i + step]) for i in range(0, len(text), step)))
    last = len(text) % step or step
    est = text_size_estimate(path)
    assert est != last and len(text) / 2 <= est <= 2 * len(text)


def test_a_plain_tar_cut_inside_its_first_header_is_named_truncated(tmp_path):
    """``neuron16.tar`` cut to 100 bytes: ``convert network`` said it was "not a directory
    ... nor a tar archive" (the sniff needs a whole 512-byte header) while ``infer``'s
    reader said "truncated archive"; both say it is cut now."""
    import tarfile

    from .conftest import run_cli

    (tmp_path / "n16-l1.tsv").write_text("1\t1\t1\n")
    with tarfile.open(tmp_path / "neuron16.tar", "w") as t:
        t.add(tmp_path / "n16-l1.tsv", "neuron16/n16-l1.tsv")
    raw = (tmp_path / "neuron16.tar").read_bytes()
    (tmp_path / "neuron16.tar").write_bytes(raw[:100])
    for argv in (["convert", "network", tmp_path / "neuron16.tar", "-o", tmp_path / "o.h5"],
                 ["infer", "--network", tmp_path / "neuron16.tar", "--inputs", tmp_path / "i.h5",
                  "--bias", "-0.3"]):  # fmt: skip
        res = run_cli([*argv, "--bias", "-0.3"] if argv[0] == "convert" else argv)
        err = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(err) == 1, err
        assert "neuron16.tar: truncated archive (ends inside a header)" in err[0], err
