"""Projection writers and readers under abuse (issue 15): full disks, concurrent runs, lying
headers, leftovers of killed runs, crafted part tables, overflowing weights.

Every test asserts the exit code, the single error line, that a previous good output is
intact, and that no temporary file is left.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from mpisdnn.errors import InputError
from mpisdnn.generate.graphs import bipartite
from mpisdnn.projection import project_matrix, read_projection, write_graph
from tests.conftest import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _md5(path) -> str:
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def _assert_one_error_line(res, *words):
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert err.count("\n") == 0 and err.startswith("mpisdnn: error:"), err
    for w in words:
        assert w in err, err


def _hidden(directory):
    return [x for x in os.listdir(directory) if x.startswith(".")]


@pytest.fixture
def small_disk(tmp_path):
    """A 300 KiB tmpfs (root with mount rights), else skip: the library-level test below
    covers the same path with RLIMIT_FSIZE everywhere."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(d)],
                       capture_output=True)  # fmt: skip
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield d
    subprocess.run(["umount", str(d)], capture_output=True)


def test_full_disk_keeps_the_previous_outputs(small_disk):
    g = small_disk / "g.h5"
    r = run_cli(["generate", "rmat", "--scale", "9", "-o", g])
    assert r.returncode == 0, r.stderr
    before = _md5(g)
    big = ["generate", "bipartite", "--rows", "20000", "--cols", "9000", "--edges", "900000",
           "-o", g]  # fmt: skip
    _assert_one_error_line(run_cli(big), "g.h5", "no space left")
    assert _md5(g) == before and _hidden(small_disk) == []
    for ranks in (1, 2):
        res = run_cli(["project", g, "-o", small_disk / "h.h5"], ranks=ranks)
        _assert_one_error_line(res, "h.h5", "no space left")
        assert sorted(os.listdir(small_disk)) == ["g.h5"], os.listdir(small_disk)


def _fill(directory, leave: int) -> None:
    st = os.statvfs(directory)
    (directory / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))


def test_disk_full_from_the_start_and_text_outputs(small_disk):
    """Sweep E11, E16: a part that cannot even be created (compressed or not, one rank
    failing while the other started), and a text output that fills the disk: exit 2, no
    traceback, nothing left on the disk."""
    g = small_disk.parent / "g.h5"
    write_graph(g, bipartite(300, 200, edges=3000, seed=1))
    _fill(small_disk, 4096)
    for extra in ([], ["--compress", "gzip"]):
        res = run_cli(["project", g, "-o", small_disk / "h.h5", *extra], ranks=2)
        _assert_one_error_line(res, "h.h5", "no space left")
        assert sorted(os.listdir(small_disk)) == ["filler"], os.listdir(small_disk)
    (small_disk / "filler").unlink()
    _fill(small_disk, 64 << 10)
    _assert_one_error_line(run_cli(["project", g, "-o", small_disk / "h.tsv"]), "h.tsv")
    for ranks in (2, 3):
        # Was (sweep E11): one line per failing rank plus MPICH's Abort line; the failure is
        # now agreed on at the close: one line for the job, no abort.
        res = run_cli(["project", g, "-o", small_disk / "h.tsv"], ranks=ranks)
        _assert_one_error_line(res, "h.tsv", "no space left")
        assert sorted(os.listdir(small_disk)) == ["filler"], os.listdir(small_disk)


def test_full_disk_library_fallback_with_a_file_size_limit(tmp_path):
    """Without tmpfs: RLIMIT_FSIZE makes writes fail with EFBIG (SIGXFSZ ignored)."""
    g = tmp_path / "g.h5"
    write_graph(g, bipartite(50, 40, edges=200, seed=1))
    before = _md5(g)
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "from mpisdnn.generate.graphs import bipartite\n"
        "from mpisdnn.projection import write_graph\n"
        "from mpisdnn.errors import InputError\n"
        "try:\n"
        f"    write_graph({str(g)!r}, bipartite(2000, 1000, edges=200000, seed=2))\n"
        "except InputError as e:\n"
        "    print(e); sys.exit(2)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))  # fmt: skip
    assert r.returncode == 2 and "no space left" in r.stdout, (r.stdout, r.stderr)
    assert _md5(g) == before and _hidden(tmp_path) == []


