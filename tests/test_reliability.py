"""Reliability promises of the command line (docs/reliability.md), one test per promise.

Each test asserts the exit code, that the error is one line, that files written before are
intact and that no temporary file is left. Most run the CLI in-process on ``COMM_SELF`` (fast);
the signal tests need a real process (and ``mpiexec``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from mpisdnn.formats import write_inputs, write_network, write_triples
from mpisdnn.generate import digit_images, radixnet

from .conftest import mpiexec

ROOT = Path(__file__).resolve().parents[1]
MTX = "%%MatrixMarket matrix coordinate pattern general\n3 4 4\n1 2\n2 3\n3 4\n1 4\n"


def _main(argv, capsys):
    from mpi4py import MPI

    from mpisdnn.cli import main

    code = main([str(a) for a in argv], MPI.COMM_SELF)
    out, err = capsys.readouterr()
    return code, out, [ln for ln in err.splitlines() if ln.strip()]


def _snapshot(directory: Path) -> dict:
    """Every file under ``directory`` with its bytes (links as their target)."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            files[str(path)] = "-> " + os.readlink(path)
        elif path.is_file():
            files[str(path)] = path.read_bytes()
    return files


@pytest.fixture
def data(tmp_path):
    net = radixnet(1024, 2)
    y = digit_images(12, 1024, seed=3)
    write_network(tmp_path / "net.h5", net)
    write_inputs(tmp_path / "in.h5", y, np.array([1, 2, 3], dtype=np.int64))
    write_triples(tmp_path / "base.tsv", y)
    (tmp_path / "truth.tsv").write_text("1\n2\n")
    (tmp_path / "g.mtx").write_text(MTX)
    (tmp_path / "r.json").write_text("{}\n")
    os.symlink(tmp_path / "g.mtx", tmp_path / "link.mtx")
    os.link(tmp_path / "g.mtx", tmp_path / "hard.mtx")
    return tmp_path


# --- no command overwrites its own input ------------------------------------------------------

SELF_OVERWRITE = {
    "convert_inputs_onto_source": (
        ["convert", "inputs", "{d}/base.tsv", "-o", "{d}/base.tsv", "--neurons", "1024"],
        ("-o", "SOURCE"),
    ),
    "infer_report_onto_inputs": (
        ["infer", "--network", "{d}/net.h5", "--inputs", "{d}/in.h5", "--report", "{d}/in.h5"],
        ("--report", "--inputs"),
    ),
    "infer_report_onto_truth": (
        [
            "infer",
            "--network",
            "{d}/net.h5",
            "--inputs",
            "{d}/in.h5",
            "--truth",
            "{d}/truth.tsv",
            "--report",
            "{d}/truth.tsv",
        ],
        ("--report", "--truth"),
    ),
    "generate_inputs_onto_network": (
        ["generate", "inputs", "--count", "5", "--network", "{d}/net.h5", "-o", "{d}/net.h5"],
        ("-o", "--network"),
    ),
    "project_report_onto_output": (
        ["project", "{d}/g.mtx", "-o", "{d}/out.h5", "--report", "{d}/out.h5"],
        ("-o", "--report"),
    ),
    "report_table_onto_a_report": (
        ["report", "{d}/r.json", "--table", "{d}/r.json"],
        ("--table", "RUN.json #1"),
    ),
    "project_output_onto_symlinked_input": (
        ["project", "{d}/link.mtx", "-o", "{d}/g.mtx"],
        ("-o", "INPUT"),
    ),
    "project_output_onto_hard_linked_input": (
        ["project", "{d}/hard.mtx", "-o", "{d}/g.mtx"],
        ("-o", "INPUT"),
    ),
}


