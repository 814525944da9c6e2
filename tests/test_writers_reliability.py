"""Writers survive full disks, interruptions and crafted files (issue 15, items 2, 3, 5, 6, 7).

Every failure test checks the same four things: the previous good output is intact, the exit
code is 2, stderr is one ``mpisdnn: error:`` line naming the file, and no temporary file is
left. Full-disk tests use a small tmpfs when the tests run as root and may mount one, else a
file size limit (``RLIMIT_FSIZE``, which fails writes with ``EFBIG``) on the child process.
"""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from mpisdnn.errors import InputError, MpisdnnError
from mpisdnn.formats import read_network_tsv, write_inputs, write_network, write_triples
from mpisdnn.formats._atomic import OutputError, atomic_dir, atomic_path
from mpisdnn.formats.hdf5 import read_inputs, read_inputs_meta, read_network
from mpisdnn.formats.tsv import scan_network_dir

from .conftest import mpiexec, random_inputs, random_network, run_here

DISK_BYTES = 1 << 19


#: Runs the CLI with a file size limit set *after* MPI start-up (MPI's own shared-memory
#: files need more than the limit allows).
_LIMITED = (
    "import resource, sys; from mpi4py import MPI; "
    "n = int(sys.argv.pop(1)); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "from mpisdnn.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _cli(args, ranks=1, fsize=None, timeout=120, isolated=False):
    """``mpisdnn ARGS``: at one rank without a file-size limit in this process
    (:func:`run_here`) unless ``isolated``, else a process (``mpiexec`` at several ranks),
    under RLIMIT_FSIZE with ``fsize``."""
    if fsize is None and ranks == 1 and not isolated:
        return run_here(args, timeout)
    if fsize is None:
        cmd = [sys.executable, "-m", "mpisdnn", *map(str, args)]
    else:
        cmd = [sys.executable, "-c", _LIMITED, str(fsize), *map(str, args)]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _generate_network(*args):
    """``mpisdnn generate network --neurons 512 ARGS`` at one rank."""
    return _cli(["generate", "network", "--neurons", "512", *args])


def _assert_one_error_line(res, *words):
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("mpisdnn: error:")
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _snapshot(directory):
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, directory)] = fh.read()
    return out