def test_two_concurrent_runs_into_one_output_leave_a_complete_one(tmp_path):
    g = tmp_path / "g.h5"
    a = bipartite(400, 300, edges=9000, seed=3)
    write_graph(g, a)
    want = project_matrix(a)
    out = tmp_path / "h.h5"
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "mpisdnn", "project", str(g), "-o", str(out),
           "--memory-per-rank", "64K", "--quiet"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT)
    for _ in range(3):
        procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) for _ in "ab"]
        codes = [p.wait(timeout=120) for p in procs]
        errs = [p.stderr.read() for p in procs]
        assert all(c in (0, 2) for c in codes) and 0 in codes, errs
        got = read_projection(out)  # the index names parts that all exist, with all rows
        assert (got != want).nnz == 0 and got.nnz == want.nnz
    # the last winner's parts (index + data per rank), and nothing of dead runs
    from mpisdnn.formats.projection.h5 import clean_leftovers

    clean_leftovers(out)
    assert len(os.listdir(f"{out}.parts")) == 4


def test_rerun_cleans_leftovers_of_a_killed_run(tmp_path):
    g = tmp_path / "g.h5"
    write_graph(g, bipartite(100, 80, edges=1500, seed=4))
    out = tmp_path / "h.h5"
    assert run_cli(["project", g, "-o", out, "--quiet"], ranks=2).returncode == 0
    host = os.uname().nodename
    dead = 2**22 + 12345  # above pid_max's default: no such process
    parts = tmp_path / "h.h5.parts"
    tag = f"@{host}-{dead}"
    junk = [
        tmp_path / f".h.h5.tmp{tag}",
        parts / f".x-r00000{tag}.h5.tmp",
        parts / f"deadbeef-r00000{tag}.h5",
        tmp_path / f".h.tsv.ab-r00000{tag}.part",
    ]
    other = parts / f"cafe0000-r00000@otherhost-{dead}.h5"  # another host: never touched
    for p in junk + [other]:
        p.write_bytes(b"x" * 100)
    assert run_cli(["project", g, "-o", out, "--quiet"], ranks=2).returncode == 0
    assert [p for p in junk[:3] if p.exists()] == [] and other.exists()
    assert run_cli(["project", g, "-o", tmp_path / "h.tsv", "--quiet"], ranks=2).returncode == 0
    assert not junk[3].exists()
    assert (read_projection(out) != read_projection(tmp_path / "h.tsv")).nnz == 0


@pytest.mark.parametrize(
    "text, words",
    [
        ("%%MatrixMarket matrix coordinate pattern general\n3 3000000000 2\n1 1\n2 5\n",
         ["too small", "3000000000 nodes"]),
        ("%%MatrixMarket matrix coordinate pattern general\n3 1000000000000 2\n1 1\n2 5\n",
         ["too small", "1000000000000 nodes"]),
    ],
)  # fmt: skip
def test_headers_claiming_huge_sizes_fail_fast_in_one_line(tmp_path, text, words):
    (tmp_path / "g.mtx").write_text(text)
    res = run_cli(["project", tmp_path / "g.mtx", "-o", tmp_path / "h.h5"], ranks=1, timeout=60)
    _assert_one_error_line(res, *words)
    assert not (tmp_path / "h.h5").exists()


def test_graph_h5_claiming_huge_columns_fails_fast(tmp_path):
    import h5py

    g = tmp_path / "g.h5"
    write_graph(g, bipartite(5, 4, edges=8, seed=1))
    with h5py.File(g, "r+") as f:
        f.attrs["cols"] = 3_000_000_000
    res = run_cli(["project", g, "-o", tmp_path / "h.h5"], ranks=2, timeout=60)
    _assert_one_error_line(res, "too small")


@pytest.mark.parametrize("name", ["indices", "indptr"])
def test_graph_h5_float_index_datasets_are_refused(tmp_path, name):
    """Float ids (NaN among them) were truncated by a cast and crashed the kernel (sweep K7)."""
    import h5py

    g = tmp_path / "g.h5"
    write_graph(g, bipartite(5, 4, edges=8, seed=1))
    with h5py.File(g, "r+") as f:
        values = f[name][()].astype(np.float64)
        values[-1] = np.nan if name == "indices" else values[-1]
        del f[name]
        f[name] = values
    res = run_cli(["project", g, "-o", tmp_path / "h.h5"], ranks=2, timeout=60)
    _assert_one_error_line(res, f"/{name} must be 1-D integers")
    assert not (tmp_path / "h.h5").exists()