LAYER_OF_INPUT = {
    "infer_report_onto_a_layer": (
        ["infer", "--network", "{d}/net", "--inputs", "{d}/in.h5",
         "--report", "{d}/net/n1024-l1.tsv"],
        ("--report", "--network"),
    ),
    "generate_inputs_tsv_onto_a_layer": (
        ["generate", "inputs", "--count", "5", "--network", "{d}/net",
         "--tsv", "{d}/net/n1024-l2.tsv", "-o", "{d}/x.h5"],
        ("--tsv", "--network"),
    ),
    "convert_network_adds_a_layer": (
        ["convert", "network", "{d}/net", "-o", "{d}/net/n1024-l3.tsv"],
        ("-o", "SOURCE"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LAYER_OF_INPUT))
def test_output_named_like_a_layer_of_an_input_network_dir_is_refused(data, capsys, case):
    """An input network directory is read as all its layer files: an output named like one
    would overwrite a layer (or add one) of the network being read (sweep A8-A10)."""
    for k, w in enumerate(radixnet(1024, 2).layers):
        write_triples(data / "net" / f"n1024-l{k + 1}.tsv", w)
    argv, flags = LAYER_OF_INPUT[case]
    before = _snapshot(data)
    code, out, err = _main([a.format(d=data) for a in argv], capsys)
    assert code == 2
    assert len(err) == 1 and "is a layer file of" in err[0], err
    assert all(f in err[0] for f in flags), err[0]
    assert _snapshot(data) == before and out == ""


def test_other_outputs_inside_an_input_network_dir_are_allowed(tmp_path):
    from mpisdnn.paths import check_distinct, is_layer_of

    (tmp_path / "net").mkdir()
    assert is_layer_of(tmp_path / "net" / "n1024-l7.tsv", tmp_path / "net")
    assert not is_layer_of(tmp_path / "net" / "run.json", tmp_path / "net")
    assert not is_layer_of(tmp_path / "n1024-l1.tsv", tmp_path / "net")
    check_distinct({"--network": tmp_path / "net"}, {"--report": tmp_path / "net" / "run.json"})


@pytest.mark.parametrize("case", sorted(SELF_OVERWRITE))
def test_command_refuses_to_overwrite_its_input(data, capsys, case):
    argv, flags = SELF_OVERWRITE[case]
    before = _snapshot(data)
    code, out, err = _main([a.format(d=data) for a in argv], capsys)
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("mpisdnn: error: ") and all(f in err[0] for f in flags), err[0]
    assert _snapshot(data) == before  # inputs intact, nothing new (no output, no temp file)
    assert out == ""  # refused before any work


def test_distinct_paths_compare_inodes_and_resolved_names(tmp_path):
    from mpisdnn.errors import UsageError
    from mpisdnn.paths import check_distinct, same_file

    (tmp_path / "a").write_text("x")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "sub", tmp_path / "alias")
    assert same_file(tmp_path / "a", tmp_path / "sub" / ".." / "a")
    # an output that does not exist yet, reached through a linked directory
    assert same_file(tmp_path / "alias" / "new.h5", tmp_path / "sub" / "new.h5")
    assert not same_file(tmp_path / "a", tmp_path / "b")
    check_distinct({"--inputs": tmp_path / "a"}, {"-o": tmp_path / "b", "--report": None})
    with pytest.raises(UsageError, match="-o .* and --report .* name the same output"):
        check_distinct({}, {"-o": tmp_path / "b", "--report": tmp_path / "sub/../b"})


# --- outputs are checked before the work starts -----------------------------------------------


def test_report_to_a_directory_fails_before_the_run(data, capsys):
    (data / "reports").mkdir()
    before = _snapshot(data)
    argv = ["infer", "--network", data / "net.h5", "--inputs", data / "in.h5"]
    code, out, err = _main([*argv, "--report", data / "reports"], capsys)
    assert code == 2 and len(err) == 1 and "is a directory" in err[0], err
    assert out == ""  # no summary: the inference never ran
    assert _snapshot(data) == before