@pytest.fixture
def small_disk(tmp_path):
    """``(directory, fsize)``: a 512 KiB tmpfs (fsize None), or a plain directory plus a file
    size limit for the child processes."""
    d = tmp_path / "disk"
    d.mkdir()
    mounted = False
    if os.geteuid() == 0:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(d)],
            capture_output=True,
        )
        mounted = res.returncode == 0
    try:
        yield d, (None if mounted else DISK_BYTES // 2)
    finally:
        if mounted:
            subprocess.run(["umount", str(d)], capture_output=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A 24-layer N=512 TSV network and a poorly compressible inputs TSV (off the small disk)."""
    from mpisdnn.generate.radixnet import radixnet

    d = tmp_path_factory.mktemp("src")
    for k, w in enumerate(radixnet(512, 24, seed=1).layers):
        write_triples(d / "net" / f"n512-l{k + 1}.tsv", w)
    y = random_inputs(4000, 256, seed=2, density=0.3)
    y.data = np.random.default_rng(0).random(y.nnz).astype(np.float32) + 0.5
    write_triples(d / "in.tsv", y)
    write_triples(d / "small.tsv", y[:20])
    return d


_CONVERT_NETWORK = (
    ["convert", "network", "{src}/net", "--bias", "-0.3", "--layers", "2", "-o", "{out}/net.h5"],
    ["convert", "network", "{src}/net", "--bias", "-0.3", "-o", "{out}/net.h5"],
    "net.h5",
)
FULL_DISK_CASES = {
    "convert-network": (*_CONVERT_NETWORK, 1),
    "convert-network-2ranks": (*_CONVERT_NETWORK, 2),
    "convert-inputs": (
        ["convert", "inputs", "{src}/small.tsv", "--neurons", "256", "-o", "{out}/in.h5"],
        ["convert", "inputs", "{src}/in.tsv", "--neurons", "256", "-o", "{out}/in.h5"],
        "in.h5",
        1,
    ),
    "generate-network": (
        ["generate", "network", "--neurons", "512", "--layers", "2", "-o", "{out}/net.h5"],
        ["generate", "network", "--neurons", "512", "--layers", "60", "-o", "{out}/net.h5"],
        "net.h5",
        1,
    ),
    "infer-output-y-2ranks": (
        ["infer", "--network", "{src}/net", "--bias", "-0.3", "--inputs", "{src}/small.tsv",
         "--layers", "1", "--quiet", "--output-y", "{out}/y.h5"],
        ["infer", "--network", "{src}/net", "--bias", "-0.3", "--inputs", "{src}/in.tsv",
         "--layers", "1", "--quiet", "--output-y", "{out}/y.h5"],
        "y.h5",
        2,
    ),
    "generate-network-tsv": (
        ["generate", "network", "--neurons", "512", "--layers", "1", "--tsv-dir", "{out}/tsv"],
        ["generate", "network", "--neurons", "512", "--layers", "3", "--tsv-dir", "{out}/tsv"],
        "tsv",
        1,
    ),
}


@pytest.mark.parametrize("case", sorted(FULL_DISK_CASES))
def test_full_disk_keeps_previous_output(case, small_disk, sources):
    good, bad, name, ranks = FULL_DISK_CASES[case]
    out, fsize = small_disk

    def fill(args):
        return [a.format(src=sources, out=out) for a in args]

    first = _cli(fill(good))
    assert first.returncode == 0, first.stderr
    before = _snapshot(out)
    res = _cli(fill(bad), ranks=ranks, fsize=fsize)
    _assert_one_error_line(res, name, "no space left")
    assert _snapshot(out) == before  # previous output intact, no temporary file left


def test_file_size_limit_fallback(tmp_path, sources):
    """The ``EFBIG`` path (no tmpfs): same promise as a full disk."""
    args = ["convert", "network", f"{sources}/net", "--bias", "-0.3", "-o", tmp_path / "net.h5"]
    assert _cli([*args[:-2], "--layers", "2", *args[-2:]]).returncode == 0
    before = _snapshot(tmp_path)
    _assert_one_error_line(_cli(args, fsize=200_000), "net.h5", "no space left")
    assert _snapshot(tmp_path) == before


def test_output_that_is_a_directory_or_an_input(tmp_path, sources):
    (tmp_path / "d").mkdir()
    res = _cli(
        ["convert", "inputs", sources / "small.tsv", "--neurons", "256", "-o", tmp_path / "d"]
    )
    _assert_one_error_line(res, "is a directory")
    src = tmp_path / "copy.tsv"
    src.write_bytes((sources / "small.tsv").read_bytes())
    res = _cli(["convert", "inputs", src, "--neurons", "256", "-o", src])
    _assert_one_error_line(res, "overwrite the input")
    assert src.read_bytes() == (sources / "small.tsv").read_bytes()


# -- item 6: temporary names ---------------------------------------------------------------


def test_temp_names_unique_and_exclusive(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    with atomic_path(target) as a, atomic_path(target) as b:
        assert a != b and os.path.exists(a) and os.path.exists(b)
        assert str(os.getpid()) in os.path.basename(a)
        Path = type(tmp_path)
        Path(a).write_text("one")
        Path(b).write_text("two")
    assert target.read_text() == "one"  # the writer that finished last won completely
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    # A name another writer holds is never reused or removed: O_EXCL refuses it.
    import mpisdnn.formats._atomic as at

    monkeypatch.setattr(at.secrets, "token_hex", lambda n: "cafe")
    with atomic_path(target) as held:
        with pytest.raises(OutputError) as err:
            with atomic_path(target):
                pass
        assert "out.txt" in str(err.value) and os.path.exists(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_failed_block_leaves_previous_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("good")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("killed")
    assert target.read_text() == "good" and len(list(tmp_path.iterdir())) == 1


# -- item 3: TSV layer directories ---------------------------------------------------------


def _layer_dir(path, names):
    path.mkdir(parents=True, exist_ok=True)
    for name in names:
        (path / name).write_text("1\t1\t0.5\n")
    return path


@pytest.mark.parametrize(
    "names, words",
    [
        (["n4-l1.tsv", "n4-l2.tsv", "n4-l4.tsv"], "n4-l3.tsv: missing layer file"),
        (["n4-l0.tsv", "n4-l1.tsv"], "n4-l0.tsv: bad layer file name"),
        (["n4-l1.tsv", "n4-l01.tsv"], "n4-l01.tsv: bad layer file name"),
        (["n4-l1.tsv", "n8-l2.tsv"], "several sizes"),
    ],
)
def test_layer_directory_gaps_and_duplicates_refused(tmp_path, names, words):
    d = _layer_dir(tmp_path / "net", names)
    with pytest.raises(InputError, match=words):
        read_network_tsv(d, bias=0.0)


def test_huge_layer_count_on_tsv_dir_fails_at_once(tmp_path):
    d = _layer_dir(tmp_path / "net", ["n4-l1.tsv", "n4-l2.tsv"])
    with pytest.raises(InputError, match="asked for 99999999999999999999 layers"):
        read_network_tsv(d, layers=99999999999999999999, bias=0.0)
    assert scan_network_dir(d) == (4, 2)


def test_cli_infer_huge_layers_on_tsv_dir(tmp_path):
    from mpisdnn.generate.radixnet import radixnet

    for k, w in enumerate(radixnet(512, 2, seed=0).layers):
        write_triples(tmp_path / "net" / f"n512-l{k + 1}.tsv", w)
    write_triples(tmp_path / "in.tsv", random_inputs(5, 512, seed=0))
    res = _cli(
        [
            "infer",
            "--network",
            tmp_path / "net",
            "--inputs",
            tmp_path / "in.tsv",
            "--bias",
            "-0.3",
            "--layers",
            "99999999999999999999",
        ],
        timeout=60,
    )
    _assert_one_error_line(res, "missing layer file")


def test_generate_tsv_dir_is_replaced_whole(tmp_path):
    out = tmp_path / "tsv"
    res = _generate_network("--layers", "3", "--tsv-dir", out)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"n512-l{k}.tsv" for k in (1, 2, 3)]
    # a rerun with fewer layers replaces the set as a whole: no stale l3 beside new l1, l2
    res = _generate_network("--layers", "2", "--tsv-dir", out, "--seed", "4")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["n512-l1.tsv", "n512-l2.tsv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tsv"]


def test_interrupted_tsv_dir_writer_leaves_old_set(tmp_path):
    out = _layer_dir(tmp_path / "tsv", ["n4-l1.tsv", "n4-l2.tsv"])
    before = _snapshot(out)
    with pytest.raises(RuntimeError):
        with atomic_dir(out, lambda n: n.endswith(".tsv")) as tmp:
            (type(tmp_path)(tmp) / "n4-l1.tsv").write_text("2\t2\t1\n")
            raise RuntimeError("killed after one layer")
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tsv"]


def test_tsv_dir_with_foreign_files_refused(tmp_path):
    out = _layer_dir(tmp_path / "tsv", ["notes.txt"])
    res = _generate_network("--layers", "1", "--tsv-dir", out)
    _assert_one_error_line(res, "notes.txt")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# -- item 7: sizes from flags ---------------------------------------------------------------


def test_generate_network_huge_layers_fails_before_writing(tmp_path):
    res = _cli(
        [
            "generate",
            "network",
            "--neurons",
            "1024",
            "--layers",
            "99999999999",
            "-o",
            tmp_path / "n.h5",
        ],
        timeout=60,
    )
    _assert_one_error_line(res, "no space left")
    assert list(tmp_path.iterdir()) == []


# -- item 5: crafted HDF5 --------------------------------------------------------------------


def _replace(path, name, data):
    with h5py.File(path, "a") as f:
        del f[name]
        f[name] = data


def test_v1_float_indices_rejected(tmp_path):
    from .conftest import random_network

    p = tmp_path / "n.h5"
    write_network(p, random_network(16, 2, seed=0), version=1)
    with h5py.File(p) as f:
        ind = f["layers/indices"][()]
    _replace(p, "layers/indices", ind.astype(np.float64) + 0.5)
    with pytest.raises(InputError, match="/layers/indices must hold integers"):
        read_network(p)


@pytest.mark.parametrize(
    "name, make, words",
    [
        ("features/indptr", lambda ptr: ptr + 5, "/features/indptr must start at 0"),
        ("features/indptr", lambda ptr: ptr[::-1].copy(), "/features/indptr"),
        ("features/indices", lambda ind: ind.astype(np.float32), "/features/indices"),
        ("truth", lambda t: np.array([1.5, 2.7]), "/truth must hold integers"),
        ("truth", lambda t: np.array([[1, 2], [3, 4]]), "/truth must be 1-D"),
        ("truth", lambda t: np.array([0, 3]), "/truth has row numbers outside"),
    ],
)
def test_crafted_inputs_rejected_naming_dataset(tmp_path, name, make, words):
    p = tmp_path / "i.h5"
    write_inputs(p, random_inputs(10, 16, seed=1), truth=[2, 5])
    with h5py.File(p) as f:
        old = f[name][()]
    _replace(p, name, make(old))
    with pytest.raises(MpisdnnError) as err:
        read_inputs_meta(p)
        read_inputs(p)
    assert words in str(err.value) and "\n" not in str(err.value)


def _dead_pid():
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def test_rerun_removes_what_a_killed_writer_left(tmp_path):
    import socket

    owner = f"{socket.gethostname()}-{_dead_pid()}-dead1"
    (tmp_path / f".net.h5.tmp-{owner}").write_bytes(b"half a file")
    (tmp_path / f".tsv.tmpdir-{owner}").mkdir()
    (tmp_path / f".tsv.tmpdir-{owner}" / "n512-l1.tsv").write_text("1\t1\t1\n")
    res = _generate_network(
        "--layers", "1", "-o", tmp_path / "net.h5", "--tsv-dir", tmp_path / "tsv"
    )
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.h5", "tsv"]


def test_row_ids_beyond_the_memory_bound_fail_before_allocating(tmp_path, monkeypatch):
    """The largest row id of a TSV sets the row count: a stray huge one must be refused in one
    line (no allocation), and must not wrap around in 32-bit indices (sweep D17-D19)."""
    from mpi4py import MPI

    from mpisdnn.cli import main
    from mpisdnn.errors import InputError, UsageError
    from mpisdnn.formats import _validate
    from mpisdnn.formats.tsv import read_images_tsv

    monkeypatch.setattr(_validate, "memory_bound", lambda: 1 << 30)
    src = tmp_path / "in.tsv"
    src.write_text("1\t1\t1\n2147483000\t3\t1\n")  # 32 GiB of row pointers
    with pytest.raises(UsageError, match="2147483000 rows"):
        read_images_tsv(src, 1024)
    src.write_text("1\t1\t1\n4294967297\t3\t1\n")  # 2**32 + 1: row 1 in 32 bits
    # past the rows' 32 bits, as the parallel reader says it (was the memory line)
    with pytest.raises(InputError, match=r"in.tsv:2: row index 4294967297 is beyond the "):
        read_images_tsv(src, 1024)
    out = tmp_path / "in.h5"
    argv = ["convert", "inputs", str(src), "--neurons", "1024", "-o", str(out)]
    assert main(argv, MPI.COMM_SELF) == 2
    assert not out.exists()


def test_memory_bound_checked_before_allocating():
    from mpisdnn.commands.convert import _check_inputs_memory
    from mpisdnn.errors import UsageError
    from mpisdnn.formats._validate import check_memory, memory_bound

    assert memory_bound() > 0
    check_memory(1000, "a small array")
    with pytest.raises(UsageError, match="would need .* more than the"):
        _check_inputs_memory("in.tsv", 10**13, 4)


# --- issue 42 items 1 and 2: never replace what is not a regular file, never write into a
# checkpoint directory ------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def _main_in_process(argv, capsys):
    from mpi4py import MPI

    from mpisdnn.cli import main

    code = main([str(a) for a in argv], MPI.COMM_SELF)
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, [ln for ln in err.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def small_problem(tmp_path_factory):
    from mpisdnn.generate import digit_images, radixnet

    d = tmp_path_factory.mktemp("outputs")
    write_network(d / "n.h5", radixnet(1024, 4, seed=1))
    write_inputs(d / "in.h5", digit_images(60, 1024, seed=2))
    return d


def _null_device(directory):
    """A character device 1,3 (what /dev/null is) inside ``directory``: the real one is
    never touched."""
    path = directory / "dn"
    os.mknod(path, 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 3))
    return path


def _kind(path) -> str:
    import stat

    mode = os.lstat(path).st_mode
    return {stat.S_IFCHR: "char", stat.S_IFIFO: "fifo", stat.S_IFLNK: "link"}.get(
        stat.S_IFMT(mode), "other"
    )


@needs_root
@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "inputs", "--neurons", "1024", "--count", "10", "-o", "{out}"],
        ["generate", "network", "--neurons", "1024", "--layers", "1", "-o", "{out}"],
        ["convert", "inputs", "{d}/in.tsv", "--neurons", "1024", "-o", "{out}"],
        ["infer", "--network", "{d}/n.h5", "--inputs", "{d}/in.h5", "--output-y", "{out}"],
    ],
    ids=["generate-inputs", "generate-network", "convert", "infer-output-y"],
)
def test_hdf5_output_onto_a_device_is_refused_and_the_device_kept(
    small_problem, tmp_path, capsys, argv
):
    """Was: the device renamed over (``mknod dn c 1 3; generate inputs -o dn`` left a
    regular file, exit 0; as root ``-o /dev/null`` replaced the system's /dev/null)."""
    d = small_problem
    (d / "in.tsv").write_text("1\t1\t1\n")
    dn = _null_device(tmp_path)
    code, out, err = _main_in_process([a.format(d=d, out=dn) for a in argv], capsys)
    assert code == 2 and len(err) == 1, (out, err)
    assert "not a regular file (a character device)" in err[0], err
    assert _kind(dn) == "char" and sorted(p.name for p in tmp_path.iterdir()) == ["dn"]


@needs_root
def test_text_outputs_are_written_through_a_device_a_fifo_and_stdout(
    small_problem, tmp_path, capsys
):
    """Text outputs go through what is not a regular file, which stays what it was: the
    categories into a character device, the report into a FIFO (read by another thread),
    the categories into a link to this process's ``/proc/self/fd/1`` (what ``/dev/stdout``
    is)."""
    import json
    import threading

    d = small_problem
    dn = _null_device(tmp_path)
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got = {}

    def read_fifo():
        with open(fifo) as fh:
            got["report"] = fh.read()

    reader = threading.Thread(target=read_fifo, daemon=True)
    reader.start()
    code, out, err = _main_in_process(["infer", "--network", d / "n.h5", "--inputs",
                                       d / "in.h5", "--quiet", "--categories-out", dn,
                                       "--report", fifo], capsys)  # fmt: skip
    reader.join(30)
    assert code == 0, (out, err)
    assert json.loads(got["report"])["schema"].startswith("mpisdnn.report/")
    assert _kind(dn) == "char" and _kind(fifo) == "fifo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dn", "report.fifo"]
    # A name of an open descriptor: written through, the link kept (a subprocess, whose
    # stdout is a pipe this test reads).
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    r = _cli(["infer", "--network", d / "n.h5", "--inputs", d / "in.h5", "--quiet",
              "--categories-out", link], isolated=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    cats = [ln for ln in r.stdout.splitlines() if ln.strip().isdigit()]
    assert cats and _kind(link) == "link"
    r = _cli(["infer", "--network", d / "n.h5", "--inputs", d / "in.h5", "--quiet",
              "--output-y", link], isolated=True)  # fmt: skip
    _assert_one_error_line(r, "not a regular file (an open descriptor)")


@needs_root
def test_library_writers_keep_the_rule(tmp_path):
    """The writers themselves, called from Python: HDF5 refuses a device, text goes
    through a FIFO."""
    import threading

    from mpisdnn.formats import write_categories

    dn = _null_device(tmp_path)
    with pytest.raises(OutputError, match="not a regular file"):
        write_inputs(dn, random_inputs(5, 8, seed=1))
    fifo = tmp_path / "c.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_categories(fifo, np.array([3, 7]))
    reader.join(10)
    assert got == ["3\n7\n"] and _kind(fifo) == "fifo" and _kind(dn) == "char"


@pytest.fixture()
def stopped_run(small_problem, tmp_path, capsys):
    """A checkpoint directory of a run stopped after its first checkpoint."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "STOP").write_text("")
    d = small_problem
    code, _, err = _main_in_process(["infer", "--network", d / "n.h5", "--inputs", d / "in.h5",
                                     "--backend", "reference", "--quiet", "--checkpoint", ck,
                                     "--checkpoint-every", "0"], capsys)  # fmt: skip
    assert code == 75, err
    return ck


def _tree(directory) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize(
    "argv,words",
    [
        (["infer", "--resume", "{ck}", "--report", "{ck}/RUN.json"], "inside the checkpoint"),
        (["infer", "--network", "{d}/n.h5", "--inputs", "{d}/in.h5", "--categories-out",
          "{ck}/ckpt-000001/manifest.json"], "inside the checkpoint"),
        (["infer", "--resume", "{ck}", "--output-y", "{ck}/y.h5"], "inside the checkpoint"),
        (["generate", "inputs", "--neurons", "1024", "--count", "5", "-o", "{ck}/x.h5"],
         "inside the checkpoint"),
        (["convert", "inputs", "{d}/in.tsv", "--neurons", "1024", "-o",
          "{ck}/ckpt-000001/rank-00000.npz"], "inside the checkpoint"),
        (["infer", "--network", "{d}/n.h5", "--inputs", "{d}/in.h5", "--checkpoint",
          "{d}/new-ck", "--report", "{d}/new-ck/r.json"], "inside the checkpoint"),
        (["infer", "--resume", "{ck}", "--report", "{d}/n.h5"], "the same file as --network"),
    ],
    ids=["resume-report-RUN.json", "categories-out-manifest", "resume-output-y",
         "generate-o", "convert-o", "fresh-checkpoint-report", "resume-report-over-network"],
)  # fmt: skip
def test_outputs_into_a_checkpoint_directory_or_its_run_inputs_are_refused(
    small_problem, stopped_run, capsys, argv, words
):
    """Issue 42 item 2: was exit 0 and the checkpoint overwritten (the next ``--resume``
    said every checkpoint is damaged). Refused before any work; the directory unchanged,
    and the resume still runs."""
    d, ck = small_problem, stopped_run
    (d / "in.tsv").write_text("1\t1\t1\n")
    before, net = _tree(ck), (d / "n.h5").read_bytes()
    code, out, err = _main_in_process([a.format(d=d, ck=ck) for a in argv], capsys)
    assert code == 2 and len(err) == 1, (out, err)
    assert words in err[0], err
    assert _tree(ck) == before and (d / "n.h5").read_bytes() == net
    assert not (d / "new-ck").exists()
    code, out, err = _main_in_process(["infer", "--resume", ck, "--quiet"], capsys)
    assert code == 0, (out, err)


def _limited_memory():
    import resource

    limit = 6 << 30  # address space: the fix must refuse far below it
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize(
    "argv",
    [
        ["network", "--neurons", "1073741824", "--layers", "1"],
        ["network", "--neurons", "1073741824", "--layers", "3", "--tsv-dir", "{d}/t"],
        ["inputs", "--neurons", "1073741824", "--count", "10"],
    ],
    ids=["network-2^30-neurons", "network-tsv-dir", "inputs-2^30-neurons"],
)
def test_generators_check_memory_before_allocating(tmp_path, argv):
    """Issue 42 item 7: ``generate network --neurons 1073741824 --layers 1`` grew to 15 GB
    and was OOM-killed without a word. Now one line naming the memory it would need, exit 2,
    before anything is allocated (run under a 6 GiB address-space limit: a generator that
    allocated first would end in a MemoryError instead)."""
    argv = [a.format(d=tmp_path) for a in argv]
    if "--tsv-dir" not in argv:
        argv += ["-o", tmp_path / "x.h5"]
    r = subprocess.run([sys.executable, "-m", "mpisdnn", "generate", *map(str, argv)],
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=_limited_memory)  # fmt: skip
    line = _assert_one_error_line(r, "would need", "GiB of memory, more than the")
    assert "MemoryError" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["32", b"32", np.float64(np.nan)], ids=["text", "bytes", "nan"])
def test_ymax_attribute_must_be_a_number_like_layers(tmp_path, value):
    """Issue 42 item 12: ``ymax="32"`` was parsed and accepted where ``layers="4"`` was
    refused; the message shows the value as written, not ``np.float64(nan)``."""
    from mpisdnn.generate import radixnet

    path = tmp_path / "n.h5"
    write_network(path, radixnet(1024, 2), version=1)
    with h5py.File(path, "r+") as f:
        f.attrs["ymax"] = value
    with pytest.raises(InputError, match="attribute ymax must be a finite number") as got:
        read_network(path)
    assert "np." not in str(got.value) and "b'" not in str(got.value)


def test_an_output_named_for_another_format_is_refused_before_any_work(tmp_path):
    """An HDF5-only output named ``.tsv``/``.tsv.gz``/``.csv`` (``generate inputs -o
    sparse-images-1024.tsv``), or a graph output whose name gives no format (``g.xyz``),
    was written as HDF5 under that name, and a text output named ``.h5`` as text: now one
    line from rank 0 at 2 ranks, nothing written; a plain name is still an HDF5 file."""
    from .conftest import run_cli_batch

    net, inputs = tmp_path / "net.h5", tmp_path / "in.h5"
    write_network(net, random_network(64, 2, seed=3))
    write_inputs(inputs, random_inputs(20, 64, seed=3))
    tsv = tmp_path / "in.tsv"
    write_triples(tsv, random_inputs(20, 64, seed=3))
    bad = [
        (["generate", "network", "--neurons", "64", "--layers", "2", "-o"], "n.tsv", "-o"),
        (["generate", "inputs", "--neurons", "1024", "--count", "5", "-o"], "i.tsv.gz", "-o"),
        (["convert", "inputs", tsv, "--neurons", "64", "-o"], "c.csv", "-o"),
        (["convert", "network", net, "-o"], "v2.tar.gz", "-o"),
        (["infer", "--network", net, "--inputs", inputs, "--quiet", "--output-y"], "y.txt",
         "--output-y"),
        (["generate", "rmat", "--scale", "4", "-o"], "g.xyz", "-o"),
        (["generate", "bipartite", "--rows", "5", "--cols", "4", "--edges", "6", "-o"],
         "g.tsv.gz", "-o"),
        # text outputs named for HDF5 (was: a TSV or a .tar.gz under that name)
        (["infer", "--network", net, "--inputs", inputs, "--quiet", "--categories-out"],
         "c.h5", "--categories-out"),
        (["generate", "inputs", "--neurons", "1024", "--count", "5", "-o", tmp_path / "i.h5",
          "--tsv"], "i.hdf5", "--tsv"),
        (["generate", "network", "--neurons", "64", "--layers", "1", "--archive"], "a.h5",
         "--archive"),
    ]  # fmt: skip
    runs = [[*argv, tmp_path / name] for argv, name, _ in bad]
    runs.append(["generate", "network", "--neurons", "64", "--layers", "2", "-o",
                 tmp_path / "plain"])  # fmt: skip
    results = run_cli_batch(runs, ranks=2)
    for (_, name, flag), r in zip(bad, results):
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(err) == 1, (name, r.stderr)
        assert f"{flag} {tmp_path / name}:" in err[0], err[0]
        assert "name says" in err[0] or "name gives no" in err[0], err[0]
        assert not (tmp_path / name).exists()
    assert results[-1].returncode == 0, results[-1].stderr
    assert h5py.is_hdf5(tmp_path / "plain")