def test_product_overflow_is_refused_before_writing(tmp_path):
    (tmp_path / "g.mtx").write_text(
        "%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1e200\n2 1 1e200\n"
    )
    out = tmp_path / "h.h5"
    res = run_cli(["project", tmp_path / "g.mtx", "--weight", "product", "--onto", "rows",
                   "-o", out], ranks=2)  # fmt: skip
    _assert_one_error_line(res, "overflows")
    assert not out.exists()
    # just below the limit the weights are finite and exact
    a = sp.csr_matrix(np.array([[1e150], [1e150]]))
    h = project_matrix(a, weight="product", onto="rows")
    assert np.isfinite(h.data).all() and h[0, 1] == 1e150 * 1e150


@pytest.fixture
def two_part_output(tmp_path):
    g = tmp_path / "g.h5"
    write_graph(g, bipartite(60, 50, edges=600, seed=5))
    out = tmp_path / "h.h5"
    assert run_cli(["project", g, "-o", out, "--quiet"], ranks=2).returncode == 0
    return out


def _set_part(out, entry):
    import h5py

    with h5py.File(out, "r+") as f:
        files = f["parts/files"][()]
        files[0] = entry.encode()
        del f["parts/files"]
        f["parts/files"] = files


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "fifo", "symlink", "subdir"])
def test_reader_accepts_only_regular_files_inside_the_parts_dir(two_part_output, kind):
    out = two_part_output
    parts = f"{out}.parts"
    first = sorted(x for x in os.listdir(parts) if not x.endswith(".data.h5"))[0]
    if kind == "dotdot":
        entry = f"h.h5.parts/../{first}"
    elif kind == "absolute":
        entry = "/etc/passwd"
    elif kind == "subdir":
        entry = f"h.h5.parts/x/{first}"
    else:
        name = "p.h5"
        if kind == "fifo":
            os.mkfifo(os.path.join(parts, name))
        else:
            os.symlink(os.path.join(parts, first), os.path.join(parts, name))
        entry = f"h.h5.parts/{name}"
    _set_part(out, entry)
    with pytest.raises(InputError, match="part"):
        read_projection(out)  # never hangs on the FIFO, never follows the path out


def _written_projection(tmp_path, storage):
    a = sp.random(30, 20, density=0.3, format="csr", random_state=3, dtype=np.float64)
    out = tmp_path / f"H-{storage}.h5"
    res = run_cli(["project", _edges_file(tmp_path, a), "-o", out, "--storage", storage,
                   "--quiet"])  # fmt: skip
    assert res.returncode == 0, res.stderr
    return out


def _edges_file(tmp_path, a):
    coo = a.tocoo()
    path = tmp_path / "e.tsv"
    path.write_text("".join(f"{r}\t{c}\n" for r, c in zip(coo.row, coo.col)))
    return path


@pytest.mark.parametrize("storage", ["general", "symmetric"])
def test_a_damaged_projection_file_is_one_line(tmp_path, storage):
    """Row pointers past the entries, a column past the matrix (damaged data), a flipped
    byte in any object header (a failed metadata checksum: h5py's ``KeyError``): scipy's
    ``ValueError`` or h5py's error was an internal error; a column past the matrix in
    symmetric storage was mirrored into a wrong matrix. Each is one line now."""
    import h5py

    from mpisdnn.errors import MpisdnnError
    from mpisdnn.projection import iter_projection

    out = _written_projection(tmp_path, storage)
    good = read_projection(out)
    raw = out.read_bytes()
    for name, at, value in (("indptr", -1, 10**6), ("indices", 0, 10**6)):
        bad = tmp_path / f"bad-{name}.h5"
        bad.write_bytes(raw)
        with h5py.File(bad, "r+") as f:
            f[name][at] = value
        with pytest.raises(InputError, match="bad-.*(row pointers|column indices)"):
            read_projection(bad)
        with pytest.raises(InputError, match="bad-"):
            list(iter_projection(bad, 7))
    lines = 0
    for at in [i for i in range(len(raw)) if raw.startswith(b"OHDR", i)]:
        bad = bytearray(raw)
        bad[at + 8] ^= 0xFF
        (tmp_path / "ohdr.h5").write_bytes(bytes(bad))
        try:
            got = read_projection(tmp_path / "ohdr.h5")
        except MpisdnnError as exc:
            assert "ohdr.h5" in str(exc)
            lines += 1
        else:
            assert (got != good).nnz == 0
    assert lines >= 3