def test_file_name_too_long_for_its_temporary_name_fails_at_once(data, capsys):
    """A name that fits alone, but not with the temporary suffix: refused before the run, not
    after it (sweep F10)."""
    before = _snapshot(data)
    argv = ["infer", "--network", data / "net.h5", "--inputs", data / "in.h5"]
    code, out, err = _main([*argv, "--report", data / ("r" * 240 + ".json")], capsys)
    assert code == 2 and len(err) == 1 and "file name too long" in err[0], err
    assert out == "" and _snapshot(data) == before


def test_report_that_cannot_be_written_keeps_the_summary(data, capsys, monkeypatch):
    """The report is written after the summary and the failure is agreed: one line, exit 2,
    and the results printed (sweep E12)."""
    import errno
    from contextlib import contextmanager

    from mpisdnn.reporting import schema

    @contextmanager
    def full_disk(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        yield  # pragma: no cover

    monkeypatch.setattr(schema, "atomic_path", full_disk)
    argv = ["infer", "--network", data / "net.h5", "--inputs", data / "in.h5"]
    code, out, err = _main([*argv, "--report", data / "r.json"], capsys)
    assert code == 2 and len(err) == 1, err
    report = data / "r.json"
    assert err[0] == f"mpisdnn: error: {report}: cannot write the report: No space left on device"
    assert "categories" in out  # the summary came first
    assert (data / "r.json").read_text() == "{}\n"


def test_output_below_a_regular_file_fails_at_once(data, capsys):
    before = _snapshot(data)
    code, out, err = _main(
        [
            "generate",
            "network",
            "--neurons",
            "1024",
            "--layers",
            "2",
            "-o",
            data / "g.mtx" / "n.h5",
        ],
        capsys,
    )
    assert code == 2 and len(err) == 1 and "g.mtx is not a directory" in err[0], err
    assert _snapshot(data) == before


def test_projection_into_an_existing_directory_leaves_nothing(data, capsys):
    (data / "odir").mkdir()
    before = _snapshot(data)
    code, _, err = _main(["project", data / "g.mtx", "-o", data / "odir"], capsys)
    assert code == 2 and len(err) == 1 and "odir: is a directory" in err[0], err
    assert _snapshot(data) == before
    assert sorted(p.name for p in data.iterdir() if p.name.startswith(".")) == []


def test_tsv_dir_that_is_a_file_is_refused(data, capsys):
    code, _, err = _main(
        ["generate", "network", "--neurons", "1024", "--layers", "2", "--tsv-dir", data / "g.mtx"],
        capsys,
    )
    assert code == 2 and len(err) == 1 and "exists and is not a directory" in err[0], err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_output_directory(data, capsys):
    locked = data / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, _, err = _main(
            ["generate", "network", "--neurons", "1024", "--layers", "2", "-o", locked / "n.h5"],
            capsys,
        )
    finally:
        locked.chmod(0o700)
    assert code == 2 and len(err) == 1 and "is not writable" in err[0], err


def test_report_on_a_full_disk_is_one_error_and_keeps_the_old_report(tmp_path):
    """A write that fails mid-way (file size limit: EFBIG, like ENOSPC) keeps the old report."""
    old = tmp_path / "r.json"
    old.write_text('{"old": true}\n')
    script = f"""
import resource, signal
from mpisdnn.errors import MpisdnnError
from mpisdnn.reporting import write_json
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of dying
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    write_json({str(old)!r}, {{"big": list(range(100000))}})
except MpisdnnError as exc:
    print(exc)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env())
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == [f"{old}: cannot write the report: File too large"]
    assert old.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# --- argparse and warnings: the error line comes alone ----------------------------------------


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["project"], "the following arguments are required: input"),
        (["infer", "--network", "x", "--inputs", "y", "--layers", "0"], "--layers"),
        (["frobnicate"], "invalid choice"),
        (["project", "g", "--weight", "cosinus"], "--weight"),
    ],
)
def test_argparse_error_is_one_line_with_help_pointer(capsys, argv, expect):
    code, out, err = _main(argv, capsys)
    assert code == 2 and out == ""
    assert len(err) == 1, err
    assert err[0].startswith("mpisdnn") and ": error: " in err[0] and expect in err[0], err[0]
    assert err[0].endswith("--help')")


def test_nan_cast_warnings_are_silenced_in_the_cli_only():
    from mpisdnn.cli import _quiet_casts

    nan = np.array([np.nan, 1e300])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _quiet_casts():
            nan.astype(np.int64)
            np.array([1e300]).astype(np.float32)  # overflow in cast
            warnings.warn("other runtime warnings still show", RuntimeWarning, stacklevel=1)
        nan.astype(np.int64)  # outside the CLI: numpy's warning as usual
    messages = [str(w.message) for w in seen]
    assert messages[0] == "other runtime warnings still show"
    assert len(messages) == 2 and "invalid value encountered in cast" in messages[1]


# --- SIGINT: exit 130, one line, no traceback, at any moment -----------------------------------


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONWARNINGS", None)
    return env


def _descendants(pid: int) -> list[int]:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _loading_numpy(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return "_multiarray_umath" in fh.read()
    except OSError:
        return False


def _wait_for(predicate, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def _interrupted_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.startswith("mpisdnn")]


pytestmark_linux = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def _start(argv, ranks=1) -> subprocess.Popen:
    """``python -m mpisdnn ARGV`` in the background (under ``mpiexec -n RANKS`` when > 1)."""
    cmd = [sys.executable, "-m", "mpisdnn", *map(str, argv)]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
    )


def _interrupt_exits_130_with_one_line(proc) -> None:
    """Send SIGINT: exit code 130 and the one ``mpisdnn: interrupted`` line."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # a hung job must not keep spinning (an MPI rank busy-waits) through the rest of the run
        for pid in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the job did not end within 60 s of SIGINT")
    assert proc.returncode == 130, err
    assert _interrupted_lines(err) == ["mpisdnn: interrupted"], err


@pytestmark_linux
def test_sigint_while_numpy_loads_exits_130_with_one_line(tmp_path):
    """The issue's case: Ctrl-C in the first fraction of a second, during the imports."""
    argv = ["generate", "network", "--layers", "2", "-o", tmp_path / "n.h5"]
    proc = _start(argv)
    assert _wait_for(lambda: _loading_numpy(proc.pid) or proc.poll() is not None)
    _interrupt_exits_130_with_one_line(proc)
    assert list(tmp_path.iterdir()) == []


@pytestmark_linux
def test_sigint_at_startup_under_mpiexec(tmp_path):
    argv = ["generate", "network", "--layers", "2", "-o", tmp_path / "n.h5"]
    proc = _start(argv, ranks=2)
    # Both ranks past the interpreter's own start-up (a signal inside `site` is Python's, not
    # ours): each is loading numpy, well inside mpisdnn's first ~0.3 s.
    assert _wait_for(
        lambda: (
            sum(_loading_numpy(p) for p in _descendants(proc.pid)) >= 2 or proc.poll() is not None
        )
    )
    _interrupt_exits_130_with_one_line(proc)
    assert list(tmp_path.iterdir()) == []


@pytestmark_linux
@pytest.mark.parametrize("ranks", [1, 2])
def test_sigint_while_writing_keeps_the_previous_output(tmp_path, ranks):
    """Interrupted mid-write: exit 130, one line, old file intact (or the new one complete),
    temporary file removed."""
    out = tmp_path / "n.h5"
    write_network(out, radixnet(1024, 2))
    before = out.read_bytes()
    # 3000 layers: the streaming writer finishes 300 (10 MB) before a forwarded SIGINT lands
    argv = ["generate", "network", "--neurons", "1024", "--layers", "3000", "-o", out]
    proc = _start(argv, ranks)

    def writing():
        return any(p.name.startswith(".n.h5.tmp") for p in tmp_path.iterdir())

    if not _wait_for(lambda: writing() or proc.poll() is not None) or proc.poll() is not None:
        proc.communicate()
        pytest.skip("the write finished before the test saw its temporary file")
    _interrupt_exits_130_with_one_line(proc)
    assert [p.name for p in tmp_path.iterdir()] == ["n.h5"]  # no temporary file left
    if out.read_bytes() != before:
        # On a loaded machine the signal may land after the rename: then the new file must
        # be complete (whole or not at all), never a mix.
        from mpisdnn.formats import read_network

        assert len(read_network(out)) == 3000


# --- leftovers of killed runs -------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture
def leftovers(tmp_path):
    """An output ``out.h5`` with one leftover of every kind next to it."""
    import h5py

    from mpisdnn.leftovers import _tag_host

    host, dead, live = socket.gethostname(), _dead_pid(), os.getpid()
    tag = "".join(c if c.isalnum() or c in "._-" else "_" for c in os.uname().nodename)
    # the projection writers' owner tags (``owner_tag``): @host-pid
    tag_dead = f"@{_tag_host()}-{dead}"
    d = tmp_path
    with h5py.File(d / "out.h5", "w") as f:  # an index that lists one part (and a tagged one)
        f.create_dataset(
            "parts/files",
            data=np.array([b"out.h5.parts/aaaa-r00000.h5", f"out.h5.parts/dddd-r00000{tag_dead}.h5"
                           .encode()]),
        )  # fmt: skip
        f.create_dataset("parts/data_files", data=np.array([b"out.h5.parts/aaaa-r00000.data.h5"]))
    parts = d / "out.h5.parts"
    parts.mkdir()
    files = {
        "dead_owner": d / f".out.h5.tmp-{host}-{dead}-k3y",
        "live_owner": d / f".out.h5.tmp-{host}-{live}-k3y",
        "other_host_old": d / f".out.h5.tmp-elsewhere-{live}-k3y",
        "pid_only_fresh": d / f".out.h5.tmp-{dead}",
        "text_part_old": d / ".out.h5.beef-r00001.part",
        "text_tmp_old": d / ".out.h5.beef.tmp",
        "part_tmp_dead": parts / f".bbbb-r00001.h5.tmp-{host}-{dead}",
        "part_listed_old": parts / "aaaa-r00000.h5",
        "data_part_listed_old": parts / "aaaa-r00000.data.h5",
        "part_unlisted_old": parts / "cccc-r00001.h5",
        "data_part_unlisted_old": parts / "cccc-r00001.data.h5",
        "unrelated": d / ".out.h5.bak.tmp-1",
        # the projection writers tag their files @HOST-PID (mpisdnn.leftovers.owner_tag)
        "tagged_tmp_dead": d / f".out.h5.tmp@{tag}-{dead}",
        "tagged_part_tmp_dead": parts / f".dddd-r00000@{tag}-{dead}.data.h5.tmp@{tag}-{dead}",
        "tagged_part_unlisted_dead": parts / f"dddd-r00001@{tag}-{dead}.h5",
        "tagged_part_unlisted_live": parts / f"eeee-r00000@{tag}-{live}.h5",
        "tagged_text_part_dead": d / f".out.h5.beef-r00000@{tag}-{dead}.part",
        "tagged_text_tmp_dead": d / f".out.h5.beef@{tag}-{dead}.tmp",
        "tagged_text_part_live": d / f".out.h5.feed-r00001@{tag}-{live}.part",
        # a --tsv-dir set being written (a directory)
        "tsv_tmpdir_dead": d / f".out.h5.tmpdir-{host}-{dead}-k3y",
        "tagged_data_part_unlisted_dead": parts / f"dddd-r00001@{tag}-{dead}.data.h5",
        # a part the index lists stays, whoever wrote it
        "tagged_part_listed_dead": parts / f"dddd-r00000{tag_dead}.h5",
    }
    for name, path in files.items():
        if name.startswith("tsv_tmpdir"):
            path.mkdir()
            path = path / "n1024-l1.tsv"
        path.write_bytes(b"x" * 10)
        if name.endswith("_old"):
            _age(path, 7200)
    stale = {"dead_owner", "other_host_old", "text_part_old", "text_tmp_old", "part_tmp_dead"}
    stale |= {"tagged_tmp_dead", "tagged_part_tmp_dead", "tagged_part_unlisted_dead"}
    stale |= {"tagged_text_part_dead", "tagged_text_tmp_dead", "tagged_data_part_unlisted_dead"}
    return d, files, stale | {"part_unlisted_old", "data_part_unlisted_old", "tsv_tmpdir_dead"}


def test_leftovers_judged_by_owner_and_age(leftovers):
    from mpisdnn.leftovers import find_leftovers

    d, files, stale = leftovers
    found = {item.path: item for item in find_leftovers(d / "out.h5", min_age=3600)}
    by_name = {name: found.get(str(path)) for name, path in files.items()}
    assert by_name["unrelated"] is None and by_name["part_listed_old"] is None
    assert by_name["data_part_listed_old"] is None and by_name["tagged_part_listed_dead"] is None
    judged = {name for name, item in by_name.items() if item is not None and item.stale}
    assert judged == stale
    assert "is running" in by_name["live_owner"].reason
    assert "is running" in by_name["tagged_part_unlisted_live"].reason
    assert "is running" in by_name["tagged_text_part_live"].reason
    assert by_name["tsv_tmpdir_dead"].size == 10  # a directory counts what it holds
    assert not by_name["pid_only_fresh"].stale  # a PID alone proves nothing on shared storage


def test_clean_lists_then_removes_only_stale_files(leftovers, capsys):
    d, files, stale = leftovers
    before = _snapshot(d)
    code, out, err = _main(["clean", d / "out.h5"], capsys)
    assert code == 0 and err == []
    assert _snapshot(d) == before  # listing removes nothing
    assert f"{len(stale)} stale file(s)" in out and "--yes" in out
    code, out, err = _main(["clean", d / "out.h5", "--yes"], capsys)
    assert code == 0 and err == []
    for name, path in files.items():
        assert path.exists() == (name not in stale), name
    assert f"removed {len(stale)} file(s)" in out


def test_clean_of_a_directory_finds_the_leftovers_in_it(tmp_path, capsys):
    """Issue 40 (small traps): ``mpisdnn clean DIR`` looked only beside DIR (``.DIR.tmp-*``)
    and missed a stale ``DIR/.X.tmp-*`` of any output written into it."""
    host = socket.gethostname()
    dead, live = _dead_pid(), os.getpid()
    d = tmp_path / "results"
    d.mkdir()
    stale = [d / f".x.h5.tmp-{host}-{dead}-k3y", d / f".y.tsv.tmp@{host}-{dead}",
             d / f".ckpt-000002.tmpdir-{host}-{dead}-a1b2"]  # fmt: skip
    kept = [d / f".z.h5.tmp-{host}-{live}-k3y", d / "x.h5", d / ".hidden"]
    for path in stale + kept:
        if "tmpdir" in path.name:
            path.mkdir()
            (path / "rank-00000.npz").write_bytes(b"x")
        else:
            path.write_bytes(b"partial")
    code, out, err = _main(["clean", d], capsys)
    assert code == 0 and err == []
    assert "3 stale file(s)" in out and "in use: process" in out, out
    code, out, err = _main(["clean", d, "--yes"], capsys)
    assert code == 0 and "removed 3 file(s)" in out, out
    assert [p.exists() for p in stale] == [False] * 3 and all(p.exists() for p in kept)


def test_rerun_removes_what_a_dead_run_left(data, capsys):
    host = socket.gethostname()
    dead = data / f".n.h5.tmp-{host}-{_dead_pid()}-k3y"
    live = data / f".n.h5.tmp-{host}-{os.getpid()}-k3y"
    for path in (dead, live):
        path.write_bytes(b"partial")
    code, _, err = _main(["generate", "network", "--layers", "2", "-o", data / "n.h5"], capsys)
    assert code == 0, err
    assert not dead.exists() and live.exists()
    assert (data / "n.h5").stat().st_size > 0


# --- Slurm helpers: numbers validated, launcher flags not globbed and recorded ------------------

SLURM_COMMON = ROOT / "slurm" / "_common.sh"


def _bash(script: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    prelude = (
        f"JOB_KIND=test; OUT={tmp_path}; MEMORY_PER_RANK=; THREADS=2; RANKS=4; "
        f"LAUNCHER=mpiexec; source {SLURM_COMMON}\n"
    )
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MPISDNN_"))}
    full_env.update(env)
    return subprocess.run(
        ["bash", "-c", prelude + script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=full_env,
        timeout=30,
    )


@pytest.mark.parametrize("var", ["SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_JOB_NUM_NODES"])
def test_slurm_memory_values_cannot_run_commands(tmp_path, var):
    env = {"SLURM_MEM_PER_NODE": "8000", var: "X[$(touch pwned)]"}
    r = _bash("memory_per_rank", tmp_path, **env)
    assert r.returncode == 2 and f"{var} must be a number" in r.stderr, r.stderr
    assert not (tmp_path / "pwned").exists()


def test_slurm_zero_nodes_is_an_error_not_a_division_by_zero(tmp_path):
    r = _bash("memory_per_rank", tmp_path, SLURM_MEM_PER_NODE="8000", SLURM_JOB_NUM_NODES="0")
    assert r.returncode == 2 and "SLURM_JOB_NUM_NODES must be >= 1" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_slurm_memory_per_rank_arithmetic(tmp_path):
    assert _bash("memory_per_rank", tmp_path, SLURM_MEM_PER_CPU="1000").stdout == "1600M\n"
    r = _bash("memory_per_rank", tmp_path, SLURM_MEM_PER_NODE="08000", SLURM_JOB_NUM_NODES="2")
    assert r.stdout == "3200M\n"  # a leading zero is decimal, not octal


def test_slurm_launcher_args_not_globbed_and_recorded(tmp_path):
    (tmp_path / "aaa").write_text("")
    script = (
        ': >"$OUT/commands.sh"\n'
        'mpiexec() { printf "<%s>" "$@"; echo; }\n'
        "run_logged 2 echo hi\n"
        "unset MPISDNN_LAUNCHER_ARGS\n"
        'source "$OUT/commands.sh"\n'  # the record repeats the run exactly
    )
    r = _bash(script, tmp_path, MPISDNN_LAUNCHER_ARGS="--bind-to core *")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["<-n><2><--bind-to><core><*><echo><hi>"] * 2
    recorded = (tmp_path / "commands.sh").read_text()
    assert "launch 2 echo hi" in recorded and "--bind-to\\ core\\ \\*" in recorded


def test_interrupt_swallowed_inside_the_command_is_raised_when_it_ends():
    """A Ctrl-C that library code swallowed (a GC callback, a broad ``except``) still ends the
    command as an interrupt, through the same handler as any other (one line for the job)."""
    from mpisdnn import _signals

    previous = signal.getsignal(signal.SIGINT)
    _signals.install_exit_now()
    try:
        with pytest.raises(KeyboardInterrupt):
            with _signals.interruptible():
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(1)  # the handler raises here
                except KeyboardInterrupt:
                    pass  # swallowed, as a library might
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # outputs are written
        with _signals.interruptible():  # a fresh command starts uninterrupted
            pass
    finally:
        signal.signal(signal.SIGINT, previous)


SWALLOWED_IN_CALLBACK = textwrap.dedent(
    """
    import os, signal, sys, time, weakref
    sys.path.insert(0, {root!r})
    from mpisdnn import _signals

    class Obj:
        pass

    def callback(ref):  # the handler raises in here: Python can only print and drop it
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass

    _signals.install_exit_now()
    sent, refs, done = [], [], 0
    t0 = time.monotonic()
    try:
        with _signals.interruptible():
            while time.monotonic() - t0 < 10:  # the command goes on after the callback
                obj = Obj()
                refs.append(weakref.ref(obj, callback))
                del obj
                done += 1
                time.sleep(0.001)
    except KeyboardInterrupt:
        print(f"interrupted after {{time.monotonic() - t0:.2f}} s, sent {{len(sent)}}")
    """
)


def test_interrupt_swallowed_by_a_callback_ends_the_command_at_once(tmp_path):
    """A Ctrl-C that lands in a weakref callback (h5py's, during a long write) is raised again
    within moments, not when the command ends: another rank still starting up would otherwise
    end the job (it waits ``RANK0_WORD_SECONDS`` for rank 0's word) while rank 0 has not
    spoken yet."""
    script = tmp_path / "swallow.py"
    script.write_text(SWALLOWED_IN_CALLBACK.format(root=str(ROOT)))
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    took = float(r.stdout.split()[2])
    assert r.stdout.startswith("interrupted after") and r.stdout.split()[-1] == "1", r.stdout
    assert took < 2.0, r.stdout


def test_temporary_output_is_removed_when_ctrl_c_lands_in_the_clean_up(tmp_path, monkeypatch):
    """The clean-up of a failed output finishes even if the interrupt lands inside it; the
    interrupt is raised afterwards."""
    from mpisdnn.formats import _atomic

    calls = {"n": 0}
    real_lexists = os.path.lexists

    def lexists_interrupted_once(path):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real_lexists(path)

    out = tmp_path / "o.bin"
    with pytest.raises(KeyboardInterrupt):
        with _atomic.atomic_path(out) as tmp:
            Path(tmp).write_bytes(b"partial")
            monkeypatch.setattr(_atomic.os.path, "lexists", lexists_interrupted_once)
            raise ValueError("the write failed")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def _rank_pid(launcher_pid: int, rank: int) -> int | None:
    for pid in _descendants(launcher_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return pid
    return None


@pytestmark_linux
def test_sigint_to_one_rank_while_rank_0_waits_for_it_is_one_line(tmp_path):
    """Only rank 1 is interrupted; rank 0 then waits for it in the next collective and cannot
    speak. Rank 1 gets no word from rank 0, prints the line itself and ends the job."""
    from mpisdnn.parallel import RANK0_WORD_SECONDS

    net, y0 = tmp_path / "n.h5", tmp_path / "in.h5"
    write_network(net, radixnet(1024, 120, seed=1))
    write_inputs(y0, digit_images(6000, 1024, seed=2))
    ck = tmp_path / "ck"
    argv = ["infer", "--network", net, "--inputs", y0, "--backend", "reference"]
    proc = _start([*argv, "--checkpoint", ck, "--checkpoint-every", "0.000001"], ranks=2)
    started = _wait_for(lambda: any(ck.glob("ckpt-*")) or proc.poll() is not None)
    rank1 = _rank_pid(proc.pid, 1)
    if not started or proc.poll() is not None or rank1 is None:
        proc.communicate()
        pytest.skip("the run ended before the test could interrupt rank 1")
    t0 = time.monotonic()
    os.kill(rank1, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert _interrupted_lines(err) == ["mpisdnn: interrupted"], err
    assert time.monotonic() - t0 >= RANK0_WORD_SECONDS - 0.5  # it did wait for rank 0's word


@pytest.mark.parametrize("which", ["file", "dir"])
def test_ctrl_c_just_after_the_temporary_output_appears_removes_it(tmp_path, monkeypatch, which):
    """The window a watcher hits: the temporary file (or directory) exists, the block has not
    started yet. An interrupt there still removes it."""
    from mpisdnn.formats import _atomic

    real = {"file": _atomic.os.close, "dir": _atomic.os.mkdir}[which]

    def then_interrupted(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(_atomic.os, {"file": "close", "dir": "mkdir"}[which], then_interrupted)
    writer = _atomic.atomic_path if which == "file" else _atomic.atomic_dir
    with pytest.raises(KeyboardInterrupt):
        with writer(tmp_path / "out"):
            pass
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
